"""LLaDA-Image-Turbo pack (the trainer8 recipe): pig_clip + a seedless 256-query resampler
replaces the 16B LLaDA2-MoE text stack; targets are the QueryFormer rows after the
6-layer text_projection, [256, 2560] per prompt. Engine facts: engine-contract §3.6."""

from __future__ import annotations

from pathlib import Path

from gguf_trainer.engine.prompt_syntax import engine_text
from gguf_trainer.engine.template_ids import Piece
from gguf_trainer.materials.spec import Material

from .base import TrainerPack, Verdict

# The engine's template (conditioner.hpp 3444-3464, LLMEmbedder::get_learned_condition, LLaDA):
# the prefix, " " + the prompt as the prompt range (the space belongs to it), the suffix;
# the empty prompt is one piece ending "image." with no prompt range.
HUMAN = "<role>HUMAN</role> Generate an image"
ASSISTANT = "\n<role>ASSISTANT</role>\n<IMAGE1>"


class LLaDAImagePack(TrainerPack):
    id = "llada_image"
    title = "LLaDA-Image-Turbo"
    description = ("Replaces the LLaDA2-MoE text stack with pig_clip + a 256-query resampler; "
                   "the adapter is text-only and pairs with the SigVQ vision encoder for editing.")
    adapter_kind = "resampler"
    engine_template = {"file": "diffusion/src/conditioning/conditioner.hpp", "lines": (3444, 3464),
                       "version": "VERSION_LLADA_IMAGE"}
    out_dim = 2560
    num_queries = 256
    default_name = "llada_adapter"
    shard_contract = "llada_image/3"
    max_len_student = 512
    max_len_teacher = 2048 + 256  # 2048 text tokens (anchor-trainer §4.1) + the 256 queries
    headline = "cos_centered"  # plain cosine reads ~0.99 even for a zero prediction
    centered = True
    standardized = True
    eval_keys = ("cos_centered", "rel_mse", "cos", "cos_rms", "worst_row_cos", "worst_sample_cos",
                 "roundtrip_cos", "baseline_cos_centered")
    teacher_materials = (
        Material(
            "teacher",
            "Teacher: LLaDA-Image-Turbo (text encoder, QueryFormer, text_projection)",
            "hf_snapshot",
            repo="inclusionAI/LLaDA-Image-Turbo",
            subdir="LLaDA-Image-Turbo",
            size_gb=33.0,
            patterns=(
                "model_index.json",
                "text_encoder/*",
                "queryformer/*",
                "text_projection/*",
                "tokenizer/*",
            ),
        ),
    )
    # Its own folder: a file added to the teacher's folder would change the teacher's identity.
    optional_materials = (
        Material(
            "sigvq",
            "SigVQ vision encoder (for editing)",
            "hf_snapshot",
            repo="inclusionAI/LLaDA-Image-Turbo",
            subdir="LLaDA-Image-Turbo-sigvq",
            size_gb=2.4,
            patterns=("sigvq/*",),
            required=False,
            wanted_when="export.export_sigvq",
        ),
    )
    defaults = {
        "corpus.n_train": 60000,
        "corpus.n_val": 1024,
        "corpus.empty_frac": 0.01,
        "precompute.shard_size": 1024,
        "precompute.val_shard_size": 512,
        "train.width": 1024,
        "train.depth": 6,
        "train.steps": 20000,
        "train.batch_size": 32,
        "train.lr": 2e-4,
        "train.warmup": 1000,
        "train.sigma_floor": 0.03,
        "export.export_sigvq": True,
    }
    hints = {
        "train": "Reference: val centred cosine 0.965 / rel_mse 0.0024 (RTX "
                 "5090, ~55 min of training).",
        "eval": "Judge by val centred cosine and rel_mse; >= 0.96 is healthy, ~0.87 means a "
                "broken-RoPE teacher.",
    }
    teacher_memory_gib = 34.0
    teacher_offload = "split"  # offload = an accelerate device map: the card's budget, then RAM
    # the backbone is the snapshot's own Python: trust records, teachers/trust.py
    remote_code = True
    verdict = Verdict("cos_centered", 0.96, 0.92, "~0.87 is the broken-RoPE teacher signature")
    check_default_for_kind = True  # `check` reads a resampler naming no pack as LLaDA's
    health_after_steps = 2000  # early in a run every adapter is under the floor
    health_early_hint = "a centred cosine near 0.87 is the broken-RoPE teacher signature"
    health_reference = "val centred cosine 0.965 / rel_mse 0.0024 (RTX 5090 run)"
    reference = {
        "val cos_centered": 0.965,
        "rel_mse": 0.0024,
        "run": "RTX 5090, ~55 min of training",
        "broken-RoPE signature": "~0.87 centred cosine",
    }
    min_ggk = "0.5.7"
    engine_command_template = (
        "ggk diffuser engine -- --diffusion-model LLaDA-image-turbo-nvfp4.gguf "
        "--vae pig_flux2_vae_fp32-f16.gguf --llm {student} --llm-adapter {adapter}{vision} "
        '-p "a sheep in sunglasses" --cfg-scale 1.0 '
        "--steps 4 --sampling-method euler --diffusion-fa -o out.png"
    )
    vision_args = " --llm_vision {sigvq} --ref-image sheep.png"  # editing; text-to-image without
    export_kv = {
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.target": "llada_image_turbo text_projection query rows",
        "adapter.teacher": "inclusionAI/LLaDA-Image-Turbo",
    }
    bytes_per_sample = 256 * 2560 * 2 + 60 * 1024 * 2
    demo_settings = {"corpus.n_train": 128}  # 256 × 2560 target rows a prompt: a smaller corpus

    def format_prompt(self, text: str) -> str:
        """The released pipeline's string (LLaDAImagePipeline._encode_text), which the teacher
        tokenizes whole with its own tokenizer: the prompt's weight chunks joined (the pipeline
        has no weight syntax; the engine scales rows by the weights afterwards), stripped, and
        "" -> "... image." as in the engine."""
        text = engine_text(text).strip()
        return f"{HUMAN}: {text}{ASSISTANT}" if text else f"{HUMAN}.{ASSISTANT}"

    def student_pieces(self, sample, image_tokens=()):
        """The engine's pieces: the prompt is not stripped (only "" takes the empty form)."""
        if not sample.text:
            return (Piece(f"{HUMAN}.{ASSISTANT}"),)
        return (Piece(f"{HUMAN}:"), Piece(" " + sample.text, prompt=True), Piece(ASSISTANT))

    def engine_command(self, student="<pig_clip.gguf>", adapter="<adapter.gguf>", extras=None):
        """With a real adapter path, `--llm_vision` names its SigVQ companion only when that
        file exists (text-to-image works without it); with placeholders it is always shown."""
        import shlex

        from gguf_trainer.model.sigvq_export import sigvq_file_for

        sigvq = (extras or {}).get("sigvq")
        if sigvq is None and adapter.startswith("<"):
            sigvq = "<pig_llada_sigvq-f16.gguf>"
        elif sigvq is None:
            companion = sigvq_file_for(shlex.split(adapter)[0])
            sigvq = shlex.quote(str(companion)) if companion.is_file() else None
        vision = self.vision_args.format(sigvq=sigvq) if sigvq else ""
        return self.engine_command_template.format(student=student, adapter=adapter, vision=vision)

    def load_teacher(self, materials, plan, device):
        """LLaDA2-MoE (remote code, after the trust check) + QueryFormer + TextProjection, the
        backbone placed by the plan: all on `device` when resident or on the CPU, otherwise an
        accelerate device map (the chosen GPU up to its budget, the other GPUs, then CPU RAM,
        or balanced) computed on the meta device before any weight loads."""
        from ..teachers.llada import load_llada_teacher, plan_backbone, plan_budgets

        root = materials["teacher"]
        budgets = plan_budgets(plan, device)
        device_map = plan_backbone(root, budgets, plan.placement) if budgets else None
        return load_llada_teacher(
            root,
            format_prompt=self.format_prompt,
            device=device,
            device_map=device_map,
            max_len=self.max_len_teacher - self.num_queries,
        )

    def teacher_gib(self, materials, device):
        """Its weights (stored bf16) at the compute dtype: bf16 on CUDA, fp32 elsewhere; read
        from the header check, so a snapshot that would fail is refused before anything loads."""
        from ..teachers.llada import weights_gib

        return weights_gib(materials["teacher"], device, self.num_queries, self.out_dim)

    def check_teacher(self, materials) -> str:
        """Header-only check of the snapshot (the config.json files, the safetensors headers of
        queryformer/ and text_projection/, the text encoder's weight index; no weight read, none
        of its code imported): its summary, or a UserError naming the file and the reason."""
        from ..teachers.llada_layout import check_snapshot

        return check_snapshot(materials["teacher"], self.num_queries, self.out_dim).summary()

    def demo_materials(self, folder):
        """The tiny LLaDA-like snapshot shipped with the package (real remote code, MoE, the
        transformers-5 traps) and a tiny SigVQ; the demo trusts its own shipped code."""
        import logging

        from ..teachers import trust
        from ..tiny.llada import copy_tiny_llada, copy_tiny_sigvq

        teacher = copy_tiny_llada(folder / "LLaDA-Image-Turbo", with_sigvq=False)
        sigvq = copy_tiny_sigvq(folder / "LLaDA-Image-Turbo-sigvq")
        trust.confirm_trust(teacher)
        logging.getLogger(__name__).warning(  # a trust decision made for the user: always shown
            "demo: trusted the remote code of the tiny LLaDA teacher "
            "shipped with gguf-trainer (%s)",
            teacher,
        )
        return {"teacher": teacher, "sigvq": sigvq}

    def write_companions(self, project, adapter_path, may_write=None):
        """The SigVQ companion `<base>_sigvq-f16.gguf` next to the adapter (rebuilt only when
        its source is newer); none, said in one line, when it is off or not downloaded."""
        import logging

        from gguf_trainer.model.sigvq_export import (
            SOURCE,
            sigvq_file_for,
            source_in,
            write_sigvq_gguf,
        )

        if not project.settings.export.export_sigvq:
            return []
        source = source_in(project.material_path("sigvq"))
        if source is None:
            logging.getLogger(__name__).info(
                "export: no SigVQ companion (%s is not downloaded); the ggk "
                "command leaves --llm_vision "
                "out: text-to-image works, editing needs the sigvq material",
                SOURCE,
            )
            return []
        dest = sigvq_file_for(adapter_path)
        if may_write is not None:
            may_write(Path(dest))
        return [Path(write_sigvq_gguf(source, dest)["path"])]

    def build_mock_teacher(self, project):
        from .mock import MockQueryTeacher

        return MockQueryTeacher(self.id, self.num_queries, self.out_dim)


PACK = LLaDAImagePack()
