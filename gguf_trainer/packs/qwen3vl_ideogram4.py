"""Ideogram 4 pack: pig_clip + a 13-tap layerwise adapter replaces the Qwen3-VL-8B-Instruct text
encoder of Ideogram 4 (engine-families §2 row 15).

Engine (ggk 0.9.7 conditioner.hpp 3383-3390): `<|im_start|>user\\n` + the prompt +
`<|im_end|>\\n<|im_start|>assistant\\n` with NO prompt range (`{0, 0}`): the whole template is
tokenized as one piece and weight syntax is text; start 0; no pads; out_layers {1, 4, ..., 34, 36}
(the DiT's llm_features_dim 53248 = 13 x 4096).

Teacher: Qwen3-VL-8B-Instruct (hidden 4096, 36 layers), "used in text-only mode", 13 layers
concatenated (https://github.com/ideogram-oss/ideogram4/blob/main/docs/pipeline.md). The
engine's taps are its own reading of those layers (1-based decoder outputs, 36 = before the norm).
"""

from __future__ import annotations

from .layerwise import LayerwisePack
from .teacher_repos import QWEN3VL_8B, QWEN3VL_8B_TEACHER


class Ideogram4Pack(LayerwisePack):
    id = "qwen3vl_ideogram4"
    title = "Ideogram 4 (Qwen3-VL-8B, 13 taps)"
    description = (
        "Replaces the Qwen3-VL-8B-Instruct text encoder of Ideogram 4 with pig_clip + a "
        "layerwise adapter emitting the 13-layer stack {1, 4, ..., 34, 36} (53248 wide)."
    )
    family = "Ideogram 4"
    serves = "Ideogram 4"
    taps = (1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 34, 36)
    teacher_hidden = 4096
    one_piece = True
    default_name = "qwen3vl_ideogram4_adapter"
    shard_contract = "qwen3vl_ideogram4/1"
    engine_template = {
        "file": "diffusion/src/conditioning/conditioner.hpp",
        "lines": (3384, 3390),
        "version": "VERSION_IDEOGRAM4",
    }
    teacher_materials = (QWEN3VL_8B_TEACHER,)
    teacher_memory_gib = 17.0
    typical_rows = 70
    hints = {
        "train": "Targets: 13 raw Qwen3-VL-8B layers per token (53248 features).",
        "eval": "Judge by cos and the per-tap cosines against their mean baselines.",
    }
    engine_command_template = (
        "ggk --diffusion-model <ideogram4 DiT .gguf> --vae <ideogram4 VAE .gguf> --llm {student} "
        '--llm-adapter {adapter} -p "a sheep in sunglasses" -o out.png'
    )
    export_kv = {
        "adapter.teacher": QWEN3VL_8B,
        "adapter.teacher_tap": "layers 1,4,...,34,36 (raw)",
        "adapter.family": "Ideogram 4",
    }


PACK = Ideogram4Pack()
