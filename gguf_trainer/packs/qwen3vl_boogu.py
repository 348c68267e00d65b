"""Boogu Image pack (text-to-image): pig_clip + a token-aligned adapter replaces the Qwen3-VL text
encoder of Boogu Image (engine-families §2 row 10).

Engine (ggk 0.9.7 conditioner.hpp 3236-3294, `sd_version_is_boogu_image`): start 0 (the system
turn reaches the DiT); `<|im_start|>system\\n` + the text-to-image system prompt ("You are a
helpful assistant that generates high-quality images based on user instructions. The
instructions are as follows.") + `<|im_end|>\\n<|im_start|>user\\n`, the prompt range, then
`<|im_end|>\\n` with no assistant turn (3284-3291). A prompt that is empty or only spaces, tabs and
line breaks takes the EDIT system prompt instead (3244, 3285); with reference images the edit
prompt is followed by `<|vision_start|>` + pads + `<|vision_end|>` per image (3247-3283). No pads;
no out_layers: the DiT reads the final norm.

Edits (reference images, ~384^2) are not in this version: they need a vision-ext adapter; this
pack exports the text-only kind, which serves text-to-image.

Teacher: no citable public source names the repo of Boogu Image's text encoder, so the pack
declares "link a local copy": the Qwen3-VL text encoder of the Boogu Image release (transformers
Qwen3-VL, hidden 4096: Qwen3-VL-8B's shape, 36 layers, ~17.5 GB bf16) with its tokenizer files.
"""

from __future__ import annotations

from ..template_ids import Piece
from .base import Material
from .token_aligned_qwen import QwenTokenAlignedPack

T2I_SYSTEM = ("You are a helpful assistant that generates high-quality images based on user "
              "instructions. The instructions are as follows.")
EDIT_SYSTEM = ("Describe the key features of the input image (color, shape, size, texture, "
               "objects, background), then explain how the user's text instruction should alter or "
               "modify the image. Generate a new image that meets the user's requirements while "
               "maintaining consistency with the original input where appropriate.")


def boogu_prefix(text: str) -> str:
    """3284-3286: the edit system prompt for a blank prompt (spaces, tabs, line breaks only),
    else the text-to-image one."""
    system = EDIT_SYSTEM if not text.strip(" \t\r\n") else T2I_SYSTEM
    return "<|im_start|>system\n" + system + "<|im_end|>\n<|im_start|>user\n"


class BooguPack(QwenTokenAlignedPack):
    id = "qwen3vl_boogu"
    title = "Boogu Image (its Qwen3-VL, final norm; text-to-image)"
    description = ("Replaces the Qwen3-VL text encoder of Boogu Image with pig_clip + a "
                   "token-aligned adapter emitting its final-norm state of every template row.")
    family = "Boogu Image"
    serves = "Boogu Image (text-to-image)"
    teacher_arch = "qwen3_vl"
    teacher_hidden = 4096
    teacher_taps = ()
    suffix = "<|im_end|>\n"
    start = 0
    default_name = "qwen3vl_boogu_adapter"
    shard_contract = "qwen3vl_boogu/1"
    engine_template = {"file": "diffusion/src/conditioning/conditioner.hpp", "lines": (3237, 3294),
                       "version": "VERSION_BOOGU_IMAGE"}
    teacher_materials = (
        Material("teacher", "Teacher: Boogu Image's Qwen3-VL (link a local copy)", "hf_snapshot",
                 size_gb=17.5, hint="the Qwen3-VL text encoder folder of the Boogu Image release "
                 "(transformers Qwen3-VL, hidden 4096, ~17.5 GB bf16) with its tokenizer files"),
    )
    teacher_memory_gib = 17.5
    typical_rows = 40 + 60
    hints = {"train": "Targets: the Qwen3-VL final norm (4096) of every row, system turn included.",
             "eval": "Judge by cos against the mean baseline (no reference run)."}
    engine_command_template = (
        "ggk diffuser engine -- --diffusion-model <boogu-image DiT .gguf> --vae <boogu vae .gguf> "
        "--llm {student} --llm-adapter {adapter} -p \"a lovely pig holding a sign says GGUF\" "
        "-o out.png")
    engine_teacher_args = "--llm <the Boogu Image Qwen3-VL text encoder .gguf>"
    engine_notes = (("Text-to-image only: an edit (--ref-image) needs a vision-ext adapter, which "
                     "this version does not train."),)
    export_kv = {"adapter.teacher_tap": "final norm", "adapter.family": "Boogu Image"}

    def student_pieces(self, sample, image_tokens=()):
        return (Piece(boogu_prefix(sample.text)), Piece(sample.text, prompt=True),
                Piece(self.suffix))

    def format_prompt(self, text: str) -> str:
        return boogu_prefix(text) + text + self.suffix


PACK = BooguPack()
