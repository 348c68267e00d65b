"""Krea2 and Iris-3B pack: pig_clip + a 12-tap layerwise adapter replaces the Qwen3-VL-4B-Instruct
text encoder (engine-families §2 rows 13-14).

Engine (ggk 0.9.7 conditioner.hpp 3295-3305, Krea2): the Qwen-Image text-to-image system prompt,
the prompt range, `<|im_end|>\\n<|im_start|>assistant\\n`; start 34 (the prefix's tokens); no pads;
out_layers {2, 5, ..., 35}. Iris-3B (3656-3673) taps the same layers with the same prefix, cuts the
body to 300 tokens and zero-pads rows after the adapter, so the one adapter serves both; the
engine's abort message names the file `pig_qwen3vl_layerwise_adapter-f16.gguf` (2824-2825).

Teacher: Qwen3-VL-4B (hidden 2560, 36 layers), the engine's own words at 3656-3657; Krea's
reference encoder loads `Qwen3VLForConditionalGeneration` with these taps and the 34-row prefix
(https://raw.githubusercontent.com/krea-ai/krea-2/main/encoder.py). The snapshot is the
Instruct release the engine's Qwen3-VL-4B GGUFs come from (`qwen3vl-4b-it-*`, ggk README).
"""

from __future__ import annotations

from .layerwise import LayerwisePack
from .teacher_repos import QWEN3VL_4B, QWEN3VL_4B_TEACHER

KREA2_PREFIX = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
    "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
    "<|im_start|>user\n"
)


class Krea2Pack(LayerwisePack):
    id = "qwen3vl_krea2"
    title = "Krea2 / Iris-3B (Qwen3-VL-4B, 12 taps)"
    description = (
        "Replaces the Qwen3-VL-4B-Instruct text encoder of Krea2 and Iris-3B with pig_clip + a "
        "layerwise adapter emitting the 12-layer stack {2, 5, ..., 35}."
    )
    family = "Krea2"
    serves = "Krea2, Iris-3B"
    taps = (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35)
    prefix = KREA2_PREFIX
    start = 34
    default_name = "qwen3vl_layerwise_adapter"  # exported as pig_qwen3vl_layerwise_adapter-f16.gguf
    shard_contract = "qwen3vl_krea2/1"
    engine_template = {
        "file": "diffusion/src/conditioning/conditioner.hpp",
        "lines": (3296, 3305),
        "version": "VERSION_KREA2",
    }
    teacher_materials = (QWEN3VL_4B_TEACHER,)
    teacher_memory_gib = 9.0
    typical_rows = 34 + 60
    hints = {
        "train": "Targets: 12 raw Qwen3-VL-4B layers per token (rows from 34 reach the DiT).",
        "eval": "Judge by cos_slice and the per-tap cosines against their mean baselines.",
    }
    engine_command_template = (
        "ggk --diffusion-model krea2_turbo-q2_k.gguf --vae pig_wan_vae_fp32-f16.gguf --llm "
        "{student} "
        '--llm-adapter {adapter} -p "a lovely pig holding a sign says GGUF" --cfg-scale 1.00 '
        '--steps 8 '
        "--diffusion-fa -o out.png"
    )
    engine_notes = ("Iris-3B takes the same file: swap the --diffusion-model for the Iris-3B DiT.",)
    export_kv = {
        "adapter.teacher": QWEN3VL_4B,
        "adapter.teacher_tap": "layers 2,5,...,35 (raw)",
        "adapter.family": "Krea2, Iris-3B",
    }


PACK = Krea2Pack()
