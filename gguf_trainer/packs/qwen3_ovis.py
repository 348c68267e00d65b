"""Ovis-Image pack: pig_clip + a token-aligned adapter replaces the Qwen3 text encoder of
Ovis-Image (engine-families §2 row 5).

Engine (ggk 0.9.7 conditioner.hpp 3586-3596, VERSION_OVIS_IMAGE): the fixed user text
`<|im_start|>user\\nDescribe the image by detailing the color, quantity, text, shape, size,
texture, spatial relationships of the objects and background:`, then the prompt range
` ` + the prompt (the space belongs to the range, so it is parsed and tokenized with the prompt),
then `<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n`; start 28 (hard-coded: the
fixed text is 29 tokens, so its last token reaches the DiT); min_length 28 + 256 = 284: padded
on the right with 151643 to 284 ids, masked as keys (template_padding.py); no out_layers: the
DiT reads the teacher's final norm.

Teacher: Ovis-Image-7B = the Ovis2.5-2B multimodal backbone's Qwen3 text stack + a 7B DiT
(https://huggingface.co/AIDC-AI/Ovis-Image-7B, named in diffusers docs/source/en/api/pipelines/
ovis_image.md). No citable public repo id holds that text encoder as a standalone Qwen3 snapshot,
so the pack declares "link a local copy": the text encoder folder of the Ovis-Image-7B release
(a transformers Qwen3, the width the DiT's txt_in reads; ~2 B parameters, ~4 GB in bf16) with
its tokenizer files beside config.json. The adapter's width follows the snapshot.
"""

from __future__ import annotations

from gguf_trainer.engine.template_padding import Padding
from gguf_trainer.materials.spec import Material

from .token_aligned_qwen import QwenTokenAlignedPack

OVIS_PREFIX = (
    "<|im_start|>user\nDescribe the image by detailing the color, quantity, text, shape, size, "
    "texture, spatial relationships of the objects and background:"
)


class OvisImagePack(QwenTokenAlignedPack):
    id = "qwen3_ovis"
    title = "Ovis-Image (its Qwen3, final norm)"
    description = (
        "Replaces the Qwen3 text encoder of Ovis-Image with pig_clip + a token-aligned adapter "
        "emitting its final-norm state of every row, padded to 284 rows."
    )
    family = "Ovis-Image"
    serves = "Ovis-Image-7B"
    teacher_arch = "qwen3"
    teacher_hidden = 2048
    teacher_taps = ()  # the final norm
    prefix = OVIS_PREFIX
    suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    start = 28
    padding = Padding(min_length=284)
    # longer prompts are not padded: keep the DiT's 256 + 28
    max_len_student = max_len_teacher = 284
    default_name = "qwen3_ovis_adapter"
    shard_contract = "qwen3_ovis/1"
    engine_template = {
        "file": "diffusion/src/conditioning/conditioner.hpp",
        "lines": (3587, 3596),
        "version": "VERSION_OVIS_IMAGE",
    }
    teacher_materials = (
        Material(
            "teacher",
            "Teacher: Ovis-Image's Qwen3 text encoder (link a local copy)",
            "hf_snapshot",
            size_gb=4.1,
            hint="the Qwen3 text encoder folder of AIDC-AI/Ovis-Image-7B (transformers "
            "Qwen3, ~2 B parameters, ~4 GB bf16) with tokenizer.json, "
            "tokenizer_config.json, vocab.json "
            "and merges.txt beside its config.json",
        ),
    )
    teacher_memory_gib = 4.0
    typical_rows = 284
    hints = {
        "train": "Targets: the Qwen3 final norm of all 284 rows, pads included "
        "(rows from 28 reach the DiT).",
        "eval": "Judge by cos_slice against the mean baseline (no reference run).",
    }

    def student_pieces(self, sample, image_tokens=()):
        """3589-3596: the fixed text, the range ` ` + prompt (parsed), the assistant tail."""
        from gguf_trainer.engine.template_ids import Piece

        return (Piece(self.prefix), Piece(" " + sample.text, prompt=True), Piece(self.suffix))

    def format_prompt(self, text: str) -> str:
        return self.prefix + " " + text + self.suffix

    engine_command_template = (
        "ggk diffuser engine -- --diffusion-model <ovis-image-7b DiT .gguf> --vae <flux ae .gguf> "
        '--llm {student} --llm-adapter {adapter} -p "a neon sign that says GGUF" -o out.png'
    )
    engine_teacher_args = "--llm <the Ovis-Image Qwen3 text encoder .gguf>"
    export_kv = {"adapter.teacher_tap": "final norm", "adapter.family": "Ovis-Image"}


PACK = OvisImagePack()
