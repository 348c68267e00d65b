"""FLUX.3 Klein pack: pig_clip + an 8-tap layerwise adapter replaces the Qwen3-VL-4B-Instruct text
encoder of FLUX.3 Image Klein (engine-families §2 row 17).

Engine (ggk 0.9.7 conditioner.hpp 3549-3561): `<|im_start|>user\\n` + the prompt range +
`<|im_end|>\\n<|im_start|>assistant\\n`; start 0; max_length 4096; out_layers {4, 8, ..., 32};
`tokenize` pads to the next multiple of 80 (2610-2612) and every pad sits at rope position 1 on
every axis, masked as a key (2698-2712), for the student as for the 4B. The engine's abort message
and README name this pack and its file `pig_qwen3vl_4b_it_adapter-f16.gguf` (2826-2829).

Teacher: Qwen3-VL-4B (hidden 2560, 36 layers; conditioner.hpp 3550, the README's
`qwen3vl-4b-it` GGUF); the right padding to a multiple of 80 with pads at a fixed position is also
NVIDIA NeMo's FLUX.3 text encoding
(https://docs.nvidia.com/nemo/automodel/nemo-automodel/nemo_automodel/components/models/flux3/text_encoding).
"""

from __future__ import annotations

from gguf_trainer.engine.template_padding import Padding

from .layerwise import LayerwisePack
from .teacher_repos import QWEN3VL_4B, QWEN3VL_4B_TEACHER


class Flux3Pack(LayerwisePack):
    id = "qwen3vl_flux3"
    title = "FLUX.3 Klein (Qwen3-VL-4B, 8 taps)"
    description = (
        "Replaces the Qwen3-VL-4B-Instruct text encoder of FLUX.3 Image Klein with pig_clip + a "
        "layerwise adapter emitting the 8-layer stack {4, 8, ..., 32}, pads included."
    )
    family = "FLUX.3 Klein"
    serves = "FLUX.3 Image Klein"
    taps = (4, 8, 12, 16, 20, 24, 28, 32)
    padding = Padding(multiple=80, max_length=4096, pad_position=1)
    max_len_student = max_len_teacher = 4096
    default_name = "qwen3vl_4b_it_adapter"  # pig_qwen3vl_4b_it_adapter-f16.gguf
    shard_contract = "qwen3vl_flux3/1"
    engine_template = {
        "file": "diffusion/src/conditioning/conditioner.hpp",
        "lines": (3550, 3561),
        "version": "VERSION_FLUX3",
    }
    teacher_materials = (QWEN3VL_4B_TEACHER,)
    teacher_memory_gib = 9.0
    typical_rows = 80
    hints = {
        "train": "Targets: 8 raw Qwen3-VL-4B layers per row, the pads to a multiple of 80 included "
        "(at rope position 1, as the engine runs them).",
        "eval": "Judge by cos and the per-tap cosines against their mean baselines.",
    }
    engine_command_template = (
        "ggk --diffusion-model flux3-image-klein-nvfp4.gguf --vae pig_flux2_vae_fp32-f16.gguf "
        '--llm {student} --llm-adapter {adapter} -p "a sheep in sunglasses" --cfg-scale 1 --steps '
        '4 '
        "-o out.png"
    )
    engine_notes = (
        "Needs ggk 0.9.5+; --prompt-upsampler qwen3.5-9b-q4_k_m.gguf combines with it.",
    )
    min_ggk = "0.9.5"
    export_kv = {
        "adapter.teacher": QWEN3VL_4B,
        "adapter.teacher_tap": "layers 4,8,...,32 (raw)",
        "adapter.family": "FLUX.3 Klein",
    }


PACK = Flux3Pack()
