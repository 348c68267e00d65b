// The engine tier's command driver: a printed ggk command read by ggk 0.9.7's own CLI parser and
// resolved by the engine's own defaults, for one family.
//
//   command_probe VERSION_NAME ARGS...        (ARGS: the command's words after `ggk [... --]`)
//
// The parser is the CLI's: cli/common/common.cpp (ArgOptions, SDContextParams,
// SDGenerationParams) and log.cpp / media_io.cpp compiled as they are, main.cpp's SDCliParams,
// print_usage and parse_args cut from it (cmd_main.inc), and main()'s own lines around the
// parse_args call (cmd_main_parse.inc: txt_cfg NAN = "not set"). The sd_* API functions those
// call (their *_init defaults, the name tables) are cut from gk-diffuser.cpp by name
// (cmd_api.inc). What ggk then decides from the model's version is cut from gk-diffuser.cpp too:
// sd_get_default_txt_cfg / sd_get_default_resolution (cmd_defaults.inc), resolve_guidance
// (cmd_guidance.inc) and get_default_ref_image_preset (cmd_preset.inc), with model.hpp's
// REF_IMAGE_PRESETS. A command the parser refuses exits 1 as ggk does (print_usage, exit).
//
// stdout, one line of "key value" pairs (texts hex-encoded UTF-8, "-" = empty): mode, prompt,
// negative, txt_cfg (after the model default), txt_cfg_set, img_cfg and use_uncond (after
// resolve_guidance), width, height, size_set, llm, llm_adapter, llm_vision, ref_images,
// preset, pass_to_vlm, video_frames.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/common.h"
#include "common/media_io.h"
#include "common/resource_owners.hpp"
#include "core/util.h"
#include "gk-diffuser.h"
#include "model.h"
#include "model/diffusion/model.hpp"

// ---- the sd_* API the parser calls, cut from gk-diffuser.cpp ----
#include "cmd_api.inc"

// ---- main.cpp: SDCliParams, print_usage, parse_args ----
#include "cmd_main.inc"

// ---- what the version-dependent defaults read of a context: its version, its conditioner's type
// (MOSS-Image asks whether it is the Qwen3.5 bridge; no family here is) and its DiT (PixArt's
// default size is its checkpoint's sample_size; without one, the generic default) ----
struct Loaded {
    virtual ~Loaded() = default;
};
struct Qwen35BridgeEmbedder : Loaded {};
namespace PixArt {
struct PixArtRunner : Loaded {
    struct {
        int sample_size = 0;
    } config;
};
}  // namespace PixArt
struct StableDiffusionGGML {
    SDVersion version;
    std::shared_ptr<Loaded> cond_stage_model = std::make_shared<Loaded>();
    std::shared_ptr<Loaded> diffusion_model;
    std::shared_ptr<Loaded> high_noise_diffusion_model;
    int get_vae_scale_factor() const { return 8; }
};
struct sd_ctx_t {
    StableDiffusionGGML* sd = nullptr;
};

#include "cmd_defaults.inc"  // sd_version_supports_*img_cfg, sd_get_default_txt_cfg, sd_get_default_resolution

struct GuidanceCut {
#include "cmd_guidance.inc"  // GenerationRequest::resolve_guidance
};

struct PresetCut {
    SDVersion version;
#include "cmd_preset.inc"  // StableDiffusionGGML::get_default_ref_image_preset
};

static const std::map<std::string, SDVersion> VERSIONS = {
#include "cmd_versions.inc"  // {"VERSION_X", VERSION_X}, from model.h's enum
};

static std::string hex(const std::string& s) {
    static const char* d = "0123456789abcdef";
    std::string out;
    for (unsigned char c : s) {
        out.push_back(d[c >> 4]);
        out.push_back(d[c & 15]);
    }
    return out.empty() ? "-" : out;
}

int main(int argc_in, const char** argv_in) {
    if (argc_in < 2 || !VERSIONS.count(argv_in[1])) {
        fprintf(stderr, "usage: command_probe VERSION_NAME ARGS...\n");
        return 2;
    }
    StableDiffusionGGML sd;
    sd.version = VERSIONS.at(argv_in[1]);
    sd_ctx_t ctx{&sd};
    // ggk's argv: the program name, then the command's words
    std::vector<const char*> args = {"ggk"};
    for (int i = 2; i < argc_in; ++i) {
        args.push_back(argv_in[i]);
    }
    int argc          = static_cast<int>(args.size());
    const char** argv = args.data();
#include "cmd_main_parse.inc"  // SDCliParams cli_params; ... parse_args(argc, argv, ...);

    auto& guidance         = gen_params.sample_params.guidance;
    const bool txt_cfg_set = !std::isnan(guidance.txt_cfg);
    if (!txt_cfg_set) {  // main.cpp: the model's default once the version is known
        guidance.txt_cfg = sd_get_default_txt_cfg(&ctx);
    }
    const bool size_set = gen_params.width_and_height_are_set();
    int width = gen_params.width, height = gen_params.height;
    if (!size_set && gen_params.ref_image_paths.empty()) {
        int w = 0, h = 0;
        sd_get_default_resolution(&ctx, &w, &h);
        gen_params.set_width_and_height_if_unset(w, h);
        width  = gen_params.get_resolved_width();
        height = gen_params.get_resolved_height();
    }
    bool use_uncond = false, use_img_uncond = false;
    const bool has_refs = !gen_params.ref_image_paths.empty();
    GuidanceCut::resolve_guidance(&ctx, &guidance, &use_uncond, &use_img_uncond, has_refs);
    PresetCut preset{sd.version};
    const std::string preset_name = preset.get_default_ref_image_preset(sd.version);
    RefImageParams ref_params;
    if (preset_name != "default") {
        ref_params = REF_IMAGE_PRESETS.at(preset_name);
    }
    printf("mode %s prompt %s negative %s txt_cfg %.9g txt_cfg_set %d img_cfg %.9g use_uncond %d "
           "width %d height %d size_set %d llm %s llm_adapter %s llm_vision %s ref_images %zu "
           "preset %s pass_to_vlm %d video_frames %d\n",
           modes_str[cli_params.mode], hex(gen_params.prompt).c_str(), hex(gen_params.negative_prompt).c_str(),
           guidance.txt_cfg, txt_cfg_set, guidance.img_cfg, use_uncond, width, height, size_set,
           hex(ctx_params.llm_path).c_str(), hex(ctx_params.llm_adapter_path).c_str(),
           hex(ctx_params.llm_vision_path).c_str(), gen_params.ref_image_paths.size(), preset_name.c_str(),
           ref_params.pass_to_vlm, gen_params.video_frames);
    return 0;
}
