"""Tiny Qwen3 and Qwen3-VL teacher snapshots for the layerwise packs' demos and tests: the real
transformers classes (`Qwen3ForCausalLM`, `Qwen3VLForConditionalGeneration`, saved with the
released snapshots' weight names), seeded random weights, the real Qwen tokenizer files, the
full 151936-id vocabulary (the templates tokenize as for the real teachers) and as many decoder
layers as the family's deepest tap, on a 16-wide text stack (~5 MB of bf16 weights, mostly the
embedding table). Built at demo time from code: nothing ships but this module. Must not: be
used for real materials.

    root = write_tiny_tap_teacher(dest, "qwen3_vl", layers=36)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from gguf_trainer.base.atomic import atomic_path, write_text
from gguf_trainer.base.paths import TINY_MARKER
from gguf_trainer.tiny import qwen_tokenizer_dir

HIDDEN = 16  # text hidden = tap width of the tiny teachers
SEED = 2207
INIT_STD = 0.3  # large enough that 36 random layers keep distinct, non-degenerate taps
VOCAB = 151936
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
_TEXT = {
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": 32,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}


def tiny_config(arch: str, layers: int) -> dict:
    """config.json of a tiny `arch` ("qwen3" | "qwen3_vl") teacher with `layers` decoder layers."""
    if arch == "qwen3":
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            **_TEXT,
            "num_hidden_layers": layers,
            "rope_theta": 1000000,
            "dtype": "bfloat16",
        }
    if arch != "qwen3_vl":
        raise ValueError(f"unknown tiny teacher architecture {arch!r}")
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "image_token_id": 151655,
        "video_token_id": 151656,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "tie_word_embeddings": True,
        "text_config": {
            "model_type": "qwen3_vl_text",
            **_TEXT,
            "num_hidden_layers": layers,
            "dtype": "bfloat16",
            "rope_scaling": {
                "rope_type": "default",
                "mrope_section": [4, 2, 2],
                "mrope_interleaved": True,
            },
            "rope_theta": 5000000,
        },
        "vision_config": {
            "model_type": "qwen3_vl_vision",
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": HIDDEN,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "in_channels": 3,
            "num_position_embeddings": 16,
            "deepstack_visual_indexes": [0],
            "hidden_act": "gelu_pytorch_tanh",
        },
    }


def build_tiny_tap_teacher(arch: str, layers: int, seed: int = SEED):
    """The tiny model (float32, eval) with seeded N(0, INIT_STD) weights, norm weights 1 + noise."""
    import transformers

    config_dict = tiny_config(arch, layers)
    if arch == "qwen3":
        config = transformers.Qwen3Config(
            **{k: v for k, v in config_dict.items() if k != "architectures"}
        )
        cls = transformers.Qwen3ForCausalLM
    else:
        config = transformers.Qwen3VLConfig(
            **{k: v for k, v in config_dict.items() if k != "architectures"}
        )
        cls = transformers.Qwen3VLForConditionalGeneration
    with torch.device("meta"):  # no init pass over the 151936-row table: every weight is set below
        model = cls(config)
    model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            std = 0.05 if "embed" in name else INIT_STD
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32) * std
            is_norm = param.ndim == 1 and "norm" in name and name.endswith("weight")
            param.copy_(noise * 0.1 + 1.0 if is_norm else noise)
    # to_empty left the non-persistent rotary buffers garbage; rebuild them from the config
    text = model.model.language_model if arch == "qwen3_vl" else model.model
    text.rotary_emb = type(text.rotary_emb)(config=text.config)
    if arch == "qwen3_vl":
        visual = model.model.visual
        visual.rotary_pos_emb = type(visual.rotary_pos_emb)(config.vision_config)
    return model.float().eval().requires_grad_(False), config_dict


def write_tiny_tap_teacher(dest: Path, arch: str, layers: int) -> Path:
    """A complete tiny snapshot in `dest`: config, bf16 weights (seeded: every copy is the same
    bytes), the real Qwen tokenizer files and the tiny marker."""
    from safetensors.torch import save_file

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    model, config = build_tiny_tap_teacher(arch, layers)
    state = {
        k: v.to(torch.bfloat16).contiguous()
        for k, v in model.state_dict().items()
        if not k.startswith("lm_head.")
    }  # tied to the embedding table, as released
    with atomic_path(dest / "model.safetensors", suffix=".safetensors") as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    write_text(dest / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    write_text(
        dest / TINY_MARKER,
        "a tiny stand-in built by gguf_trainer.tiny.qwen_taps; no reference figures apply\n",
    )
    for name in TOKENIZER_FILES:
        with atomic_path(dest / name) as tmp:
            shutil.copyfile(qwen_tokenizer_dir() / name, tmp)
    return dest
