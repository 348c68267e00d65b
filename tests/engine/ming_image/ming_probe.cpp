// The engine tier's Ming-Image driver: ggk 0.9.7's own code on the project's files.
//   ming_probe TE.gguf|- ADAPTER.gguf|-      then one command per stdin line:
//   te IDS.txt OUT.bin [V.bin START GH GW]
//                        MingImageTE::MingImageTextRunner::compute on the Ling prompt ids (one a
//                        line): the full text encoder path ggk runs for Ming-Image (thinker with the
//                        256 query tokens spliced after <image>, connector, proj_out, directvlm),
//                        output [diffusion_dim, 256 + P] as f32. TE.gguf holds the text encoder
//                        under the names the engine reads after "text_encoders.llm." (thinker.*,
//                        connector.*, query_tokens, proj_in/out, proj_directvlm.*). With V.bin:
//                        GH x GW input-image rows (f32, hidden each) over the <imagePatch> run
//                        from START, as an edit's reference (ImageBlock).
//   ling HEX             MingImageTE::build_prompt_tokens(text) with LingTokenizer, the slot ids of
//                        MingImageAdapterEmbedder (conditioner.hpp 4079-4080), text only
//   tok HEX              LingTokenizer::encode of the text alone
//   run H.bin L IDS.txt OUT.bin [V.bin NV START]
//                        LLMAdapter::MingAdapterRunner::compute on L student rows (f32, in_dim
//                        each) and the seed ids; with V.bin, NV vision rows (vis_dim each) laid
//                        under the slots from START as the conditioner lays them (4127-4131).
// The Ling vocabulary comes from the adapter's `tokenizer_json` tensor exactly as gk-diffuser.cpp
// 1285-1310 and 1348-1357 read it (one f16 per byte -> hf_tokenizer_json_extract_* -> the
// VocabProvider's ling.vocab / ling.merges). Each file's tensors are copied into the runner's
// parameters (f16 -> f32 where the runner chose f32, as the loader converts); detection, graph
// and math are the engine's.
#include <cmath>
#include <cstdio>
#include <cstring>
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
#include "gk-diffuser.h"
#include "model/te/ming_image_te.hpp"
#include "tokenizers/hf_tokenizer_json.h"
#include "tokenizers/ling_tokenizer.h"
#include "tokenizers/vocab_provider.h"

#include "slot_probe.h"  // ResidentWeights, File, copy_params, the protocol's helpers

static const std::string TE_PREFIX      = "text_encoders.llm";
static const std::string ADAPTER_PREFIX = "text_encoders.llm_adapter.adapter";

struct TextRunner : public MingImageTE::MingImageTextRunner {
    using MingImageTE::MingImageTextRunner::MingImageTextRunner;
    ggml_context* params() { return params_ctx; }
};

struct AdapterRunner : public LLMAdapter::MingAdapterRunner {
    using LLMAdapter::MingAdapterRunner::MingAdapterRunner;
    ggml_context* params() { return params_ctx; }
};

// gk-diffuser.cpp read_embedded_json: F16 / F32 one element per byte, else the raw bytes
static std::string embedded_json(const ggml_tensor* t) {
    std::string json;
    const int64_t n = ggml_nelements(t);
    if (t->type == GGML_TYPE_F16) {
        const ggml_fp16_t* src = static_cast<const ggml_fp16_t*>(t->data);
        for (int64_t i = 0; i < n; ++i) {
            json.push_back(static_cast<char>(static_cast<unsigned char>(std::lround(ggml_fp16_to_fp32(src[i])))));
        }
    } else if (t->type == GGML_TYPE_F32) {
        const float* src = static_cast<const float*>(t->data);
        for (int64_t i = 0; i < n; ++i) {
            json.push_back(static_cast<char>(static_cast<unsigned char>(std::lround(src[i]))));
        }
    } else {
        json.assign(static_cast<const char*>(t->data), ggml_nbytes(t));
    }
    while (!json.empty() && json.back() == '\0') {
        json.pop_back();
    }
    return json;
}

// the engine's log lines to stderr when MING_PROBE_LOG is set (warnings and errors always)
static void log_to_stderr(enum sd_log_level_t level, const char* text, void*) {
    if (level >= SD_LOG_WARN || getenv("MING_PROBE_LOG") != nullptr) {
        fputs(text, stderr);
    }
}

int main(int argc, char** argv) {
    sd_set_log_callback(log_to_stderr, nullptr);
    if (argc != 3) {
        fprintf(stderr, "usage: ming_probe TE.gguf|- ADAPTER.gguf|- < commands\n");
        return 2;
    }
    ggml_backend_t backend = ggml_backend_cpu_init();
    // the runners hold their weight manager weakly (ggml_extend.hpp 1889): keep it alive here
    auto weights = std::make_shared<ResidentWeights>();
    std::unique_ptr<TextRunner> te;
    std::unique_ptr<AdapterRunner> adapter;
    std::unique_ptr<LingTokenizer> ling;
    File te_file, adapter_file;
    std::ostringstream ready;
    ready << "ready";
    if (std::string(argv[1]) != "-") {
        if (!open_file(argv[1], TE_PREFIX + ".", te_file)) {
            return 1;
        }
        te = std::make_unique<TextRunner>(backend, te_file.storage, TE_PREFIX, weights);
        if (ggml_backend_alloc_ctx_tensors(te->params(), backend) == nullptr) {
            fprintf(stderr, "cannot allocate the text encoder's parameters\n");
            return 1;
        }
        std::map<std::string, ggml_tensor*> params;
        te->get_param_tensors(params, TE_PREFIX);
        if (!copy_params(params, te_file)) {
            return 1;
        }
        const auto& b = te->config.backbone;
        ready << " te layers " << b.num_layers << " dense " << b.first_k_dense_replace << " hidden " << b.hidden_size
              << " heads " << b.num_heads << "/" << b.num_kv_heads << " head_dim " << b.head_dim << " experts "
              << b.num_experts << "x" << b.moe_intermediate_size << " shared " << b.num_shared_experts
              << " connector " << te->config.connector.num_layers << "x" << te->config.connector.hidden_size
              << " queries " << te->config.num_queries << " caption " << te->config.caption_dim << " direct "
              << te->config.diffusion_dim << " params " << params.size();
    }
    if (std::string(argv[2]) != "-") {
        const std::string file_prefix = "text_encoders.llm_adapter.";
        if (!open_file(argv[2], file_prefix, adapter_file)) {
            return 1;
        }
        if (!LLMAdapter::MingAdapterConfig::present(adapter_file.storage, ADAPTER_PREFIX)) {
            fprintf(stderr, "%s is not a Ming-Image adapter\n", argv[2]);
            return 1;
        }
        adapter = std::make_unique<AdapterRunner>(backend, adapter_file.storage, ADAPTER_PREFIX, weights);
        if (ggml_backend_alloc_ctx_tensors(adapter->params(), backend) == nullptr) {
            fprintf(stderr, "cannot allocate the adapter's parameters\n");
            return 1;
        }
        std::map<std::string, ggml_tensor*> params;
        adapter->get_param_tensors(params, ADAPTER_PREFIX);
        if (!copy_params(params, adapter_file)) {
            return 1;
        }
        auto json = adapter_file.tensors.find(file_prefix + "tokenizer_json");
        if (json != adapter_file.tensors.end()) {
            std::string text = embedded_json(json->second);
            std::string merges, vocab_json;
            if (hf_tokenizer_json_extract_merges(text, merges)) {
                VocabProvider::instance().set_override("ling.merges", std::move(merges));
            }
            if (hf_tokenizer_json_extract_vocab(text, vocab_json)) {
                VocabProvider::instance().set_override("ling.vocab", std::move(vocab_json));
            }
            ling = std::make_unique<LingTokenizer>();
        }
        const auto& c = adapter->config;
        ready << " adapter in " << c.in_dim << " width " << c.width << " depth " << c.depth << " n_cap " << c.n_cap
              << " cap_dim " << c.cap_dim << " out " << c.out_dim << " max_slots " << c.max_slots << " seed "
              << c.seed_vocab << "x" << c.seed_rank << " vis " << c.vis_dim << " ling " << (ling ? 1 : 0);
    }
    printf("%s\n", ready.str().c_str());
    fflush(stdout);

    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string cmd;
        in >> cmd;
        if ((cmd == "ling" || cmd == "tok") && ling) {
            std::string h;
            in >> h;
            std::string text = unhex(h);
            print_ids(cmd == "ling" ? MingImageTE::build_prompt_tokens(*ling, text, 0, 0, 0, nullptr) : ling->encode(text, nullptr));
        } else if (cmd == "te" && te) {
            std::string ids_path, out_path, vpath;
            long long start = -1, gh = 0, gw = 0;
            in >> ids_path >> out_path >> vpath >> start >> gh >> gw;
            std::vector<int32_t> ids = read_ids(ids_path);
            std::vector<int> tokens(ids.begin(), ids.end());
            if (vpath.empty()) {
                write_floats(out_path, te->compute(1, tokens));
            } else {  // an input image's rows over its <imagePatch> run (an edit's reference)
                const int64_t hidden = te->config.backbone.hidden_size;
                sd::Tensor<float> rows({hidden, gh * gw}, read_floats(vpath, static_cast<size_t>(hidden * gh * gw)));
                write_floats(out_path, te->compute(1, tokens, rows, MingImageTE::ImageBlock{start, gh, gw}));
            }
        } else if (cmd == "run" && adapter) {
            std::string hpath, ids_path, out_path, vpath;
            long long L, nv = 0, start = 0;
            in >> hpath >> L >> ids_path >> out_path >> vpath >> nv >> start;
            const auto& c = adapter->config;
            sd::Tensor<float> hidden({c.in_dim, L, 1}, read_floats(hpath, static_cast<size_t>(L * c.in_dim)));
            std::vector<int32_t> ids = read_ids(ids_path);
            const int64_t P          = static_cast<int64_t>(ids.size());
            sd::Tensor<int32_t> seed_ids({P}, ids);
            sd::Tensor<float> vis, vis_slot;
            if (!vpath.empty()) {
                vis      = sd::Tensor<float>({c.vis_dim, nv}, read_floats(vpath, static_cast<size_t>(nv * c.vis_dim)));
                vis_slot = sd::Tensor<float>::zeros({c.vis_dim, P});
                memcpy(vis_slot.data() + start * c.vis_dim, vis.data(), static_cast<size_t>(nv * c.vis_dim) * sizeof(float));
            }
            write_floats(out_path, adapter->compute(1, hidden, seed_ids, vis, vis_slot));
        } else {
            printf("error unknown command %s\n", cmd.c_str());
            fflush(stdout);
        }
    }
    return 0;
}
