// The engine tier's Qwen3.5 bridge driver: ggk 0.9.7's own code on an exported qwen35_bridge GGUF.
//   qwen35_probe ADAPTER.gguf            then one command per stdin line:
//   moss HEX           the slot ids of the MOSS template around the prompt (HEX = UTF-8 bytes,
//                      "-" = ""): Qwen35BridgeEmbedder's template lines (conditioner.hpp 4287,
//                      4352-4356, cut into moss_template.inc) and Qwen35Tokenizer, built from
//                      the file's vocabulary as gk-diffuser.cpp 1256-1268 builds it
//   tok HEX            Qwen35Tokenizer::encode of the text alone
//   run H.bin L IDS.txt OUT.bin BANK [BH.bin]
//                      Qwen35BridgeRunner::compute on L student rows (f32, in_dim each) and the
//                      seed ids (one a line); BANK 1 = want_bank (FLUX.3), BH.bin the bank_hidden
//                      rows (n_bank x in_dim). Prints the number of floats written.
// The file's tensors are copied into the runner's parameters (f16 -> f32 where the runner chose
// f32, as the loader converts); detection, graph and math are the engine's.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "gguf.h"
#include "model/te/llm_adapter.hpp"
#include "tokenizers/qwen35_tokenizer.h"

#include "slot_probe.h"  // ResidentWeights, File, copy_params, the protocol's helpers

#include "read_gguf_tokenizer.inc"  // gguf_io.cpp read_gguf_tokenizer, cut verbatim

static const std::string PREFIX = "text_encoders.llm_adapter.adapter";

struct ProbeRunner : public LLMAdapter::Qwen35BridgeRunner {
    using LLMAdapter::Qwen35BridgeRunner::Qwen35BridgeRunner;
    ggml_context* params() { return params_ctx; }
};

static std::vector<int> moss_ids(Qwen35Tokenizer* qwen35_tokenizer, const std::string& text) {
#include "moss_template.inc"
    return slot_tokens;
}

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: qwen35_probe ADAPTER.gguf < commands\n");
        return 2;
    }
    sd_set_log_callback([](sd_log_level_t level, const char* text, void*) {
        if (level >= SD_LOG_WARN) {
            fputs(text, stderr);  // the engine's warnings and errors, for the test's message
        }
    }, nullptr);
    std::vector<std::string> tokens, merges;
    std::string pre;
    if (!read_gguf_tokenizer(argv[1], tokens, merges, &pre) || merges.empty() || pre != "qwen35") {
        fprintf(stderr, "no qwen35 tokenizer in %s (pre '%s')\n", argv[1], pre.c_str());
        return 1;
    }
    Qwen35Tokenizer tokenizer(Qwen35Tokenizer::vocab_json_from_tokens(tokens), Qwen35Tokenizer::merges_from_list(merges));

    File file;
    if (!open_file(argv[1], "text_encoders.llm_adapter.", file)) {
        return 1;
    }
    if (!LLMAdapter::Qwen35BridgeConfig::present(file.storage, PREFIX)) {
        fprintf(stderr, "%s is not a qwen3.5 bridge adapter\n", argv[1]);
        return 1;
    }
    ggml_backend_t backend = ggml_backend_cpu_init();
    auto manager = std::make_shared<ResidentWeights>();  // the runner holds it weakly
    ProbeRunner runner(backend, file.storage, PREFIX, manager);
    if (ggml_backend_alloc_ctx_tensors(runner.params(), backend) == nullptr) {
        fprintf(stderr, "cannot allocate the adapter's parameters\n");
        return 1;
    }
    std::map<std::string, ggml_tensor*> params;
    runner.get_param_tensors(params, PREFIX);
    if (!copy_params(params, file)) {
        return 1;
    }
    printf("ready in_dim %lld width %lld depth %lld max_slots %lld n_bank %lld bank_dim %lld bank_align %d vocab %zu\n",
           (long long)runner.config.in_dim, (long long)runner.config.width, (long long)runner.config.depth,
           (long long)runner.config.max_slots, (long long)runner.config.n_bank, (long long)runner.config.bank_dim,
           runner.config.bank_align ? 1 : 0, tokens.size());
    fflush(stdout);
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string cmd;
        in >> cmd;
        if (cmd == "moss" || cmd == "tok") {
            std::string h;
            in >> h;
            std::string text = unhex(h);
            print_ids(cmd == "moss" ? moss_ids(&tokenizer, text) : tokenizer.encode(text, nullptr));
        } else if (cmd == "run") {
            std::string hpath, ids_path, out_path, bh_path;
            long long L;
            int bank;
            in >> hpath >> L >> ids_path >> out_path >> bank >> bh_path;
            const int64_t in_dim = runner.config.in_dim;
            sd::Tensor<float> hidden({in_dim, L, 1}, read_floats(hpath, static_cast<size_t>(L * in_dim)));
            std::vector<int32_t> ids = read_ids(ids_path);
            sd::Tensor<int32_t> seed_ids({static_cast<int64_t>(ids.size())}, ids);
            sd::Tensor<float> bank_hidden;
            if (!bh_path.empty()) {
                const int64_t nb = runner.config.n_bank;
                bank_hidden = sd::Tensor<float>({in_dim, nb}, read_floats(bh_path, static_cast<size_t>(nb * in_dim)));
            }
            write_floats(out_path, runner.compute(1, hidden, seed_ids, {}, {}, bank != 0, bank_hidden));
        } else {
            printf("error unknown command %s\n", cmd.c_str());
            fflush(stdout);
        }
    }
    return 0;
}
