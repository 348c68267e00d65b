// The engine tier's Qwen3.5 bridge driver for reference images: ggk 0.9.7's own code on an
// exported qwen35_bridge GGUF and given vision rows.
//   qwen35_vision_probe ADAPTER.gguf      then one command per stdin line:
//   refs HEX H.bin L OUT.bin IDS.txt N n_1 V_1.bin ... n_N V_N.bin
//       HEX the prompt's UTF-8 bytes ("-" = ""), H.bin L student rows (f32, in_dim each),
//       V_i.bin reference i's n_i vision rows (f32, vis_dim each: what the Qwen3.5 tower gives).
//       Runs the lines of Qwen35BridgeEmbedder::get_learned_condition that build the MOSS
//       template around the references and lay them into vis / vis_slot (cut verbatim into
//       refs_*.inc: conditioner.hpp 4287-4289, 4336-4349, 4352-4357, 4400-4418), then
//       Qwen35BridgeRunner::compute as 4450 calls it (MOSS: no bank). Writes the rows to OUT.bin
//       and the slot ids then each image's (first slot, count) to IDS.txt; prints the floats.
// The file's tensors are copied into the runner's parameters (f16 -> f32 where the runner chose
// f32, as the loader converts); detection, template, layout, graph and math are the engine's.
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
#include "model/te/llm_adapter.hpp"
#include "tokenizers/qwen35_tokenizer.h"

#include "read_gguf_tokenizer.inc"  // gguf_io.cpp read_gguf_tokenizer, cut verbatim

static const std::string PREFIX = "text_encoders.llm_adapter.adapter";

struct ResidentWeights : public RunnerWeightManager {
    bool assign_compute_backend(const std::vector<ggml_tensor*>&, ggml_backend_t) override { return true; }
    bool prepare_params(const std::vector<ggml_tensor*>&) override { return true; }
    void release_compute_backend_params(const std::vector<ggml_tensor*>&) override {}
    void release_params_backend_params(const std::vector<ggml_tensor*>&) override {}
};

struct ProbeRunner : public LLMAdapter::Qwen35BridgeRunner {
    using LLMAdapter::Qwen35BridgeRunner::Qwen35BridgeRunner;
    ggml_context* params() { return params_ctx; }
};

static std::string unhex(const std::string& h) {
    std::string out;
    if (h == "-") {
        return out;
    }
    for (size_t i = 0; i + 1 < h.size(); i += 2) {
        out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
    }
    return out;
}

static std::vector<float> read_floats(const std::string& path, size_t n) {
    std::vector<float> v(n);
    std::ifstream f(path, std::ios::binary);
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
    return v;
}

// get_learned_condition's reference path, the tower's output given: `refs` stands for the
// encode_image results, in order.
static sd::Tensor<float> condition(ProbeRunner* adapter, Qwen35Tokenizer* qwen35_tokenizer, const std::string& text,
                                   std::vector<sd::Tensor<float>> refs, const sd::Tensor<float>& qwen_hidden,
                                   std::vector<int>& ids_out, std::vector<std::pair<int, int>>& slots_out) {
#include "refs_head.inc"
    for (size_t i = 0; i < refs.size(); ++i) {
        auto image_embed    = std::move(refs[i]);
        const int64_t width = 0, height = 0, w_bar = 0, h_bar = 0;  // the debug line's only
#include "refs_image.inc"
    }
#include "refs_template.inc"
    if (P > adapter->config.max_slots) {
        fprintf(stderr, "%lld slots exceed max_slots\n", static_cast<long long>(P));
        return {};
    }
#include "refs_layout.inc"
    ids_out   = slot_tokens;
    slots_out = image_slots;
    return adapter->compute(1, qwen_hidden, seed_ids, vis, vis_slot, false, {});
}

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: qwen35_vision_probe ADAPTER.gguf < commands\n");
        return 2;
    }
    sd_set_log_callback([](sd_log_level_t level, const char* text, void*) {
        if (level >= SD_LOG_WARN) {
            fputs(text, stderr);
        }
    }, nullptr);
    std::vector<std::string> tokens, merges;
    std::string pre;
    if (!read_gguf_tokenizer(argv[1], tokens, merges, &pre) || merges.empty() || pre != "qwen35") {
        fprintf(stderr, "no qwen35 tokenizer in %s (pre '%s')\n", argv[1], pre.c_str());
        return 1;
    }
    Qwen35Tokenizer tokenizer(Qwen35Tokenizer::vocab_json_from_tokens(tokens), Qwen35Tokenizer::merges_from_list(merges));

    ggml_context* data_ctx = nullptr;
    gguf_init_params gp    = {false, &data_ctx};
    gguf_context* gctx     = gguf_init_from_file(argv[1], gp);
    String2TensorStorage storage;
    std::map<std::string, ggml_tensor*> file_tensors;
    for (int64_t i = 0; i < gguf_get_n_tensors(gctx); ++i) {
        std::string name = gguf_get_tensor_name(gctx, i);
        ggml_tensor* t   = ggml_get_tensor(data_ctx, name.c_str());
        std::string full = "text_encoders.llm_adapter." + name;
        TensorStorage ts;
        ts.name   = full;
        ts.type   = t->type;
        ts.n_dims = ggml_n_dims(t);
        for (int d = 0; d < 4; ++d) {
            ts.ne[d] = t->ne[d];
        }
        storage[full]      = ts;
        file_tensors[full] = t;
    }
    if (!LLMAdapter::Qwen35BridgeConfig::present(storage, PREFIX)) {
        fprintf(stderr, "%s is not a qwen3.5 bridge adapter\n", argv[1]);
        return 1;
    }
    ggml_backend_t backend = ggml_backend_cpu_init();
    auto manager           = std::make_shared<ResidentWeights>();  // the runner holds it weakly
    ProbeRunner runner(backend, storage, PREFIX, manager);
    if (ggml_backend_alloc_ctx_tensors(runner.params(), backend) == nullptr) {
        fprintf(stderr, "cannot allocate the adapter's parameters\n");
        return 1;
    }
    std::map<std::string, ggml_tensor*> params;
    runner.get_param_tensors(params, PREFIX);
    for (auto& [name, p] : params) {
        auto it = file_tensors.find(name);
        if (it == file_tensors.end() || ggml_nelements(it->second) != ggml_nelements(p)) {
            fprintf(stderr, "tensor %s missing or misshapen in the file\n", name.c_str());
            return 1;
        }
        ggml_tensor* src = it->second;
        int64_t n        = ggml_nelements(p);
        if (src->type == p->type) {
            ggml_backend_tensor_set(p, src->data, 0, ggml_nbytes(p));
        } else if (src->type == GGML_TYPE_F16 && p->type == GGML_TYPE_F32) {
            std::vector<float> tmp(n);
            ggml_fp16_to_fp32_row(static_cast<const ggml_fp16_t*>(src->data), tmp.data(), n);
            ggml_backend_tensor_set(p, tmp.data(), 0, ggml_nbytes(p));
        } else if (src->type == GGML_TYPE_F32 && p->type == GGML_TYPE_F16) {
            std::vector<ggml_fp16_t> tmp(n);
            ggml_fp32_to_fp16_row(static_cast<const float*>(src->data), tmp.data(), n);
            ggml_backend_tensor_set(p, tmp.data(), 0, ggml_nbytes(p));
        } else {
            fprintf(stderr, "tensor %s: file type %d, runner type %d\n", name.c_str(), src->type, p->type);
            return 1;
        }
    }
    printf("ready in_dim %lld vis_dim %lld max_slots %lld\n", (long long)runner.config.in_dim,
           (long long)runner.config.vis_dim, (long long)runner.config.max_slots);
    fflush(stdout);
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string cmd, h, hpath, out_path, ids_path;
        long long L;
        int n_refs;
        in >> cmd;
        if (cmd != "refs") {
            printf("error unknown command %s\n", cmd.c_str());
            fflush(stdout);
            continue;
        }
        in >> h >> hpath >> L >> out_path >> ids_path >> n_refs;
        const int64_t in_dim  = runner.config.in_dim;
        const int64_t vis_dim = runner.config.vis_dim;
        sd::Tensor<float> hidden({in_dim, L, 1}, read_floats(hpath, static_cast<size_t>(L * in_dim)));
        std::vector<sd::Tensor<float>> refs;
        for (int r = 0; r < n_refs; ++r) {
            long long n;
            std::string vpath;
            in >> n >> vpath;
            refs.emplace_back(std::vector<int64_t>{vis_dim, n}, read_floats(vpath, static_cast<size_t>(n * vis_dim)));
        }
        std::vector<int> ids;
        std::vector<std::pair<int, int>> slots;
        sd::Tensor<float> out = condition(&runner, &tokenizer, unhex(h), std::move(refs), hidden, ids, slots);
        FILE* f = fopen(out_path.c_str(), "wb");
        fwrite(out.data(), sizeof(float), static_cast<size_t>(out.numel()), f);
        fclose(f);
        std::ofstream idf(ids_path);
        for (size_t i = 0; i < ids.size(); ++i) {
            idf << (i ? " " : "") << ids[i];
        }
        idf << "\n";
        for (const auto& [start, count] : slots) {
            idf << start << " " << count << "\n";
        }
        idf.close();  // before the reply: the test reads the file on it
        printf("%lld\n", static_cast<long long>(out.numel()));
        fflush(stdout);
    }
    return 0;
}
