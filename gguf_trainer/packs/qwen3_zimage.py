"""Z-Image pack: pig_clip + a token-aligned adapter replaces the Qwen3-4B text encoder of Z-Image
(engine-families §2 row 4).

Engine (ggk 0.9.7 conditioner.hpp 3422-3442, `sd_version_is_z_image`): `<|im_start|>user\\n` + the
prompt range + `<|im_end|>\\n<|im_start|>assistant\\n`; start 0 (every row reaches the DiT); no
pads; out_layers {35}: the RAW output of decoder layer 35 of 36, i.e. transformers'
hidden_states[-2], before the final norm (llm.hpp 1779-1815; the engine's own comment "-2").
The Omni branch (reference images, conditioner.hpp 3426-3433) is not served: it indexes a
never-filled range vector (engine-families §2 row 4), so this pack is text-to-image only and
exports no vision tensors.

Teacher: Z-Image-Turbo's text_encoder is a transformers Qwen3 of Qwen3-4B's shape (hidden 2560,
36 layers, vocab 151936; https://huggingface.co/smartdigitalnetworks/Z-Image-Turbo/blob/main/
text_encoder/config.json, a duplicate of Tongyi-MAI/Z-Image-Turbo), and Z-Image-Turbo and
FLUX.2-klein-4B "ship identical Qwen3-4B weights, tokenizer and chat template" with Z-Image
reading hidden_states[-2], (n, 2560) (https://huggingface.co/cukrus/qwen3-4b-remote-text-encoder).
Z-Image-Turbo runs 9 steps (https://www.mintlify.com/OminiX-ai/OminiX-MLX/image/zimage: "9-step
turbo inference"), the command's --steps. The snapshot is therefore Qwen/Qwen3-4B, as for the Flux.2
klein pack; linking the text_encoder folder of Tongyi-MAI/Z-Image-Turbo (with its tokenizer files
beside it) works the same.
"""

from __future__ import annotations

from .teacher_repos import QWEN3_4B, QWEN3_4B_TEACHER
from .token_aligned_qwen import QwenTokenAlignedPack


class ZImagePack(QwenTokenAlignedPack):
    id = "qwen3_zimage"
    title = "Z-Image (Qwen3-4B, layer 35)"
    description = (
        "Replaces the Qwen3-4B text encoder of Z-Image with pig_clip + a token-aligned adapter "
        "emitting the raw layer-35 state of every template token (2560 wide)."
    )
    family = "Z-Image"
    serves = "Z-Image, Z-Image-Turbo (text-to-image)"
    teacher_arch = "qwen3"
    teacher_taps = (35,)
    tiny_layers = 36  # layer 35 is not the last one, as in Qwen3-4B
    prefix = "<|im_start|>user\n"
    suffix = "<|im_end|>\n<|im_start|>assistant\n"
    start = 0
    default_name = "qwen3_zimage_adapter"
    shard_contract = "qwen3_zimage/1"
    engine_template = {
        "file": "diffusion/src/conditioning/conditioner.hpp",
        "lines": (3423, 3442),
        "version": "VERSION_Z_IMAGE",
    }
    teacher_materials = (QWEN3_4B_TEACHER,)
    teacher_memory_gib = 8.0
    typical_rows = 10 + 60
    hints = {
        "train": "Targets: Qwen3-4B layer 35 (raw, 2560) of every template row.",
        "eval": "Judge by cos_slice against the mean baseline (no reference run).",
    }
    engine_command_template = (
        "ggk diffuser engine -- --diffusion-model <z-image-turbo DiT .gguf> --vae <flux ae .gguf> "
        '--llm {student} --llm-adapter {adapter} -p "a lovely pig holding a sign says GGUF" '
        "--cfg-scale 1.0 --steps 9 --diffusion-fa -o out.png"
    )
    engine_teacher_args = "--llm <qwen3-4b .gguf>"
    engine_notes = (
        "Text-to-image only: the Omni (reference image) branch is not served by an adapter.",
    )
    export_kv = {
        "adapter.teacher": QWEN3_4B,
        "adapter.teacher_tap": "layer 35 (raw)",
        "adapter.family": "Z-Image",
    }


PACK = ZImagePack()
