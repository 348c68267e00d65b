"""MageFlow-Edit pack (the trainer5 recipe): pig_clip + a token-aligned adapter with a
vision extension replaces the Qwen3-VL-4B-Instruct text stack. Targets: the teacher's
final-norm state of every token. Engine facts: engine-contract §3.2."""

from __future__ import annotations

from .base import Material, TrainerPack

# Copied exactly from the engine (engine-contract §3.2); token counts are checked in tests.
EDIT_PREFIX = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
    "objects, background), then explain how the user's text instruction should alter or modify the "
    "image. Generate a new image that meets the user's requirements while maintaining consistency "
    "with the original input where appropriate.<|im_end|>\n<|im_start|>user\n")
T2I_PREFIX = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, "
    "text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
EDIT_START = 64
T2I_START = 34
IMAGE_HEADER_TOKENS = 6  # "Image i: <|vision_start|>"


class MageFlowPack(TrainerPack):
    id = "qwen3vl_mageflow"
    title = "MageFlow-Edit (Qwen3-VL-4B)"
    description = ("Replaces the Qwen3-VL-4B-Instruct text stack with pig_clip + a token-aligned "
                   "adapter with a vision extension; pairs with the unchanged mmproj for editing.")
    adapter_kind = "token_aligned_vision"
    out_dim = 2560
    vis_dim = 2560
    default_name = "qwen3vl_4b_adapter"
    shard_contract = "qwen3vl_mageflow/2"
    max_len_student = 1024
    headline = "cos"  # token-weighted over supervised tokens
    eval_keys = ("cos", "cos_slice", "cos_vis", "cos_txt", "rel_mse", "worst_sample_cos",
                 "roundtrip_cos", "baseline_cos")
    teacher_materials = (
        Material("teacher", "Teacher: Qwen3-VL-4B-Instruct", "hf_snapshot", repo="Qwen/Qwen3-VL-4B-Instruct",
                 subdir="Qwen3-VL-4B-Instruct", size_gb=8.3,
                 patterns=("config.json", "generation_config.json", "model.safetensors.index.json",
                           "model-*.safetensors", "preprocessor_config.json", "tokenizer.json",
                           "tokenizer_config.json", "vocab.json", "merges.txt", "chat_template.json")),
    )
    defaults = {
        "corpus.empty_frac": 0.015,
        "precompute.shard_size": 512, "precompute.val_shard_size": 256,
        "train.width": 1024, "train.depth": 4, "train.steps": 20000, "train.batch_size": 32,
        "train.lr": 2e-4, "train.warmup": 1000, "export.export_sigvq": False,
    }
    hints = {
        "train": "Reference (trainer5): val cos 0.915 (vision 0.80, text 0.98).",
        "eval": "Judge by cos_slice (the rows the DiT consumes) and the cos_vis / cos_txt split.",
    }
    teacher_memory_gib = 9.0
    engine_command_template = (
        "ggk diffuser engine -- --diffusion-model mageflow-edit-turbo-nvfp4.gguf "
        "--vae pig_mageflow_vae_fp32-f16.gguf --llm {student} --llm-adapter {adapter} "
        "--llm_vision mmproj-qwen3vl-4b-it-f16.gguf --ref-image sheep.png -p \"a sheep in sunglasses\" "
        "--cfg-scale 1.0 --steps 4 --sampling-method euler --diffusion-fa -o out.png")
    export_kv = {
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.teacher": "Qwen/Qwen3-VL-4B-Instruct",
        "adapter.teacher_tap": "final_norm",
    }
    bytes_per_sample = 60 * (2560 + 1024) * 2 + 60 * 4

    def format_prompt(self, text: str) -> str:
        """Text-only samples use the engine's text-to-image template (rows >= 34 reach the DiT)."""
        return T2I_PREFIX + text + SUFFIX

    def build_teacher(self, project, device):
        from ..errors import UserError

        raise UserError("the real Qwen3-VL teacher is not in this version yet; tick 'mock teacher' "
                        "under Precompute (or set GGUF_TRAINER_MOCK_TEACHER=1) to run the pipeline.")

    def build_mock_teacher(self, project):
        from .mock import MockTokenTeacher

        return MockTokenTeacher(self.id, self.out_dim, sup_start=T2I_START)


PACK = MageFlowPack()
