"""Flux.2 klein pack: pig_clip + a 3-tap layerwise adapter replaces the Qwen3 text encoder of
FLUX.2 [klein] (engine-families §2 row 6).

Engine (ggk 0.9.7 conditioner.hpp 3562-3573, VERSION_FLUX2_KLEIN): `<|im_start|>user\\n` + the
prompt range + `<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n`; start 0;
padded to 512 with 151643, masked as keys; out_layers {9, 18, 27}.

Teacher: FLUX.2 [klein] 4B's text encoder is Qwen3-4B (hidden 2560, 36 layers), and its prompt
embeds are the hidden states after layers 9, 18 and 27 concatenated
(https://huggingface.co/latentdivergence/flux2-klein-edit-text, "Finetuned Qwen/Qwen3-4B";
https://www.mintlify.com/OminiX-ai/OminiX-MLX/image/flux-klein: "Qwen3-4B text encoder: 36
layers, 2560 hidden dimensions"). The 9B klein uses a larger Qwen3 (not cited here): link its
snapshot instead and the adapter's width follows the snapshot (3 x its hidden size).
"""

from __future__ import annotations

from gguf_trainer.engine.template_padding import Padding

from .layerwise import LayerwisePack
from .teacher_repos import QWEN3_4B_TEACHER


class Flux2KleinPack(LayerwisePack):
    id = "qwen3_flux2_klein"
    title = "Flux.2 klein (Qwen3-4B, 3 taps)"
    description = (
        "Replaces the Qwen3 text encoder of FLUX.2 [klein] with pig_clip + a layerwise adapter "
        "emitting the 3-layer stack {9, 18, 27}, padded to 512 rows."
    )
    family = "Flux.2 klein"
    serves = "FLUX.2 [klein]"
    teacher_arch = "qwen3"
    taps = (9, 18, 27)
    suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    padding = Padding(min_length=512)
    max_len_student = max_len_teacher = 512  # longer prompts are not padded: keep the DiT's 512
    default_name = "qwen3_flux2_klein_adapter"
    shard_contract = "qwen3_flux2_klein/1"
    engine_template = {
        "file": "diffusion/src/conditioning/conditioner.hpp",
        "lines": (3563, 3573),
        "version": "VERSION_FLUX2_KLEIN",
    }
    teacher_materials = (QWEN3_4B_TEACHER,)
    teacher_memory_gib = 8.0
    typical_rows = 512
    # Every prompt is 512 rows: a smaller demo corpus keeps the tiny run near the others' time.
    demo_settings = {"corpus.n_train": 128, "corpus.n_val": 16}
    hints = {
        "train": "Targets: Qwen3 layers 9, 18, 27 (raw) of all 512 rows, pads included.",
        "eval": "Judge by cos and the per-tap cosines against their mean baselines.",
    }
    engine_command_template = (
        "ggk --diffusion-model <flux2-klein-4b DiT .gguf> --vae pig_flux2_vae_fp32-f16.gguf --llm "
        "{student} "
        '--llm-adapter {adapter} -p "a sheep in sunglasses" --cfg-scale 1 --steps 4 -o out.png'
    )
    # No fixed `adapter.teacher`: the user may link the 9B klein's Qwen3 instead of Qwen3-4B
    # (the docstring), so the export names the snapshot the shards were computed from.
    export_kv = {
        "adapter.teacher_tap": "layers 9,18,27 (raw)",
        "adapter.family": "Flux.2 klein",
    }

    def export_teacher_kv(self, project, ck):
        """The linked teacher: its snapshot identity as the train shards recorded it (the
        sha256 over its files, materials.folder_identity) and the width the adapter learned
        (out_dim / 3 taps); nothing for a mock teacher (adapter.mock_teacher says so)."""
        if ck.get("mock") or project.settings.precompute.mock_teacher:
            return {}
        ident = _recorded_teacher(project)
        if ident is None:
            from gguf_trainer.materials.materials import teacher_identity

            ident = teacher_identity(project)
        snapshot = ident.get("snapshot") if isinstance(ident, dict) else None
        if not isinstance(snapshot, str):
            return {}
        hidden = int((ck.get("config") or {}).get("out_dim") or 0) // len(self.taps)
        width = f", hidden {hidden}" if hidden else ""
        return {"adapter.teacher": f"linked Qwen3 snapshot sha256:{snapshot[:16]}{width}",
                "adapter.teacher_snapshot": snapshot}


def _recorded_teacher(project) -> dict | None:
    """The teacher identity the train shards' manifest recorded (what the adapter learned
    from), or None when there is none readable."""
    from gguf_trainer.base import atomic
    from gguf_trainer.base.paths import MANIFEST_JSON

    try:
        man = atomic.read_json(project.paths.shard_dir("train") / MANIFEST_JSON,
                               inside=project.paths.root)
    except (ValueError, OSError):
        return None
    inputs = man.get("inputs") if isinstance(man, dict) else None
    ident = inputs.get("teacher") if isinstance(inputs, dict) else None
    return ident if isinstance(ident, dict) else None


PACK = Flux2KleinPack()
