"""The tiny real T5 teacher: a `T5EncoderModel` with random weights and small dimensions plus a
small sentencepiece model trained here, laid out like the `callgg/t5-v1_1-xxl-encoder-bf16`
snapshot (config.json, model.safetensors in bf16, spiece.model and the tokenizer/generation
side files), plus the GGUF_TRAINER_TINY marker (no reference figures apply to it).

`gguf-trainer demo --pack t5xxl_pixart` and the tests run the real teacher code
(`teachers.t5`) on it offline. The shipped copy lives in `packs/demo_materials/t5xxl_pixart/`
(~200 KB); rebuild it with

    python -m gguf_trainer.tiny.t5_tiny            # or: ... t5_tiny DEST

Same seed, same files: the weights come from a seeded generator and sentencepiece trains on
one thread over a fixed corpus. Must not: download anything.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from gguf_trainer.base import atomic

DEMO_DIR = Path(__file__).resolve().parents[1] / "packs" / "demo_materials" / "t5xxl_pixart"

# T5 v1.1 shape (gated-GELU feed-forward, relative position buckets, untied head), tiny sizes.
TINY_T5_CONFIG = {
    "architectures": ["T5EncoderModel"],
    "model_type": "t5",
    "d_model": 64,
    "d_kv": 16,
    "num_heads": 4,
    "d_ff": 128,
    "num_layers": 2,
    "vocab_size": 256,
    "feed_forward_proj": "gated-gelu",
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "dropout_rate": 0.0,
    "layer_norm_epsilon": 1e-6,
    "initializer_factor": 1.0,
    "is_encoder_decoder": False,
    "use_cache": False,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "decoder_start_token_id": 0,
}

# Prompt vocabulary beyond the demo corpus, so unseen prompts still split into real pieces.
_WORDS = """\
portrait landscape close-up young lady man woman child old city forest river ocean beach sky cloud
mountain street night day morning evening light shadow color red green blue yellow purple orange
black white gray silver gold bright dark soft sharp detailed realistic cinematic painting photo
drawing sketch render digital art style anime cartoon fantasy science fiction castle house garden
flower tree leaf grass stone water fire snow rain storm fog sun moon star space planet robot dragon
horse dog cat bird fish cake coffee table chair window door wall floor glass metal wood paper cloth
dress hat shoes face eyes hair smile hands standing sitting walking running flying looking wearing
holding beautiful cute large small tall ancient modern futuristic vintage peaceful dramatic
colorful minimal abstract high quality masterpiece trending on artstation wide angle lens depth of
field bokeh volumetric lighting golden hour studio"""


# The snapshot's small side files, so its folder is as complete as the real one's patterns ask.
SIDE_FILES = {
    "generation_config.json": {"decoder_start_token_id": 0, "eos_token_id": 1, "pad_token_id": 0},
    "special_tokens_map.json": {"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"},
    "tokenizer_config.json": {
        "tokenizer_class": "T5Tokenizer",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "extra_ids": 0,
        "model_max_length": 512,
    },
}


def tiny_spm_corpus() -> list[str]:
    from gguf_trainer.tiny.prompts import demo_prompts

    words = _WORDS.split()
    return demo_prompts() + [" ".join(words[i : i + 7]) for i in range(0, len(words), 3)]


def train_tiny_spm(vocab_size: int = 256) -> bytes:
    """A Unigram sentencepiece model with T5's special ids (pad 0, eos 1, unk 2, no bos). The
    normalizer is `identity` (the real T5 model's nmt_nfkc table alone is 240 KB); whitespace
    is still stripped and collapsed, as T5's is."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(tiny_spm_corpus()),
        model_writer=buf,
        vocab_size=vocab_size,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        num_threads=1,
        hard_vocab_limit=False,
        shuffle_input_sentence=False,
        normalization_rule_name="identity",
        minloglevel=2,
    )
    return buf.getvalue()


def tiny_encoder_state(seed: int = 0) -> dict:
    """The encoder's tensors as the real snapshot stores them: bf16, no tied duplicate."""
    import torch
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    model = T5EncoderModel(T5Config(**TINY_T5_CONFIG))
    state = model.state_dict()
    # tied to shared.weight (the real file has one copy)
    state.pop("encoder.embed_tokens.weight", None)
    return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in state.items()}


TINY_NOTE = "a tiny stand-in built by gguf_trainer.tiny.t5_tiny; no reference figures apply\n"


def build_tiny_t5(dest: Path = DEMO_DIR, seed: int = 0) -> Path:
    """Write config.json, spiece.model, model.safetensors and the side files into `dest`
    (each atomically), and the tiny-teacher marker: eval reports its health as "n/a" (the
    pack's reference figures are for the real T5-XXL)."""
    from safetensors.torch import save_file

    from gguf_trainer.base.paths import TINY_MARKER

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    atomic.write_text(dest / TINY_MARKER, TINY_NOTE)
    atomic.write_bytes(dest / "spiece.model", train_tiny_spm())
    for name, content in {"config.json": TINY_T5_CONFIG, **SIDE_FILES}.items():
        atomic.write_text(dest / name, json.dumps(content, indent=2, sort_keys=True) + "\n")
    with atomic.atomic_path(dest / "model.safetensors") as tmp:
        save_file(tiny_encoder_state(seed), str(tmp), metadata={"format": "pt"})
    return dest


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    print(build_tiny_t5(Path(sys.argv[1]) if len(sys.argv) > 1 else DEMO_DIR))
