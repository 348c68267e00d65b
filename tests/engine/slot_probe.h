// What the slot kinds' probes share (qwen35_bridge/qwen35_probe.cpp, ming_image/ming_probe.cpp,
// ming_image/ming_vision_probe.cpp): a weight manager that keeps every parameter resident, a
// GGUF file's tensors under the names the engine's loader gives them, their copy into a runner's
// parameters (f16 <-> f32 where the runner chose the other type, as the loader converts), and
// the stdin/stdout protocol's helpers. slot_engine.py copies it beside each project's sources.
#pragma once

#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/ggml_extend.hpp"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "gguf.h"
#include "model_loader.h"

struct ResidentWeights : public RunnerWeightManager {
    bool assign_compute_backend(const std::vector<ggml_tensor*>&, ggml_backend_t) override { return true; }
    bool prepare_params(const std::vector<ggml_tensor*>&) override { return true; }
    void release_compute_backend_params(const std::vector<ggml_tensor*>&) override {}
    void release_params_backend_params(const std::vector<ggml_tensor*>&) override {}
};

// a GGUF's tensors (data loaded) keyed by prefix + name, with the TensorStorage the runners read
struct File {
    ggml_context* data = nullptr;
    String2TensorStorage storage;
    std::map<std::string, ggml_tensor*> tensors;
};

inline bool open_file(const char* path, const std::string& prefix, File& file) {
    gguf_init_params gp = {false, &file.data};
    gguf_context* gctx  = gguf_init_from_file(path, gp);
    if (gctx == nullptr) {
        fprintf(stderr, "cannot read %s\n", path);
        return false;
    }
    for (int64_t i = 0; i < gguf_get_n_tensors(gctx); ++i) {
        std::string name = gguf_get_tensor_name(gctx, i);
        ggml_tensor* t   = ggml_get_tensor(file.data, name.c_str());
        std::string full = prefix + name;
        TensorStorage ts;
        ts.name   = full;
        ts.type   = t->type;
        ts.n_dims = ggml_n_dims(t);
        for (int d = 0; d < 4; ++d) {
            ts.ne[d] = t->ne[d];
        }
        file.storage[full] = ts;
        file.tensors[full] = t;
    }
    return true;
}

inline bool copy_params(const std::map<std::string, ggml_tensor*>& params, const File& file) {
    for (auto& [name, p] : params) {
        auto it = file.tensors.find(name);
        if (it == file.tensors.end()) {
            fprintf(stderr, "tensor %s not in the file\n", name.c_str());
            return false;
        }
        ggml_tensor* src = it->second;
        int64_t n        = ggml_nelements(p);
        if (ggml_nelements(src) != n) {
            fprintf(stderr, "tensor %s has the wrong shape\n", name.c_str());
            return false;
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
            return false;
        }
    }
    return true;
}

// a command's text argument: its UTF-8 bytes in hex, "-" for the empty text
inline std::string unhex(const std::string& h) {
    std::string out;
    if (h == "-") {
        return out;
    }
    for (size_t i = 0; i + 1 < h.size(); i += 2) {
        out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
    }
    return out;
}

inline void print_ids(const std::vector<int>& ids) {
    for (size_t i = 0; i < ids.size(); ++i) {
        printf(i ? " %d" : "%d", ids[i]);
    }
    printf("\n");
    fflush(stdout);
}

inline std::vector<float> read_floats(const std::string& path, size_t n) {
    std::vector<float> v(n);
    std::ifstream f(path, std::ios::binary);
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
    return v;
}

inline std::vector<int32_t> read_ids(const std::string& path) {
    std::vector<int32_t> ids;
    std::ifstream f(path);
    for (int32_t v; f >> v;) {
        ids.push_back(v);
    }
    return ids;
}

// the tensor as f32 to path; its element count is the command's answer
inline void write_floats(const std::string& path, const sd::Tensor<float>& t) {
    FILE* f = fopen(path.c_str(), "wb");
    fwrite(t.data(), sizeof(float), static_cast<size_t>(t.numel()), f);
    fclose(f);
    printf("%lld\n", static_cast<long long>(t.numel()));
    fflush(stdout);
}
