"""SeFi-Image pack: pig_clip + a 3-tap layerwise adapter replaces the Qwen3-VL text encoder of
SeFi-Image (engine-families §2 row 16).

Engine (ggk 0.9.7 conditioner.hpp 3574-3585): `<|im_start|>user\\n` + the prompt range +
`<|im_end|>\\n<|im_start|>assistant\\n`; start 0; padded to 1024 with 151643, masked as keys;
out_layers {9, 18, 27}.

Teacher: SeFi-Image ships its own Qwen3-VL-XB-Instruct text encoder inside its gated repos
(https://huggingface.co/SeFi-Image; stable-diffusion.cpp docs/sefi_image.md converts
`<hf_repo_dir>/Qwen3-VL-XB-Instruct`, the 2B one for the 1B / 2B scales and the 4B one for the
5B scale). No citable public repo id holds it alone, so the pack declares "link a local copy":
the Qwen3-VL-XB-Instruct folder of the SeFi-Image release you use (Qwen3-VL-2B: hidden 2048, 28
layers; Qwen3-VL-4B: hidden 2560, 36 layers). The adapter's width follows the snapshot.
"""

from __future__ import annotations

from gguf_trainer.engine.template_padding import Padding
from gguf_trainer.materials.spec import Material

from .layerwise import LayerwisePack


class SeFiPack(LayerwisePack):
    id = "qwen3vl_sefi"
    title = "SeFi-Image (its Qwen3-VL, 3 taps)"
    description = (
        "Replaces the Qwen3-VL text encoder of SeFi-Image with pig_clip + a layerwise adapter "
        "emitting the 3-layer stack {9, 18, 27}, padded to 1024 rows."
    )
    family = "SeFi-Image"
    serves = "SeFi-Image 1B / 2B / 5B (the scale whose Qwen3-VL you link)"
    taps = (9, 18, 27)
    padding = Padding(min_length=1024)
    max_len_student = max_len_teacher = 1024
    default_name = "qwen3vl_sefi_adapter"
    shard_contract = "qwen3vl_sefi/1"
    engine_template = {
        "file": "diffusion/src/conditioning/conditioner.hpp",
        "lines": (3575, 3585),
        "version": "VERSION_SEFI_IMAGE",
    }
    teacher_materials = (
        Material(
            "teacher",
            "Teacher: SeFi-Image's Qwen3-VL-XB-Instruct (link a local copy)",
            "hf_snapshot",
            size_gb=8.9,
            hint="the Qwen3-VL-XB-Instruct folder inside the gated SeFi-Image repo "
            "(Qwen3-VL-2B: hidden 2048, 28 layers, ~4.3 GB; Qwen3-VL-4B: hidden "
            "2560, 36 layers, ~8.9 GB)",
        ),
    )
    teacher_memory_gib = 9.0
    typical_rows = 1024
    # Every prompt is 1024 rows through teacher and student: a smaller demo corpus keeps the
    # tiny run near the others' time.
    demo_settings = {"corpus.n_train": 64, "corpus.n_val": 16}
    hints = {
        "train": "Targets: Qwen3-VL layers 9, 18, 27 (raw) of all 1024 rows, pads included.",
        "eval": "Judge by cos and the per-tap cosines against their mean baselines.",
    }
    engine_command_template = (
        "ggk --diffusion-model <sefi DiT .gguf> --vae pig_flux2_vae_fp32-f16.gguf --llm {student} "
        '--llm-adapter {adapter} -p "a photograph of an orange tabby cat sitting on a couch" '
        "--cfg-scale 1.0 --steps 4 -W 1024 -H 1024 --diffusion-fa -o out.png"
    )
    engine_notes = ("Turbo: --cfg-scale 1 --steps 4; Base / RL: --cfg-scale 4 --steps 50.",)
    export_kv = {"adapter.teacher_tap": "layers 9,18,27 (raw)", "adapter.family": "SeFi-Image"}


PACK = SeFiPack()
