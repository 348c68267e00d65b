// The engine tier's adapter driver: ggk 0.9.7's own LLMAdapter::AdapterRunner on the gk CPU
// backend, run on an exported adapter GGUF.
//   adapter_probe ADAPTER.gguf HIDDEN.bin L IDS.txt OUT.bin [VIS.bin]
// HIDDEN.bin: L rows of the student's final-norm states (f32, in_dim each); IDS.txt: the T5
// window ids (seeded adapters; ignored otherwise); VIS.bin: L rows of raw mmproj embeds (f32,
// vis_dim each, zeros off-image), the dense input encode_prompt builds for vis_in
// (conditioner.hpp 2676-2695). OUT.bin: the runner's output (f32), as the
// engine's SD_DUMP_COND writes adapter_out.bin. The file's tensors are read with gguf.h and
// copied into the runner's parameters (converted to the type the runner chose, as the engine's
// loader converts on load); everything else (detection, graph, math) is the engine's.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "gguf.h"
#include "model/te/llm_adapter.hpp"

static const std::string PREFIX = "text_encoders.llm_adapter.adapter";

struct ResidentWeights : public RunnerWeightManager {  // the parameters are already on the CPU
    bool assign_compute_backend(const std::vector<ggml_tensor*>&, ggml_backend_t) override { return true; }
    bool prepare_params(const std::vector<ggml_tensor*>&) override { return true; }
    void release_compute_backend_params(const std::vector<ggml_tensor*>&) override {}
    void release_params_backend_params(const std::vector<ggml_tensor*>&) override {}
};

struct ProbeRunner : public LLMAdapter::AdapterRunner {
    using LLMAdapter::AdapterRunner::AdapterRunner;
    ggml_context* params() { return params_ctx; }
};

int main(int argc, char** argv) {
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: adapter_probe ADAPTER.gguf HIDDEN.bin L IDS.txt OUT.bin [VIS.bin]\n");
        return 2;
    }
    ggml_context* data_ctx = nullptr;
    gguf_init_params gp    = {false, &data_ctx};
    gguf_context* gctx     = gguf_init_from_file(argv[1], gp);
    if (gctx == nullptr) {
        fprintf(stderr, "cannot read %s\n", argv[1]);
        return 1;
    }
    String2TensorStorage storage;
    std::map<std::string, ggml_tensor*> file_tensors;
    for (int64_t i = 0; i < gguf_get_n_tensors(gctx); ++i) {
        std::string name = gguf_get_tensor_name(gctx, i);
        ggml_tensor* t   = ggml_get_tensor(data_ctx, name.c_str());
        std::string full = "text_encoders.llm_adapter." + name;  // the prefix --llm-adapter adds
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
    ggml_backend_t backend = ggml_backend_cpu_init();
    auto manager           = std::make_shared<ResidentWeights>();
    ProbeRunner runner(backend, storage, PREFIX, manager);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(runner.params(), backend);
    if (buf == nullptr) {
        fprintf(stderr, "cannot allocate the adapter's parameters\n");
        return 1;
    }
    std::map<std::string, ggml_tensor*> params;
    runner.get_param_tensors(params, PREFIX);
    for (auto& [name, p] : params) {
        auto it = file_tensors.find(name);
        if (it == file_tensors.end()) {
            fprintf(stderr, "tensor %s not in the file\n", name.c_str());
            return 1;
        }
        ggml_tensor* src = it->second;
        int64_t n        = ggml_nelements(p);
        if (ggml_nelements(src) != n) {
            fprintf(stderr, "tensor %s has the wrong shape\n", name.c_str());
            return 1;
        }
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
    int64_t L      = std::stoll(argv[3]);
    int64_t in_dim = runner.config.in_dim;
    std::vector<float> hidden(static_cast<size_t>(L * in_dim));
    std::ifstream hf(argv[2], std::ios::binary);
    hf.read(reinterpret_cast<char*>(hidden.data()), static_cast<std::streamsize>(hidden.size() * sizeof(float)));
    std::vector<int32_t> ids;
    std::ifstream idf(argv[4]);
    for (int32_t v; idf >> v;) {
        ids.push_back(v);
    }
    sd::Tensor<float> qwen_hidden({in_dim, L, 1}, hidden);
    sd::Tensor<int32_t> t5_ids;
    if (!ids.empty()) {
        t5_ids = sd::Tensor<int32_t>({static_cast<int64_t>(ids.size()), 1}, ids);
    }
    sd::Tensor<float> vis;
    if (argc == 7) {
        const int64_t vis_dim = runner.config.vis_dim;
        std::vector<float> dense(static_cast<size_t>(L * vis_dim));
        std::ifstream vf(argv[6], std::ios::binary);
        vf.read(reinterpret_cast<char*>(dense.data()), static_cast<std::streamsize>(dense.size() * sizeof(float)));
        vis = sd::Tensor<float>({vis_dim, L, 1}, dense);
    }
    sd::Tensor<float> out = runner.compute(1, qwen_hidden, t5_ids, {}, vis);
    FILE* f               = fopen(argv[5], "wb");
    fwrite(out.data(), sizeof(float), static_cast<size_t>(out.numel()), f);
    fclose(f);
    printf("%lld\n", static_cast<long long>(out.numel()));
    return 0;
}
