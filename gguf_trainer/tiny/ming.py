"""A tiny Ming-Image text encoder and a Ling-like tokenizer.json, offline.

The model: teachers/ming.py's MingTextEncoder on small dimensions with seeded random weights,
keeping what the engine hard-codes or reads from nothing (ming_image_te.hpp 160-179, llm.hpp
256-269): 8 expert groups (here 32 experts, 4 a group, so the group-limited top 8 really
chooses), top 4 groups, scaling 2.5, 128-wide heads (so the video rope has its 24 spatial and 8
temporal frequencies), the 1536-wide connector, the full 157184-row Ling table (the image tokens
are 157157-157159), 13 layers (directvlm reads hidden states 5 and 12), 256 query tokens.

The tokenizer: no Ling vocabulary installs offline (the real one is the 12 MB
mllm/tokenizer.json of inclusionAI/Ming-Image-0.1-Design), so the tests and the demo build one:
a byte-level BPE trained by `tokenizers` on the demo prompts and Ming's template, split by the
Ling pre-tokenizer regex, with the engine's 22 Ling special strings as added tokens. The five
ids the engine hard-codes are the real ones (<|startoftext|> 156891, <|endoftext|> 156892,
<imagePatch> 157157, <image> 157158, </image> 157159); the other specials get 156893.. in the
engine's list order, which is this vocabulary's own choice. Must not: be used for real materials.

    cfg = TINY; te = build_tiny_ming()              # float32, eval
    text = ling_tokenizer_json()                    # the tokenizer.json text
    root = copy_tiny_ming(dest)                     # the demo's snapshot (teachers/ming_snapshot)
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from gguf_trainer.base.atomic import atomic_path, write_text
from gguf_trainer.base.paths import TINY_MARKER
from gguf_trainer.engine.ling_bpe import (
    IMAGE_END,
    IMAGE_PATCH,
    IMAGE_START,
    PREFIX,
    SPECIALS,
    SUFFIX,
)
from gguf_trainer.teachers.ming import MingConfig, MingTextEncoder

SEED = 2718
TINY = MingConfig(
    hidden=64, intermediate=96, moe_intermediate=16, layers=13, heads=2, kv_heads=1,
    head_dim=128, experts=32, shared_experts=1, first_dense=1,
    conn_hidden=1536, conn_layers=2, conn_heads=2, conn_kv_heads=1, conn_intermediate=64,
    caption_dim=128, diffusion_dim=192,  # 2:3 like the real 2560:3840 (packs/ming_image.py)
)
# The Ling pre-tokenizer (ling_tokenizer.cpp 16), for training the tiny merges only: the ids the
# project and the engine give come from their own splitters (engine/ling_bpe.py).
LING_REGEX = (r"(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*"
              r"|\s*[\r\n]|\s+(?!\S)|\s+")
SPECIAL_IDS = {"<|startoftext|>": 156891, "<|endoftext|>": 156892, "<imagePatch>": IMAGE_PATCH,
               "<image>": IMAGE_START, "</image>": IMAGE_END}


def special_ids() -> dict[str, int]:
    ids, nxt = dict(SPECIAL_IDS), 156893
    for s in SPECIALS:
        if s not in ids:
            ids[s], nxt = nxt, nxt + 1
    return ids


@functools.lru_cache(maxsize=1)
def ling_tokenizer_json(vocab_size: int = 1500) -> str:
    """The tiny Ling tokenizer.json text (deterministic for a given `tokenizers` version)."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers.models import BPE

    from gguf_trainer.tiny.prompts import demo_prompts

    tok = Tokenizer(BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LING_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = demo_prompts() + [PREFIX.replace("<|role_end|>", " ").replace("<role>", " ")
                               .replace("</role>", " "), "ASSISTANT HUMAN SYSTEM", SUFFIX]
    tok.train_from_iterator(sorted(corpus), trainer)
    data = json.loads(tok.to_str())
    data["added_tokens"] = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for s, i in sorted(special_ids().items(), key=lambda kv: kv[1])
    ]
    return json.dumps(data, ensure_ascii=False)


def build_tiny_ming(seed: int = SEED, cfg: MingConfig = TINY) -> MingTextEncoder:
    """MingTextEncoder(cfg) with seeded weights: linears N(0, 1/fan_in), norms 1 + N(0, 0.1),
    embeddings and query tokens N(0, 1), router biases N(0, 0.3); float32, eval."""
    model = MingTextEncoder(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight") or ".proj_directvlm.0." in f".{name}":
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("expert_bias"):
                p.copy_(0.3 * noise)
            elif name.endswith("bias"):
                p.copy_(0.02 * noise)
            elif name in ("query_tokens", "thinker.embed_tokens.weight"):
                p.copy_(noise)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5)
    return model.float().eval().requires_grad_(False)


def copy_tiny_ming(dest: Path) -> Path:
    """A complete tiny snapshot in `dest` (teachers/ming_snapshot.py's own layout): config,
    fp32 weights (seeded: every copy is the same bytes), the tokenizer.json, the tiny marker."""
    from dataclasses import asdict

    from safetensors.torch import save_file

    from gguf_trainer.teachers.ming_snapshot import CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE

    dest = Path(dest)
    (dest / TOKENIZER_FILE).parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in build_tiny_ming().state_dict().items()}
    with atomic_path(dest / WEIGHTS_FILE, suffix=".safetensors") as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    write_text(dest / CONFIG_FILE, json.dumps(asdict(TINY), indent=2, sort_keys=True) + "\n")
    write_text(dest / TOKENIZER_FILE, ling_tokenizer_json())
    write_text(dest / TINY_MARKER,
               "a tiny stand-in built by gguf_trainer.tiny.ming; no reference figures apply\n")
    return dest


# A tiny Qwen2.5-VL tower with what MingImageVisionRunner hard-codes (ming_image_te.hpp 112-123):
# 16 heads, 112 px windows, full attention at block 7 (of 8), patch 14, merge 2, temporal 2.
TINY_VISION = {"depth": 8, "hidden_size": 128, "intermediate_size": 96, "out_hidden_size": 96,
               "num_heads": 16, "window_size": 112, "patch_size": 14, "spatial_merge_size": 2,
               "temporal_patch_size": 2, "fullatt_block_indexes": [7], "in_channels": 3,
               "hidden_act": "silu"}


def build_tiny_ming_vision(seed: int = SEED + 1, hidden: int = TINY.hidden):
    """teachers/ming_vision.py's MingVision on TINY_VISION with seeded weights (linears
    N(0, 1/fan_in), norms 1 + N(0, 0.1), biases N(0, 0.02)); float32, eval."""
    from gguf_trainer.teachers.ming_vision import MingVision, vision_config

    model = MingVision(vision_config(dict(TINY_VISION)), hidden)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if p.ndim == 1 and "norm" in name or "ln_q" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif p.ndim == 1:
                p.copy_(0.02 * noise)
            else:
                p.copy_(noise / p[0].numel() ** 0.5)
    return model.float().eval().requires_grad_(False)


def released_files(model: MingTextEncoder, vision=None) -> dict[str, dict]:
    """The tiny model in the released snapshot's layout, written out by hand from the model's own
    loaders (modeling_bailingmm2.py, modeling_bailing_moe_v2.py; not by inverting
    teachers/ming_release.py): {component: {source name: tensor}}, the experts unfused, plus
    what the release carries that the text encoder does not read (lm_head, audio_gate, the
    connector's embed_tokens / lm_head)."""
    cfg, sd = model.cfg, model.state_dict()
    mllm = {"model.model.word_embeddings.weight": sd["thinker.embed_tokens.weight"],
            "model.model.norm.weight": sd["thinker.norm.weight"],
            "model.lm_head.weight": sd["thinker.embed_tokens.weight"].flip(0).contiguous()}
    for i in range(cfg.layers):
        src, dst = f"model.model.layers.{i}.", f"thinker.layers.{i}."
        for part in ("attention.query_key_value.weight", "attention.dense.weight",
                     "attention.q_norm.weight", "attention.k_norm.weight",
                     "input_layernorm.weight", "post_attention_layernorm.weight"):
            mllm[src + part] = sd[dst + part]
        if i < cfg.first_dense:
            for proj in ("gate_proj", "up_proj", "down_proj"):
                mllm[f"{src}mlp.{proj}.weight"] = sd[f"{dst}mlp.{proj}.weight"]
            continue
        for gate in ("gate", "image_gate"):
            mllm[f"{src}mlp.{gate}.weight"] = sd[f"{dst}mlp.{gate}.proj.weight"]
            mllm[f"{src}mlp.{gate}.expert_bias"] = sd[f"{dst}mlp.{gate}.expert_bias"]
        mllm[f"{src}mlp.audio_gate.weight"] = torch.zeros_like(sd[f"{dst}mlp.gate.proj.weight"])
        mllm[f"{src}mlp.audio_gate.expert_bias"] = torch.zeros(cfg.experts)
        gate_up = sd[f"{dst}mlp.experts.gate_up_proj.weight"]
        down = sd[f"{dst}mlp.experts.down_proj.weight"]
        for e in range(cfg.experts):
            mllm[f"{src}mlp.experts.{e}.gate_proj.weight"] = gate_up[e, : cfg.moe_intermediate]
            mllm[f"{src}mlp.experts.{e}.up_proj.weight"] = gate_up[e, cfg.moe_intermediate :]
            mllm[f"{src}mlp.experts.{e}.down_proj.weight"] = down[e]
        for proj in ("gate_proj", "up_proj", "down_proj"):
            mllm[f"{src}mlp.shared_experts.{proj}.weight"] = \
                sd[f"{dst}mlp.shared_experts.{proj}.weight"]
    if vision is not None:  # the tower and linear_proj under the release's own names
        mllm.update(vision.state_dict())
    connector = {"model.embed_tokens.weight": torch.zeros(8, cfg.conn_hidden),
                 "lm_head.weight": torch.zeros(8, cfg.conn_hidden)}
    for k, v in sd.items():
        if k.startswith("connector."):
            connector["model." + k.removeprefix("connector.")] = v
    side = round(cfg.num_queries ** 0.5)
    mlp = {f"query_tokens_dict.{side}x{side}": sd["query_tokens"]}
    for k, v in sd.items():
        if k.startswith(("proj_in.", "proj_out.", "proj_directvlm.")):
            mlp[k] = v
    return {"mllm": mllm, "connector": connector, "mlp": mlp}


def released_configs(cfg: MingConfig, connector_norm: bool = False) -> dict[str, dict]:
    """The three config.json of a released snapshot for `cfg` (the keys the model's own code
    and ggk read; Ling-mini-2.0's BailingMoeV2Config names)."""
    llm = {"hidden_size": cfg.hidden, "intermediate_size": cfg.intermediate,
           "moe_intermediate_size": cfg.moe_intermediate, "num_hidden_layers": cfg.layers,
           "num_attention_heads": cfg.heads, "num_key_value_heads": cfg.kv_heads,
           "head_dim": cfg.head_dim, "num_experts": cfg.experts,
           "num_shared_experts": cfg.shared_experts, "first_k_dense_replace": cfg.first_dense,
           "vocab_size": cfg.vocab, "n_group": cfg.n_group, "topk_group": cfg.topk_group,
           "num_experts_per_tok": cfg.top_k, "routed_scaling_factor": cfg.routed_scaling,
           "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.eps, "partial_rotary_factor": 0.5,
           "use_qkv_bias": False, "use_bias": False, "hidden_act": "silu",
           "router_type": "MultiRouter", "rope_scaling": {"type": "video_rope"},
           "image_patch_token": IMAGE_PATCH, "image_start_token": IMAGE_START,
           "max_position_embeddings": 32768}
    connector = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                 "hidden_size": cfg.conn_hidden, "num_hidden_layers": cfg.conn_layers,
                 "num_attention_heads": cfg.conn_heads, "num_key_value_heads": cfg.conn_kv_heads,
                 "head_dim": cfg.conn_head_dim,
                 "intermediate_size": cfg.conn_intermediate, "rope_theta": cfg.conn_theta,
                 "rms_norm_eps": cfg.eps, "vocab_size": 8}
    side = round(cfg.num_queries ** 0.5)
    mlp = {"img_gen_scales": [side], "diffusion_c_input_dim": cfg.caption_dim,
           "diffusion_inner_dim": cfg.diffusion_dim, "connector_norm": connector_norm,
           "selected_hidden_states_layers": [*cfg.direct_states, cfg.layers],
           "use_vlm_directvlm_condition": True, "use_learnable_token_condition": True,
           "use_identity_mlp": True}
    return {"mllm": {"architectures": ["BailingMM2NativeForConditionalGeneration"],
                     "mlp_depth": 2, "llm_config": llm, "vision_config": dict(TINY_VISION)},
            "connector": connector, "mlp": mlp}


def write_released_snapshot(dest: Path, model: MingTextEncoder | None = None, *,
                            connector_norm: bool = False, dtype=torch.float32,
                            vision=None) -> Path:
    """`model` (default the tiny one) and `vision` (default the tiny tower) as a released
    Ming-Image snapshot: mllm/ in two shards with model.safetensors.index.json, connector/ with
    its index, mlp/model.safetensors, the three config.json and mllm/tokenizer.json."""
    from safetensors.torch import save_file

    model = model or build_tiny_ming()
    vision = vision or build_tiny_ming_vision(hidden=model.cfg.hidden)
    dest = Path(dest)
    files = released_files(model, vision)
    configs = released_configs(model.cfg, connector_norm)
    for comp, tensors in files.items():
        folder = dest / comp
        folder.mkdir(parents=True, exist_ok=True)
        write_text(folder / "config.json", json.dumps(configs[comp], indent=2) + "\n")
        names = sorted(tensors)
        if comp == "mlp":
            shards = {"model.safetensors": names}
        else:  # split in two as the release's index names its shards
            half = len(names) // 2
            shards = {f"model-0000{i + 1}-of-00002.safetensors": part
                      for i, part in enumerate((names[:half], names[half:]))}
            index = {"metadata": {}, "weight_map": {n: f for f, part in shards.items()
                                                    for n in part}}
            write_text(folder / "model.safetensors.index.json", json.dumps(index, indent=2))
        for file, part in shards.items():
            save_file({n: tensors[n].to(dtype).contiguous() for n in part}, str(folder / file),
                      metadata={"format": "pt"})
    write_text(dest / "mllm" / "tokenizer.json", ling_tokenizer_json())
    return dest
