"""LLaDA-Image-Turbo pack (the trainer8 recipe): pig_clip + a seedless 256-query resampler
replaces the 16B LLaDA2-MoE text stack; targets are the QueryFormer rows after the
6-layer text_projection, [256, 2560] per prompt. Engine facts: engine-contract §3.6."""

from __future__ import annotations

from .base import Material, TrainerPack

HUMAN = "<role>HUMAN</role> Generate an image"
ASSISTANT = "\n<role>ASSISTANT</role>\n<IMAGE1>"


class LLaDAImagePack(TrainerPack):
    id = "llada_image"
    title = "LLaDA-Image-Turbo"
    description = ("Replaces the LLaDA2-MoE text stack with pig_clip + a 256-query resampler; "
                   "the adapter is text-only and pairs with the SigVQ vision encoder for editing.")
    adapter_kind = "resampler"
    out_dim = 2560
    num_queries = 256
    default_name = "llada_adapter"
    shard_contract = "llada_image/3"
    max_len_student = 512
    headline = "cos_centered"  # plain cosine reads ~0.99 even for a zero prediction
    centered = True
    standardized = True
    eval_keys = ("cos_centered", "rel_mse", "cos", "cos_rms", "worst_row_cos", "worst_sample_cos",
                 "roundtrip_cos", "baseline_cos_centered")
    teacher_materials = (
        Material("teacher", "Teacher: LLaDA-Image-Turbo (text encoder, QueryFormer, text_projection)",
                 "hf_snapshot", repo="inclusionAI/LLaDA-Image-Turbo", subdir="LLaDA-Image-Turbo",
                 size_gb=33.0, patterns=("model_index.json", "text_encoder/*", "queryformer/*",
                                         "text_projection/*", "tokenizer/*")),
        Material("sigvq", "SigVQ vision encoder (for editing)", "hf_snapshot",
                 repo="inclusionAI/LLaDA-Image-Turbo", subdir="LLaDA-Image-Turbo-sigvq",
                 size_gb=2.4, patterns=("sigvq/*",), required=False),
    )
    defaults = {
        "corpus.n_train": 60000, "corpus.n_val": 1024, "corpus.empty_frac": 0.01,
        "precompute.shard_size": 1024, "precompute.val_shard_size": 512,
        "train.width": 1024, "train.depth": 6, "train.steps": 20000, "train.batch_size": 32,
        "train.lr": 2e-4, "train.warmup": 1000, "train.sigma_floor": 0.03,
        "export.export_sigvq": True,
    }
    hints = {
        "train": "Reference: val centred cosine 0.965 / rel_mse 0.0024 (RTX 5090, ~55 min of training).",
        "eval": "Judge by val centred cosine and rel_mse; >= 0.96 is healthy, ~0.87 means a broken-RoPE teacher.",
    }
    teacher_memory_gib = 34.0
    min_ggk = "0.5.7"
    engine_command_template = (
        "ggk diffuser engine -- --diffusion-model LLaDA-image-turbo-nvfp4.gguf "
        "--vae pig_flux2_vae_fp32-f16.gguf --llm {student} --llm-adapter {adapter} "
        "--llm_vision {sigvq} --ref-image sheep.png -p \"a sheep in sunglasses\" --cfg-scale 1.0 "
        "--steps 4 --sampling-method euler --diffusion-fa -o out.png")
    export_kv = {
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.target": "llada_image_turbo text_projection query rows",
        "adapter.teacher": "inclusionAI/LLaDA-Image-Turbo",
    }
    bytes_per_sample = 256 * 2560 * 2 + 60 * 1024 * 2

    def format_prompt(self, text: str) -> str:
        text = text.strip()
        return f"{HUMAN}: {text}{ASSISTANT}" if text else f"{HUMAN}.{ASSISTANT}"

    def engine_command(self, student="<pig_clip.gguf>", adapter="<adapter.gguf>", extras=None):
        extras = {"sigvq": "<pig_llada_sigvq-f16.gguf>", **(extras or {})}
        return super().engine_command(student, adapter, extras)

    def build_mock_teacher(self, project):
        from .mock import MockQueryTeacher

        return MockQueryTeacher(self.id, self.num_queries, self.out_dim)


PACK = LLaDAImagePack()
