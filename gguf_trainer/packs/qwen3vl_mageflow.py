"""MageFlow-Edit pack (the trainer5 recipe): pig_clip + a token-aligned adapter with a
vision extension replaces the Qwen3-VL-4B-Instruct text stack. Targets: the teacher's
final-norm state of every token. Engine facts: engine-contract §3.2."""

from __future__ import annotations

from gguf_trainer.engine.qwen_ids import IMAGE_PAD, IMAGE_PAD_ID, VISION_END, VISION_START
from gguf_trainer.engine.qwen_vl_images import (
    preprocess_image,
    target_size,
)
from gguf_trainer.engine.template_ids import Piece

from .base import TrainerPack
from .teacher_repos import QWEN3VL_4B_TEACHER

# Copied exactly from the engine (conditioner.hpp 3155-3235, LLMEmbedder, MageFlow: edit and
# text-to-image, the pack's engine_template); tests/engine compiles those lines and compares.
EDIT_PREFIX = (
    "<|im_start|>system\nDescribe the key features of the input image "
    "(color, shape, size, texture, "
    "objects, background), then explain how the user's text instruction should alter or modify the "
    "image. Generate a new image that meets the user's requirements while maintaining consistency "
    "with the original input where appropriate.<|im_end|>\n<|im_start|>user\n"
)
T2I_PREFIX = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, "
    "size, texture, quantity, "
    "text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n"
)
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
EDIT_START = 64
T2I_START = 34
IMAGE_HEADER_TOKENS = 6  # "Image i: <|vision_start|>"

# Shard bytes (bf16 rows): an image sample of ~235 tokens stores the teacher's and the
# student's state of every token, 144 raw vision rows and its ids; a text sample ~60 tokens.
IMAGE_SAMPLE_BYTES = 235 * (2560 + 1024) * 2 + 144 * 2560 * 2 + 235 * 4  # ~2.4 MB
TEXT_SAMPLE_BYTES = 60 * (2560 + 1024) * 2 + 60 * 4  # ~0.43 MB
REFERENCE_LINE = "reference (trainer5): val cos 0.915 = vision 0.80 / text 0.98"
VISION_HINT = "a lagging vision cosine means vis_in or the width is the limiter, not the student"


def image_block(i: int, n: int) -> str:
    """Image i (0-based) with n vision tokens, as the engine writes it into the edit template."""
    return f"Image {i + 1}: {VISION_START}" + IMAGE_PAD * n + VISION_END


class MageFlowPack(TrainerPack):
    id = "qwen3vl_mageflow"
    title = "MageFlow-Edit (Qwen3-VL-4B)"
    description = (
        "Replaces the Qwen3-VL-4B-Instruct text stack with pig_clip + a token-aligned "
        "adapter with a vision extension; pairs with the unchanged mmproj for editing."
    )
    adapter_kind = "token_aligned_vision"
    engine_template = {
        "file": "diffusion/src/conditioning/conditioner.hpp",
        "lines": (3155, 3235),
        "version": "VERSION_MAGE_FLOW",
    }
    out_dim = 2560
    vis_dim = 2560
    default_name = "qwen3vl_4b_adapter"
    shard_contract = "qwen3vl_mageflow/3"  # 3: images spliced, raw vision rows stored
    max_len_student = 1024
    headline = "cos"  # token-weighted over supervised tokens
    eval_keys = (
        "cos",
        "cos_slice",
        "cos_vis",
        "cos_txt",
        "rel_mse",
        "worst_sample_cos",
        "roundtrip_cos",
        "baseline_cos",
    )
    teacher_materials = (QWEN3VL_4B_TEACHER,)
    defaults = {
        "corpus.empty_frac": 0.015,
        # the trainer5 mix: 56k single-image + 3k two-image + 27k text-only; val 1024 + 512
        # (instructions.Mix.from_counts splits n_train / n_val in these proportions)
        "corpus.n_train": 86000,
        "corpus.n_val": 1536,
        "precompute.shard_size": 512,
        "precompute.val_shard_size": 256,
        "train.width": 1024,
        "train.depth": 4,
        "train.steps": 20000,
        "train.batch_size": 32,
        "train.lr": 2e-4,
        "train.warmup": 1000,
        "export.export_sigvq": False,
    }
    hints = {
        "train": "Reference (trainer5): val cos 0.915 (vision 0.80, text 0.98).",
        "eval": "Judge by cos_slice (the rows the DiT consumes) and the cos_vis / cos_txt split; "
        + VISION_HINT
        + ".",
    }
    reference = {
        "val cos": 0.915,
        "cos_vis": 0.80,
        "cos_txt": 0.98,
        "recipe": "trainer5, width 1024, depth 4",
    }
    teacher_memory_gib = 9.0
    # the full Qwen3-VL-4B text stack (engine-contract §4b: it dumps llm_hidden.bin); the
    # --llm_vision mmproj stays from the command
    engine_teacher_args = "--llm Qwen3-VL-4B-Instruct-f16.gguf"
    engine_command_template = (
        "ggk diffuser engine -- --diffusion-model mageflow-edit-turbo-nvfp4.gguf "
        "--vae pig_mageflow_vae_fp32-f16.gguf --llm {student} --llm-adapter {adapter} "
        '--llm_vision mmproj-qwen3vl-4b-it-f16.gguf --ref-image sheep.png -p "a sheep in '
        'sunglasses" '
        "--cfg-scale 1.0 --steps 4 --sampling-method euler --diffusion-fa -o out.png"
    )
    export_kv = {
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.teacher": "Qwen/Qwen3-VL-4B-Instruct",
        "adapter.teacher_tap": "final_norm",
    }
    # the reference mix's average (59k image : 27k text samples): ~1.8 MB, ~170 GB with the margin
    bytes_per_sample = (59 * IMAGE_SAMPLE_BYTES + 27 * TEXT_SAMPLE_BYTES) // 86
    image_pad_id = IMAGE_PAD_ID
    image_size = staticmethod(target_size)  # reference-image size rule (long side <= 384)

    def format_prompt(self, text: str) -> str:
        """Text-only samples use the engine's text-to-image template (rows >= 34 reach the DiT)."""
        return T2I_PREFIX + text + SUFFIX

    def student_pieces(self, sample, image_tokens=()):
        """The engine's pieces: the edit prefix with one block per reference image (one piece,
        images included), else the text-to-image prefix; the prompt range; the suffix."""
        if not sample.images:
            prefix = T2I_PREFIX
        else:
            prefix = EDIT_PREFIX + "".join(image_block(i, n) for i, n in enumerate(image_tokens))
        return (Piece(prefix), Piece(sample.text, prompt=True), Piece(SUFFIX))

    def template_start(self, sample) -> int:
        return EDIT_START if sample.images else T2I_START

    def demo_corpus(self, folder, prompts):
        """The demo's corpus: small synthetic images (64–160 px, 4–20 vision tokens each) in
        one- and two-image edit samples, plus the text-only prompts. Returns the .jsonl path."""
        from gguf_trainer.tiny.mageflow_demo import write_demo_corpus

        return write_demo_corpus(folder, prompts)

    def teacher_gib(self, materials, device):
        """The tower and the text stack as they sit in memory (bf16 with a CUDA card, fp32 on a
        CPU-only machine), from the snapshot's headers: a snapshot that would not load fails
        here, in seconds."""
        import torch

        from ..teachers.qwen3vl import check_snapshot

        return check_snapshot(materials["teacher"]).gib(
            "cpu" if torch.device(device).type != "cuda" else "gpu"
        )

    def load_teacher(self, materials, plan, device):
        """Qwen3-VL from the snapshot, placed as planned: gpu (resident), offload (tower on the
        card, text stack streamed from RAM), cpu (fp32). Templates are checked against its
        tokenizer first."""
        from ..teachers.qwen3vl import load_qwen3vl_teacher

        return load_qwen3vl_teacher(
            materials["teacher"],
            device,
            plan.mode,
            student_pieces=self.student_pieces,
            template=self.teacher_template(),
            ram_limit_gib=plan.cpu_gib,
        )

    def teacher_template(self):
        """The templates and the engine's counts, as the teacher takes them (teachers import
        no pack)."""
        from ..teachers.qwen3vl import Template

        return Template(EDIT_PREFIX, EDIT_START, T2I_PREFIX, T2I_START, IMAGE_HEADER_TOKENS)

    def check_teacher(self, materials) -> str:
        """Header-only check of the snapshot (config, tokenizer, complete shards): its summary."""
        from ..teachers.qwen3vl import check_snapshot

        return check_snapshot(materials["teacher"]).summary()

    def demo_materials(self, folder):
        """A tiny real Qwen3-VL (the transformers class, seeded random weights, the real Qwen
        tokenizer): the demo runs the real teacher code offline."""
        from ..tiny.qwen3vl import copy_tiny_qwen3vl

        return {"teacher": copy_tiny_qwen3vl(folder / "Qwen3-VL-tiny")}

    def health_line(self, metrics, lead=None):
        """cos_slice with the vision / text split against the trainer5 reference, and where to
        look when the vision positions lag (`lead`, the rows-the-DiT-reads figures, unused)."""
        if metrics.get("cos_slice") is None:
            return None
        parts = [f"cos_slice {metrics['cos_slice']:.4f}"]
        for key in ("cos_vis", "cos_txt"):
            if metrics.get(key) is not None:
                base = metrics.get(f"baseline_{key}")
                parts.append(
                    f"{key} {metrics[key]:.4f}"
                    + (f" (mean baseline {base:.4f})" if base is not None else "")
                )
        line = ", ".join(parts) + "; " + REFERENCE_LINE
        vis, txt = metrics.get("cos_vis"), metrics.get("cos_txt")
        if vis is not None and txt is not None and txt - vis > 0.25:
            line += "; " + VISION_HINT
        return line

    def build_mock_teacher(self, project):
        from .mock import MockVisionTokenTeacher

        return MockVisionTokenTeacher(
            self.id,
            self.out_dim,
            self.vis_dim,
            preprocess_image,
            sup_start_text=T2I_START,
            sup_start_image=EDIT_START,
        )


PACK = MageFlowPack()
