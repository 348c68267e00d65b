"""MiniMax H3 pack: pig_clip + a token-aligned adapter replaces the truncated Qwen3-VL text
encoder of MiniMax H3 (engine-families §2 row 12).

Engine (ggk 0.9.7 conditioner.hpp 2948-2953, `sd_version_is_minimax_h3`): the raw prompt, no
template and no special tokens; prompt range {0, 0}, so the prompt is ONE piece and weight
syntax is plain text (2557-2576); start 0; no pads; out_layers {50}: "the raw, unnormalized
output of truncated Qwen3-VL layer 50", 5120 wide (engine-families §2 row 12). An empty prompt
gives no ids at all: the engine has nothing to encode, so the demo corpus holds no empty prompts
(corpus.empty_frac 0).

Teacher: no citable public source names the MiniMax H3 text encoder's repo, so the pack
declares "link a local copy": the Qwen3-VL text encoder of the MiniMax H3 release (transformers
Qwen3-VL, hidden 5120, at least 50 decoder layers: Qwen3-VL-32B's shape cut to 50 layers,
~26 B parameters, ~52 GB in bf16). The adapter's width follows the snapshot.
"""

from __future__ import annotations

from gguf_trainer.engine.template_ids import template_ids
from gguf_trainer.materials.spec import Material

from .token_aligned_qwen import QwenTokenAlignedPack


class MiniMaxH3Pack(QwenTokenAlignedPack):
    id = "qwen3vl_minimax_h3"
    title = "MiniMax H3 (truncated Qwen3-VL, layer 50)"
    description = (
        "Replaces the truncated Qwen3-VL text encoder of MiniMax H3 with "
        "pig_clip + a token-aligned "
        "adapter emitting the raw layer-50 state (5120 wide) of every prompt token."
    )
    family = "MiniMax H3"
    serves = "MiniMax H3 (video)"
    teacher_arch = "qwen3_vl"
    teacher_hidden = 5120
    teacher_taps = (50,)
    tiny_layers = 50
    prefix = ""
    suffix = ""
    one_piece = True  # prompt range {0, 0}: the raw prompt, unparsed
    start = 0
    default_name = "qwen3vl_minimax_h3_adapter"
    shard_contract = "qwen3vl_minimax_h3/1"
    engine_template = {
        "file": "diffusion/src/conditioning/conditioner.hpp",
        "lines": (2949, 2953),
        "version": "VERSION_MINIMAX_H3",
    }
    teacher_materials = (
        Material(
            "teacher",
            "Teacher: MiniMax H3's truncated Qwen3-VL (link a local copy)",
            "hf_snapshot",
            size_gb=52.0,
            hint="the Qwen3-VL text encoder folder of the MiniMax H3 release (transformers "
            "Qwen3-VL, hidden 5120, >= 50 decoder layers, ~52 GB bf16) with its tokenizer files",
        ),
    )
    teacher_memory_gib = 52.0
    typical_rows = 60
    defaults = {**QwenTokenAlignedPack.defaults, "corpus.empty_frac": 0.0}
    demo_settings = {"corpus.empty_frac": 0.0}
    hints = {
        "train": "Targets: truncated Qwen3-VL layer 50 (raw, 5120) of every prompt token.",
        "eval": "Judge by cos against the mean baseline (no reference run).",
    }
    # --cfg-scale 1: ggk 0.9.7 has no MiniMax H3 case in sd_get_default_txt_cfg (gk-diffuser.cpp
    # 4833-4882: 7.0), which cli/main.cpp 825-827 takes when the command sets none; a txt_cfg
    # that differs from img_cfg (1) turns on the unconditional branch (resolve_guidance,
    # gk-diffuser.cpp 5291-5293), so prepare_video_generation_embeds encodes the negative
    # prompt (7214-7219): "" by default, which this family's raw template tokenizes to no ids,
    # and get_learned_condition aborts at GGML_ASSERT(hidden_states.shape()[1] >
    # prompt_template_encode_start_idx) (conditioner.hpp 2898) - with the teacher as with the
    # adapter. Guidance 1 is also the model's own: the released H3 weights are CFG-distilled
    # (Kijai/MiniMax-H3_comfy discussion 11; the source card's settings as quoted by
    # huggingface.co/Rin247/MiniMax-H3: "CFG-distilled (no CFG)"; ComfyUI's H3 workflows have
    # no CFG), so a non-empty -n would double the DiT passes for guidance the model was not
    # sampled with.
    engine_command_template = (
        "ggk diffuser engine -- -M vid_gen --diffusion-model <minimax-h3 DiT .gguf> --vae "
        "<minimax-h3 vae .gguf> "
        '--llm {student} --llm-adapter {adapter} -p "a red fox running through fresh snow" '
        "--cfg-scale 1 --video-frames 33 -o out.avi"
    )
    engine_teacher_args = "--llm <the MiniMax H3 Qwen3-VL text encoder .gguf>"
    engine_notes = (("keep --cfg-scale 1: the H3 weights are CFG-distilled, and at ggk's "
                     "default guidance (7) the empty negative prompt has no ids and ggk 0.9.7 "
                     "aborts"),)
    export_kv = {"adapter.teacher_tap": "layer 50 (raw)", "adapter.family": "MiniMax H3"}

    def student_ids(self, encode, sample, image_tokens=()):
        """The shared chunk rule without PixArt's [151643] for nothing: LLMEmbedder::tokenize
        (2551-2623) leaves an empty raw prompt as no ids at all."""
        return template_ids(encode, self.student_pieces(sample, image_tokens))


PACK = MiniMaxH3Pack()
