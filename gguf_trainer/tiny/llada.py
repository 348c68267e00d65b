"""A tiny LLaDA-Image teacher snapshot in the released `inclusionAI/LLaDA-Image-Turbo` layout
(the same folders, config keys and weight names: a sharded text encoder with its index,
diffusers-named queryformer/ and text_projection/), the same remote-code interface and the
same transformers-5 traps, on small dimensions.

Owns: the tiny dimensions, the builder of the shipped demo materials
(`gguf_trainer/packs/demo_materials/llada_image/`) and copying them into a folder. The
remote code itself (`text_encoder/*.py`) is hand-written and shipped; this module writes the
configs, the seeded random weights, the tokenizer and a tiny SigVQ file next to it.
Must not: be used for real materials.

    build_shipped(PACK.format_prompt)            # rebuild the shipped files (maintainers;
                                                 # PACK from gguf_trainer.packs.llada_image)
    root = copy_tiny_llada(dest)                 # tests and the demo: a private copy
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from gguf_trainer.base.paths import TINY_MARKER

SHIPPED = Path(__file__).resolve().parent.parent / "packs" / "demo_materials" / "llada_image"
CODE_FILES = ("configuration_llada2uni_moe.py", "modeling_llada2uni_moe.py", "fused_moe_ops.py")
HIDDEN = 64
# The released text_encoder/config.json's keys (teachers/llada_layout.py cites the copy), with
# small values; the tiny remote code honours the ones that shape the math.
TEXT_ENCODER = {
    "architectures": ["LLaDA2MoeModelLM"],
    "auto_map": {
        "AutoConfig": "configuration_llada2uni_moe.LLaDA2MoeConfig",
        "AutoModel": "modeling_llada2uni_moe.LLaDA2MoeModelLM",
        "AutoModelForCausalLM": "modeling_llada2uni_moe.LLaDA2MoeModelLM",
    },
    "attention_dropout": 0.0,
    "embedding_dropout": 0.0,
    "first_k_dense_replace": 1,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": HIDDEN,
    "image_token_offset": 480,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
    "model_type": "llada2_moe_veomni",
    "moe_intermediate_size": 32,
    "moe_router_enable_expert_bias": True,
    "n_group": 4,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "num_shared_experts": 1,
    "output_dropout": 0.0,
    "output_router_logits": False,
    "pad_token_id": 0,
    "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-6,
    # as in the released config; transformers 5 turns it into rope_parameters, the code ignores it
    "rope_scaling": {"mrope_section": [2, 1, 1], "rope_type": "default", "type": "default"},
    "rope_theta": 600000.0,
    "router_dtype": "fp32",
    "routed_scaling_factor": 1.0,
    "score_function": "sigmoid",
    "sliding_window": None,
    "tie_word_embeddings": False,
    "topk_group": 2,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_bias": False,
    "use_cache": False,
    "use_qk_norm": True,
    "use_qkv_bias": False,
    "vocab_size": 512,
}
TE_SHARDS = 2  # the release has 9 shards and model.safetensors.index.json: so does the tiny one
# The released queryformer/ and text_projection/ config.json keys, small sizes.
QUERYFORMER = {
    "_class_name": "LLaDAImageQueryFormerModel",
    "_diffusers_version": "0.40.0.dev0",
    "dropout": 0.0,
    "hidden_size": HIDDEN,
    "intermediate_size": 128,
    "norm_eps": 1e-6,
    "num_attention_heads": 4,
    "num_hidden_layers": 1,
    "num_queries": 256,
}
TEXT_PROJECTION = {
    "_class_name": "LLaDAImageTextProjectionModel",
    "_diffusers_version": "0.40.0.dev0",
    "attention_dropout": 0.0,
    "hidden_size": HIDDEN,
    "intermediate_size": 128,
    "norm_eps": 1e-6,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "projection_dim": 2560,
}
# The released model_index.json as it is (the teacher download fetches it; its transformer,
# vae and scheduler folders are not part of the teacher).
MODEL_INDEX = {
    "_class_name": "LLaDAImagePipeline",
    "_diffusers_version": "0.40.0.dev0",
    "queryformer": ["diffusers", "LLaDAImageQueryFormerModel"],
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "sigvq": ["diffusers", "LLaDAImageSigVQModel"],
    "text_encoder": ["modeling_llada2uni_moe", "LLaDA2MoeModelLM"],
    "text_projection": ["diffusers", "LLaDAImageTextProjectionModel"],
    "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
    "transformer": ["diffusers", "LLaDAImageTransformer2DModel"],
    "vae": ["diffusers", "AutoencoderKLFlux2"],
}
SPECIAL = {"pad": "<|pad|>", "bos": "<|startoftext|>", "eos": "<|endoftext|>"}
# (name, shape, dtype): a few SigVQ-like tensors in the dtypes a real file mixes
SIGVQ_TENSORS = (
    ("encoder.patch_embed.proj.weight", (8, 3, 2, 2), torch.float32),
    ("encoder.patch_embed.proj.bias", (8,), torch.float32),
    ("encoder.blocks.0.attn.qkv.weight", (24, 8), torch.bfloat16),
    ("encoder.blocks.0.norm1.weight", (8,), torch.bfloat16),
    ("quantizer.embedding.weight", (16, 8), torch.float16),
)


def _randomized(state: dict, seed: int) -> dict:
    """Seeded weights in sorted-name order: norms 1, expert biases 0, the rest N(0, std)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(state):
        t = state[name]
        if name.endswith(("norm.weight", "norm1.weight")):
            out[name] = torch.ones(t.shape)
        elif name.endswith("expert_bias"):
            out[name] = torch.zeros(t.shape)
        else:
            std = (
                0.5
                if ("embeddings" in name or "meta_queries" in name or name.endswith("gate.weight"))
                else 0.08
            )
            out[name] = torch.randn(t.shape, generator=gen) * std
    return out


def _save(state: dict, path: Path, dtype: torch.dtype) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(dtype).contiguous() for k, v in state.items()}, str(path))
    path.chmod(0o644)  # package data: readable by everyone


def _write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def _backbone_state(root: Path) -> dict:
    """The remote model's state dict names and shapes, read by building it on the meta device
    with our own shipped code (imported as a package from the folder)."""
    import importlib
    import sys
    import types

    from gguf_trainer.teachers.llada_compat import install_attn_mask_utils

    install_attn_mask_utils()
    pkg = "_tiny_llada_code"
    package = types.ModuleType(pkg)  # the folder as a package, so its relative imports work
    package.__path__ = [str(root / "text_encoder")]
    sys.modules[pkg] = package
    try:
        conf = importlib.import_module(f"{pkg}.configuration_llada2uni_moe")
        modeling = importlib.import_module(f"{pkg}.modeling_llada2uni_moe")
        cfg = conf.LLaDA2MoeConfig(
            **{
                k: v
                for k, v in TEXT_ENCODER.items()
                if k
                not in (
                    "architectures",
                    "auto_map",
                    "model_type",
                    "torch_dtype",
                    "transformers_version",
                )
            }
        )
        with torch.device("meta"):
            model = modeling.LLaDA2MoeModelLM(cfg)
        return {k: torch.empty(v.shape) for k, v in model.state_dict().items()}
    finally:
        for name in [m for m in sys.modules if m == pkg or m.startswith(pkg + ".")]:
            del sys.modules[name]


def _write_tokenizer(folder: Path, format_prompt) -> None:
    """A small byte-level BPE trained on the demo prompts in the pack's template
    (`format_prompt`); it adds its own special tokens (BOS ... EOS), as the teacher's
    tokenizer does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from gguf_trainer.tiny.prompts import demo_prompts

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TEXT_ENCODER["vocab_size"],
        special_tokens=[SPECIAL["pad"], SPECIAL["bos"], SPECIAL["eos"]],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    texts = [format_prompt(p) for p in demo_prompts()] + [format_prompt("")]
    tok.train_from_iterator(texts, trainer)
    bos, eos = SPECIAL["bos"], SPECIAL["eos"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {eos} $B {eos}",
        special_tokens=[(bos, tok.token_to_id(bos)), (eos, tok.token_to_id(eos))],
    )
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    _write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "pad_token": SPECIAL["pad"],
            "bos_token": SPECIAL["bos"],
            "eos_token": SPECIAL["eos"],
            "padding_side": "right",
            "model_max_length": 2048,
        },
    )


def _save_sharded(state: dict, folder: Path, n: int) -> None:
    """`model-0000i-of-0000n.safetensors` + `model.safetensors.index.json`, as the release
    stores its text encoder (transformers reads the index)."""
    names = sorted(state)
    total, weight_map = 0, {}
    for i in range(n):
        part = names[i * len(names) // n : (i + 1) * len(names) // n]
        file = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        _save({k: state[k] for k in part}, folder / file, torch.bfloat16)
        weight_map.update(dict.fromkeys(part, file))
        total += sum(2 * state[k].numel() for k in part)
    _write_json(
        folder / "model.safetensors.index.json",
        {"metadata": {"total_size": total}, "weight_map": weight_map},
    )


def build_shipped(format_prompt, root: Path = SHIPPED, seed: int = 0) -> Path:
    """(Re)write every generated file of the tiny snapshot at `root` (its *.py stay);
    `format_prompt` is the pack's template (llada_image's PACK.format_prompt), which the tiny
    tokenizer learns."""
    from gguf_trainer.teachers.queryformer import QueryFormer, TextProjection, module_config

    te = root / "text_encoder"
    _write_json(te / "config.json", TEXT_ENCODER)
    for old in te.glob("model*.safetensors"):
        old.unlink()
    _save_sharded(_randomized(_backbone_state(root), seed), te, TE_SHARDS)
    for cls, cfg, sub in (
        (QueryFormer, QUERYFORMER, "queryformer"),
        (TextProjection, TEXT_PROJECTION, "text_projection"),
    ):
        _write_json(root / sub / "config.json", cfg)
        with torch.device("meta"):  # the loader's own module: its names are the release's
            module = cls(**module_config(cls, root / sub))
        shapes = {k: torch.empty(v.shape) for k, v in module.state_dict().items()}
        _save(
            _randomized(shapes, seed + 1),
            root / sub / "diffusion_pytorch_model.safetensors",
            torch.bfloat16,
        )
    _write_tokenizer(root / "tokenizer", format_prompt)
    _write_json(root / "model_index.json", MODEL_INDEX)
    (root / TINY_MARKER).write_text(
        "a tiny stand-in built by gguf_trainer.tiny.llada; no reference figures apply\n",
        encoding="utf-8",
    )
    gen = torch.Generator().manual_seed(seed + 2)
    sig = {n: (torch.randn(s, generator=gen) * 0.1).to(dt) for n, s, dt in SIGVQ_TENSORS}
    from safetensors.torch import save_file

    (root / "sigvq").mkdir(parents=True, exist_ok=True)
    save_file(sig, str(root / "sigvq" / "diffusion_pytorch_model.safetensors"))
    (root / "sigvq" / "diffusion_pytorch_model.safetensors").chmod(0o644)
    _write_json(root / "sigvq" / "config.json", {"_class_name": "SigVQ"})
    return root


def copy_tiny_llada(dest, with_sigvq: bool = True) -> Path:
    """A private copy of the shipped tiny snapshot at `dest` (created); returns `dest`."""
    dest = Path(dest)
    ignore = shutil.ignore_patterns("__pycache__", *(() if with_sigvq else ("sigvq",)))
    shutil.copytree(SHIPPED, dest, ignore=ignore, dirs_exist_ok=True)
    return dest


def copy_tiny_sigvq(dest) -> Path:
    """The shipped tiny SigVQ as `<dest>/sigvq/...` (the layout of the sigvq material)."""
    dest = Path(dest)
    shutil.copytree(SHIPPED / "sigvq", dest / "sigvq", dirs_exist_ok=True)
    return dest
