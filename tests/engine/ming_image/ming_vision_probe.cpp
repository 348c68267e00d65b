// The engine tier's Ming-Image vision driver: a pig_ming_vision GGUF read as ggk 0.9.7 reads
// `--llm_vision` for Ming-Image (ModelLoader::init_from_file with the "text_encoders.llm."
// prefix, gk-diffuser.cpp 1154-1172; convert_tensors_name), the source MingImageVisionRunner::
// detect picks for an adapter taking HIDDEN-wide rows (LING = vision.* + linear_proj.*), its
// parameters filled by ModelLoader::load_tensors, and MingImageVisionRunner::encode_image on the
// gk CPU backend.
//   ming_vision_probe VISION.gguf HIDDEN IMG.bin W H OUT.bin
// IMG.bin: the CLIP-normalised image, [W, H, 3] f32 (W fastest; preprocess_vision_image's
// output, so sides are multiples of 28). OUT.bin: [HIDDEN, n_tokens] f32.
// stdout, first line: "source <ling|mmproj|none|unbridged> layers N hidden H out O tokens T".
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "model/te/ming_image_te.hpp"
#include "model_loader.h"
#include "slot_probe.h"  // ResidentWeights

static const std::string PREFIX = "text_encoders.llm";

struct VisionRunner : public MingImageTE::MingImageVisionRunner {
    using MingImageTE::MingImageVisionRunner::MingImageVisionRunner;
    ggml_context* params() { return params_ctx; }
};

int main(int argc, char** argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: ming_vision_probe VISION.gguf HIDDEN IMG.bin W H OUT.bin\n");
        return 2;
    }
    const int64_t hidden = std::stoll(argv[2]);
    const int64_t W = std::stoll(argv[4]), H = std::stoll(argv[5]);
    ModelLoader loader;
    if (!loader.init_from_file(argv[1], PREFIX + ".")) {
        fprintf(stderr, "ModelLoader cannot read %s\n", argv[1]);
        return 1;
    }
    loader.convert_tensors_name();
    const String2TensorStorage& storage = loader.get_tensor_storage_map();
    using Source         = MingImageTE::MingImageVisionRunner::Source;
    const Source source  = MingImageTE::MingImageVisionRunner::detect(storage, PREFIX, "", hidden);
    const char* names[]  = {"none", "ling", "mmproj", "unbridged"};
    if (source != Source::LING) {
        printf("source %s\n", names[static_cast<int>(source)]);
        return 1;
    }
    ggml_backend_t backend = ggml_backend_cpu_init();
    auto weights           = std::make_shared<ResidentWeights>();
    VisionRunner runner(backend, storage, PREFIX, hidden, weights);
    if (ggml_backend_alloc_ctx_tensors(runner.params(), backend) == nullptr) {
        fprintf(stderr, "cannot allocate the tower's parameters\n");
        return 1;
    }
    std::map<std::string, ggml_tensor*> tensors;
    runner.get_param_tensors(tensors, PREFIX);
    loader.process_model_files(false);
    if (!loader.load_tensors(tensors, {}, false)) {
        fprintf(stderr, "ModelLoader::load_tensors failed\n");
        return 1;
    }
    std::vector<float> pixels(static_cast<size_t>(W * H * 3));
    std::ifstream f(argv[3], std::ios::binary);
    f.read(reinterpret_cast<char*>(pixels.data()), static_cast<std::streamsize>(pixels.size() * sizeof(float)));
    if (static_cast<size_t>(f.gcount()) != pixels.size() * sizeof(float)) {
        fprintf(stderr, "%s: expected %zu floats\n", argv[3], pixels.size());
        return 1;
    }
    sd::Tensor<float> image({W, H, 3, 1}, pixels);
    sd::Tensor<float> out = runner.encode_image(1, image);
    FILE* o = fopen(argv[6], "wb");
    fwrite(out.data(), sizeof(float), static_cast<size_t>(out.numel()), o);
    fclose(o);
    const auto& v = runner.vision;
    printf("source ling layers %d hidden %lld out %lld tokens %lld\n", v.num_layers, (long long)v.hidden_size,
           (long long)v.out_hidden_size, (long long)(out.numel() / hidden));
    return 0;
}
