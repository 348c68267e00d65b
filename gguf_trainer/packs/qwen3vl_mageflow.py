"""MageFlow-Edit pack (the trainer5 recipe): pig_clip + a token-aligned adapter with a
vision extension replaces the Qwen3-VL-4B-Instruct text stack. Targets: the teacher's
final-norm state of every token. Engine facts: engine-contract §3.2."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Material, TrainerPack

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

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
IMAGE_PAD = "<|image_pad|>"
IMAGE_PAD_ID = 151655
# Reference-image preprocessing (engine-contract §3.2): patch 16 × merge 2, long side ≤ 384.
FACTOR = 32
MAX_SIDE = 384
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def image_block(i: int, n: int) -> str:
    """Image i (0-based) with n vision tokens, as the engine writes it into the edit template."""
    return f"Image {i + 1}: <|vision_start|>" + IMAGE_PAD * n + "<|vision_end|>"


def target_size(h: int, w: int) -> tuple[int, int]:
    """(h̄, w̄): each side rounded to a multiple of 32 (≥ 32); a long side over 384 is scaled
    down first, in float32 as the engine does."""
    import numpy as np

    def rounded(side: int) -> int:
        return max(FACTOR, int(np.floor(side / FACTOR + 0.5)) * FACTOR)

    if max(h, w) <= MAX_SIDE:
        return rounded(h), rounded(w)
    beta = np.float32(MAX_SIDE) / np.float32(max(h, w))
    return tuple(max(FACTOR, int(np.floor(np.float32(s) * beta / FACTOR)) * FACTOR) for s in (h, w))


def preprocess_image(path) -> np.ndarray:
    """(3, h̄, w̄) float32: nearest resize to cover (h̄, w̄), centre crop, clamp to [0, 1] and
    OpenAI-CLIP normalisation (engine `clip_preprocess`). (h̄/32)·(w̄/32) vision tokens."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        x = np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0  # (h, w, 3)
    h, w = x.shape[:2]
    th, tw = target_size(h, w)
    scale = max(np.float32(tw) / np.float32(w), np.float32(th) / np.float32(h))
    rh, rw = max(th, int(np.float32(scale) * np.float32(h))), max(tw, int(np.float32(scale) * np.float32(w)))
    rows, cols = np.arange(rh) * h // rh, np.arange(rw) * w // rw  # nearest, integer index
    x = x[rows][:, cols]
    top, left = (rh - th) // 2, (rw - tw) // 2
    x = np.clip(x[top: top + th, left: left + tw], 0.0, 1.0)
    x = (x - np.array(CLIP_MEAN, dtype=np.float32)) / np.array(CLIP_STD, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


class MageFlowPack(TrainerPack):
    id = "qwen3vl_mageflow"
    title = "MageFlow-Edit (Qwen3-VL-4B)"
    description = ("Replaces the Qwen3-VL-4B-Instruct text stack with pig_clip + a token-aligned "
                   "adapter with a vision extension; pairs with the unchanged mmproj for editing.")
    adapter_kind = "token_aligned_vision"
    out_dim = 2560
    vis_dim = 2560
    default_name = "qwen3vl_4b_adapter"
    shard_contract = "qwen3vl_mageflow/3"  # 3: images spliced, raw vision rows stored
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
    image_pad_id = IMAGE_PAD_ID

    def format_prompt(self, text: str) -> str:
        """Text-only samples use the engine's text-to-image template (rows >= 34 reach the DiT)."""
        return T2I_PREFIX + text + SUFFIX

    def student_text(self, sample, image_tokens=()) -> str:
        """The edit template with one block per reference image, else the text-to-image one."""
        if not sample.images:
            return self.format_prompt(sample.text)
        blocks = "".join(image_block(i, n) for i, n in enumerate(image_tokens))
        return EDIT_PREFIX + blocks + sample.text + SUFFIX

    def demo_corpus(self, folder, prompts):
        """The demo's corpus: small synthetic images (64–160 px, 4–20 vision tokens each) in
        one- and two-image edit samples, plus the text-only prompts. Returns the .jsonl path."""
        from .mageflow_demo import write_demo_corpus

        return write_demo_corpus(folder, prompts)

    def build_teacher(self, project, device):
        from ..errors import UserError

        raise UserError("the real Qwen3-VL teacher is not in this version yet; tick 'mock teacher' "
                        "under Precompute (or set GGUF_TRAINER_MOCK_TEACHER=1) to run the pipeline.")

    def build_mock_teacher(self, project):
        from .mock import MockVisionTokenTeacher

        return MockVisionTokenTeacher(self.id, self.out_dim, self.vis_dim, preprocess_image,
                                      sup_start_text=T2I_START, sup_start_image=EDIT_START)


PACK = MageFlowPack()
