"""LingBot Video pack (text-to-video): pig_clip + a token-aligned adapter replaces the Qwen3-VL text
encoder of LingBot Video (engine-families §2 row 11).

Engine (ggk 0.9.7 conditioner.hpp 2971-3049, `sd_version_is_lingbot_video`): the "Enhanced
prompt" system turn + `<|im_start|>user\\n` (2973-2983) is dropped: start = its token count
without 151643 (2985-2991; 140 with the Qwen vocabulary); the prompt follows it with NO prompt
range ({0, 0}, 3047: one unparsed piece, weight syntax is text), then
`<|im_end|>\\n<|im_start|>assistant\\n`; no pads; no out_layers: the DiT reads the final norm.
For I2V the reference images come between the user marker and the prompt as
`<|vision_start|>` + pads + `<|vision_end|>` (2994-3044).

I2V (reference images) is not in this version: it needs a vision-ext adapter; this pack exports
the text-only kind, which serves text-to-video.

Teacher: no citable public source names the repo of LingBot Video's text encoder, so the pack
declares "link a local copy": the Qwen3-VL text encoder of the LingBot Video release
(transformers Qwen3-VL, hidden 2560: Qwen3-VL-4B's shape, 36 layers, ~8.9 GB bf16) with its
tokenizer files.
"""

from __future__ import annotations

from .base import Material
from .token_aligned_qwen import QwenTokenAlignedPack

LINGBOT_PREFIX = (
    "<|im_start|>system\nGiven a user input that may include a text prompt alone, "
    "a text prompt with an image reference, or a text prompt with a video reference "
    "or a video reference alone, generate an \"Enhanced prompt\" that provides detailed "
    "visual descriptions suitable for video generation. Evaluate the level of detail "
    "in the user's input: if it is simple, enrich it by adding specifics about colors, "
    "shapes, sizes, textures, lighting, motion dynamics, camera movement, temporal "
    "progression, and spatial relationships to create vivid, concrete, and temporally "
    "coherent scenes to create vivid and concrete scenes. Please generate only the "
    "enhanced description for the prompt below and avoid including any additional "
    "commentary or evaluations:<|im_end|>\n<|im_start|>user\n")


class LingBotPack(QwenTokenAlignedPack):
    id = "qwen3vl_lingbot"
    title = "LingBot Video (its Qwen3-VL, final norm; text-to-video)"
    description = ("Replaces the Qwen3-VL text encoder of LingBot Video with pig_clip + a "
                   "token-aligned adapter emitting its final-norm state of every row.")
    family = "LingBot Video"
    serves = "LingBot Video (text-to-video)"
    teacher_arch = "qwen3_vl"
    teacher_hidden = 2560
    teacher_taps = ()
    prefix = LINGBOT_PREFIX
    suffix = "<|im_end|>\n<|im_start|>assistant\n"
    one_piece = True  # prompt range {0, 0} (3047): the whole template is one piece
    start = 140
    start_prefix = LINGBOT_PREFIX
    default_name = "qwen3vl_lingbot_adapter"
    shard_contract = "qwen3vl_lingbot/1"
    engine_template = {"file": "diffusion/src/conditioning/conditioner.hpp", "lines": (2972, 3049),
                       "version": "VERSION_LINGBOT_VIDEO"}
    teacher_materials = (
        Material("teacher", "Teacher: LingBot Video's Qwen3-VL (link a local copy)", "hf_snapshot",
                 size_gb=8.9, hint="the Qwen3-VL text encoder folder of the LingBot Video release "
                 "(transformers Qwen3-VL, hidden 2560, ~8.9 GB bf16) with its tokenizer files"),
    )
    teacher_memory_gib = 9.0
    typical_rows = 140 + 70
    hints = {"train": "Targets: the Qwen3-VL final norm (2560) of every row; rows from 140 reach "
                      "the DiT.",
             "eval": "Judge by cos_slice against the mean baseline (no reference run)."}
    engine_command_template = (
        "ggk diffuser engine -- -M vid_gen --diffusion-model <lingbot-video DiT .gguf> "
        "--vae <lingbot vae .gguf> "
        "--llm {student} --llm-adapter {adapter} -p \"a red fox running through fresh snow\" "
        "--video-frames 33 -o out.avi")
    engine_teacher_args = "--llm <the LingBot Video Qwen3-VL text encoder .gguf>"
    engine_notes = (("Text-to-video only: I2V (--ref-image) needs a vision-ext adapter, which this "
                     "version does not train."),)
    export_kv = {"adapter.teacher_tap": "final norm", "adapter.family": "LingBot Video"}


PACK = LingBotPack()
