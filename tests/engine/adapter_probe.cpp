// The engine tier's adapter driver: an adapter GGUF loaded as ggk 0.9.7 loads `--llm-adapter`
// (ModelLoader::init_from_file with the "text_encoders.llm_adapter." prefix, gk-diffuser.cpp
// 1175-1180; convert_tensors_name, 1224; the runner ggk picks by the file's tensors, 1236-1238 and
// conditioner.hpp 1236; ModelLoader::load_tensors into the runner's parameters), then run by that
// runner on the gk CPU backend. Nothing here knows an adapter kind: the Python cases
// (engine_adapter_cases.py) say what to feed and what to expect.
//
//   adapter_probe ADAPTER.gguf OUT.bin --hidden H.bin L [--ids IDS.txt] [--vis V.bin ROWS]
//                 [--vis-slot VS.bin] [--project P.bin ROWS PO.bin] [--bank BH.bin]
//
// H.bin: L rows of student final-norm states (f32, in_dim each). IDS.txt: seed ids, one a line
// (T5 window ids of a seeded resampler; a slot resampler's per-token seeds). V.bin: ROWS rows of
// raw mmproj embeds (f32, vis_dim each): for the plain runner the dense per-position input
// encode_prompt builds for vis_in (ROWS = L, zeros off-image, conditioner.hpp 2676-2695); for a
// slot runner one row per vision embed. VS.bin: a slot runner's vision row under each slot.
// P.bin: ROWS raw embeds run through the file's vision_proj (project_vision, the splice map);
// its output goes to PO.bin. BH.bin: the Qwen3.5 bridge's FLUX.3 pass (want_bank, conditioner.hpp
// 4426-4450): n_bank rows (f32, in_dim each), the student state under each bank row (row 3 + i =
// student row i, zeros elsewhere); OUT.bin is then the bank [bank_dim, n_bank]. OUT.bin: the
// runner's output (f32), as SD_DUMP_COND's adapter_out.bin. stdout, first line: what the runner
// detected ("key value" pairs).
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "model/te/llm_adapter.hpp"
#include "model_loader.h"

static const std::string FILE_PREFIX = "text_encoders.llm_adapter.";
static const std::string PREFIX      = "text_encoders.llm_adapter.adapter";

struct ResidentWeights : public RunnerWeightManager {  // the parameters are already on the CPU
    bool assign_compute_backend(const std::vector<ggml_tensor*>&, ggml_backend_t) override { return true; }
    bool prepare_params(const std::vector<ggml_tensor*>&) override { return true; }
    void release_compute_backend_params(const std::vector<ggml_tensor*>&) override {}
    void release_params_backend_params(const std::vector<ggml_tensor*>&) override {}
};

template <typename Runner>
struct Probe : public Runner {
    using Runner::Runner;
    ggml_context* params() { return this->params_ctx; }
};

static std::vector<float> read_f32(const std::string& path, size_t n) {
    std::vector<float> v(n);
    std::ifstream f(path, std::ios::binary);
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
    if (static_cast<size_t>(f.gcount()) != n * sizeof(float)) {
        fprintf(stderr, "%s: expected %zu floats\n", path.c_str(), n);
        exit(1);
    }
    return v;
}

static void write_f32(const std::string& path, const sd::Tensor<float>& t) {
    FILE* f = fopen(path.c_str(), "wb");
    fwrite(t.data(), sizeof(float), static_cast<size_t>(t.numel()), f);
    fclose(f);
}

// Allocates the runner's parameters and fills them with ModelLoader::load_tensors from the file,
// the call ggk makes for every model it loads; a tensor the runner wants that the file lacks, or
// one of another shape, fails here as it fails ggk.
template <typename R>
static bool load(R& runner, ModelLoader& loader, ggml_backend_t backend) {
    if (ggml_backend_alloc_ctx_tensors(runner.params(), backend) == nullptr) {
        fprintf(stderr, "cannot allocate the adapter's parameters\n");
        return false;
    }
    std::map<std::string, ggml_tensor*> tensors;
    runner.get_param_tensors(tensors, PREFIX);
    loader.process_model_files(false);
    // what gk-diffuser.cpp 2381 leaves to the vocabulary provider
    return loader.load_tensors(tensors, {FILE_PREFIX + "tokenizer_json"}, false);
}

int main(int argc, char** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: adapter_probe ADAPTER.gguf OUT.bin --hidden H.bin L [--ids IDS.txt] "
                        "[--vis V.bin ROWS] [--vis-slot VS.bin] [--project P.bin ROWS PO.bin] [--bank BH.bin]\n");
        return 2;
    }
    std::string adapter = argv[1], out_path = argv[2], hidden_path, ids_path, vis_path, vis_slot_path;
    std::string project_path, project_out, bank_path;
    int64_t L = 0, vis_rows = 0, project_rows = 0;
    for (int i = 3; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--hidden" && i + 2 < argc) {
            hidden_path = argv[++i];
            L           = std::stoll(argv[++i]);
        } else if (a == "--ids" && i + 1 < argc) {
            ids_path = argv[++i];
        } else if (a == "--vis" && i + 2 < argc) {
            vis_path = argv[++i];
            vis_rows = std::stoll(argv[++i]);
        } else if (a == "--vis-slot" && i + 1 < argc) {
            vis_slot_path = argv[++i];
        } else if (a == "--bank" && i + 1 < argc) {
            bank_path = argv[++i];
        } else if (a == "--project" && i + 3 < argc) {
            project_path = argv[++i];
            project_rows = std::stoll(argv[++i]);
            project_out  = argv[++i];
        } else {
            fprintf(stderr, "unknown argument %s\n", a.c_str());
            return 2;
        }
    }

    ModelLoader loader;
    if (!loader.init_from_file(adapter, FILE_PREFIX)) {
        fprintf(stderr, "ModelLoader cannot read %s\n", adapter.c_str());
        return 1;
    }
    loader.convert_tensors_name();
    const String2TensorStorage& storage = loader.get_tensor_storage_map();
    ggml_backend_t backend              = ggml_backend_cpu_init();
    auto manager                        = std::make_shared<ResidentWeights>();

    std::vector<int32_t> ids;
    if (!ids_path.empty()) {
        std::ifstream f(ids_path);
        for (int32_t v; f >> v;) {
            ids.push_back(v);
        }
    }
    auto tensor_ids = [&]() {
        return ids.empty() ? sd::Tensor<int32_t>() : sd::Tensor<int32_t>({static_cast<int64_t>(ids.size()), 1}, ids);
    };
    auto rows = [&](const std::string& path, int64_t dim, int64_t n) {
        return sd::Tensor<float>({dim, n, 1}, read_f32(path, static_cast<size_t>(dim * n)));
    };

    const bool ming   = storage.find(PREFIX + ".cap_query") != storage.end();
    const bool bridge = LLMAdapter::Qwen35BridgeConfig::present(storage, PREFIX);
    sd::Tensor<float> out;
    if (ming || bridge) {
        // the slot runners (gk-diffuser.cpp 1236-1238): `cap_query` = Ming, `slot_query` alone =
        // the Qwen3.5 bridge; both take the student states, the seeds and the vision rows
        auto run = [&](auto& runner, const char* kind) {
            constexpr bool is_bridge =
                std::is_same_v<std::decay_t<decltype(runner)>, Probe<LLMAdapter::Qwen35BridgeRunner>>;
            const auto& c = runner.config;
            printf("runner %s in_dim %lld out_dim %lld width %lld depth %lld max_slots %lld seed_vocab %lld "
                   "seed_rank %lld vis_dim %lld",
                   kind, (long long)c.in_dim, (long long)c.out_dim, (long long)c.width, (long long)c.depth,
                   (long long)c.max_slots, (long long)c.seed_vocab, (long long)c.seed_rank, (long long)c.vis_dim);
            if constexpr (is_bridge) {  // the FLUX.3 bank head (Qwen35BridgeConfig)
                printf(" n_bank %lld bank_dim %lld bank_align %d", (long long)c.n_bank, (long long)c.bank_dim,
                       c.bank_align);
            }
            printf("\n");
            if (!load(runner, loader, backend)) {
                exit(1);
            }
            auto h  = rows(hidden_path, c.in_dim, L);
            auto v  = vis_path.empty() ? sd::Tensor<float>() : rows(vis_path, c.vis_dim, vis_rows);
            auto vs = vis_slot_path.empty() ? sd::Tensor<float>() : rows(vis_slot_path, c.vis_dim, static_cast<int64_t>(ids.size()));
            if constexpr (is_bridge) {
                if (!bank_path.empty()) {  // FLUX.3: want_bank with the token-aligned bank's rows
                    if (c.n_bank == 0) {
                        fprintf(stderr, "--bank: the adapter has no bank head\n");
                        exit(1);
                    }
                    return runner.compute(1, h, tensor_ids(), v, vs, true, rows(bank_path, c.in_dim, c.n_bank));
                }
            }
            if (!bank_path.empty()) {
                fprintf(stderr, "--bank: only the Qwen3.5 bridge runner has a bank head\n");
                exit(1);
            }
            return runner.compute(1, h, tensor_ids(), v, vs);
        };
        if (ming) {
            Probe<LLMAdapter::MingAdapterRunner> runner(backend, storage, PREFIX, manager);
            out = run(runner, "ming");
        } else {
            Probe<LLMAdapter::Qwen35BridgeRunner> runner(backend, storage, PREFIX, manager);
            out = run(runner, "bridge");
        }
    } else {
        Probe<LLMAdapter::AdapterRunner> runner(backend, storage, PREFIX, manager);
        const auto& c = runner.config;
        printf("runner plain in_dim %lld out_dim %lld width %lld depth %lld heads %lld num_queries %lld "
               "t5_vocab %lld embed_rank %lld mlp_hidden %lld token_aligned %d has_seed %d has_skip %d "
               "vis_dim %lld has_vision_proj %d has_vis_in %d n_out_layers %lld\n",
               (long long)c.in_dim, (long long)c.out_dim, (long long)c.width, (long long)c.depth,
               (long long)c.heads, (long long)c.num_queries, (long long)c.t5_vocab, (long long)c.embed_rank,
               (long long)c.mlp_hidden, c.token_aligned, c.has_seed, c.has_skip, (long long)c.vis_dim,
               c.has_vision_proj, c.has_vis_in, (long long)c.n_out_layers);
        if (!load(runner, loader, backend)) {
            return 1;
        }
        auto h   = rows(hidden_path, c.in_dim, L);
        auto vis = vis_path.empty() ? sd::Tensor<float>() : rows(vis_path, c.vis_dim, vis_rows);
        out      = runner.compute(1, h, tensor_ids(), {}, vis);
        if (!project_path.empty()) {  // the splice map encode_prompt runs on each image's embeds
            write_f32(project_out, runner.project_vision(1, rows(project_path, c.vis_dim, project_rows)));
        }
    }
    write_f32(out_path, out);
    printf("out %lld\n", static_cast<long long>(out.numel()));
    return 0;
}
