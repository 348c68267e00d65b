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
