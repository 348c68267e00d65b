"""Qwen Image 2.1 pack (text-to-image): pig_clip + a token-aligned adapter replaces the Qwen3-VL-8B
text encoder of Qwen Image 2.1 (engine-families §2 row 9).

Engine (ggk 0.9.7 conditioner.hpp 3050-3153, VERSION_QWEN_IMAGE_2_1): the system turn
`<|im_start|>system\\nComprehend and analyze the provided prompt.<|im_end|>\\n` is dropped ("The
DiT never sees the system turn; drop exactly its tokens", 3080-3081: start = its token count, 14);
then `<|im_start|>user\\n`, the prompt range (an empty prompt becomes " ": "Qwen has no bos
token, so an empty prompt leaves nothing to read", 3148-3149), then
`<|im_end|>\\n<|im_start|>assistant\\n`;
no pads; out_layers {num_layers}: the last decoder layer before the final RMSNorm (3082-3083),
resolved from the linked snapshot (36 for Qwen3-VL-8B).

Edits (reference images) are not in this version: the engine needs a vision-ext adapter
(vision_proj + vis_in, 3068-3071) trained on the main merger rows while the teacher sees the
tower WITH deepstack and M-RoPE image positions (3052-3060); this pack exports the text-only
kind, which serves text-to-image (an edit run with it stops with the engine's own sentence).

Teacher: the engine names the full "Qwen3-VL-8B" (3064-3075) but no citable public source names
the repo of Qwen Image 2.1's text encoder, so the pack declares "link a local copy": the
Qwen3-VL-8B text encoder of the Qwen Image 2.1 release (transformers Qwen3-VL, hidden 4096, 36
layers, ~8.8 B parameters with the tower, ~17.5 GB bf16) with its tokenizer files.
"""

from __future__ import annotations

from ..template_ids import Piece
from .base import Material
from .token_aligned_qwen import QwenTokenAlignedPack

SYSTEM_TURN = "<|im_start|>system\nComprehend and analyze the provided prompt.<|im_end|>\n"


class QwenImage21Pack(QwenTokenAlignedPack):
    id = "qwen3vl_qwen_image_2_1"
    title = "Qwen Image 2.1 (Qwen3-VL-8B, last layer; text-to-image)"
    description = ("Replaces the Qwen3-VL-8B text encoder of Qwen Image 2.1 with pig_clip + a "
                   "token-aligned adapter emitting its last decoder layer before the norm (4096 "
                   "wide); text-to-image.")
    family = "Qwen Image 2.1"
    serves = "Qwen Image 2.1 (text-to-image)"
    teacher_arch = "qwen3_vl"
    teacher_hidden = 4096
    tap_last_layer = True
    tiny_layers = 3
    prefix = SYSTEM_TURN + "<|im_start|>user\n"
    suffix = "<|im_end|>\n<|im_start|>assistant\n"
    start = 14
    start_prefix = SYSTEM_TURN
    default_name = "qwen3vl_qwen_image_2_1_adapter"
    shard_contract = "qwen3vl_qwen_image_2_1/1"
    engine_template = {"file": "diffusion/src/conditioning/conditioner.hpp", "lines": (3051, 3153),
                       "version": "VERSION_QWEN_IMAGE_2_1"}
    teacher_materials = (
        Material("teacher", "Teacher: Qwen Image 2.1's Qwen3-VL-8B (link a local copy)",
                 "hf_snapshot", size_gb=17.5,
                 hint="the Qwen3-VL-8B text encoder folder of the Qwen Image 2.1 release "
                 "(transformers Qwen3-VL, hidden 4096, 36 layers, ~17.5 GB bf16) with its "
                 "tokenizer files"),
    )
    teacher_memory_gib = 17.5
    typical_rows = 14 + 70
    hints = {"train": "Targets: the last Qwen3-VL-8B layer before the norm (4096) of every row; "
                      "rows from 14 reach the DiT.",
             "eval": "Judge by cos_slice against the mean baseline (no reference run)."}
    engine_command_template = (
        "ggk diffuser engine -- --diffusion-model <qwen-image-2.1 DiT .gguf> "
        "--vae <qwen-image vae .gguf> "
        "--llm {student} --llm-adapter {adapter} -p \"a lovely pig holding a sign says GGUF\" "
        "-o out.png")
    engine_teacher_args = "--llm <qwen3vl-8b .gguf>"
    engine_notes = (("Text-to-image only: an edit (--ref-image) needs a vision-ext adapter "
                     "(vision_proj + vis_in), which this version does not train."),)
    export_kv = {"adapter.teacher_tap": "last layer (raw)", "adapter.family": "Qwen Image 2.1"}

    def student_pieces(self, sample, image_tokens=()):
        """3079-3152 without references: system turn + user marker, the range (" " for an
        empty prompt), the assistant tail."""
        return (Piece(self.prefix), Piece(sample.text or " ", prompt=True), Piece(self.suffix))

    def format_prompt(self, text: str) -> str:
        return self.prefix + (text or " ") + self.suffix


PACK = QwenImage21Pack()
