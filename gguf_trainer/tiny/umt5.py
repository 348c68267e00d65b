"""The tiny real UMT5 teacher of the Wan pack: a `UMT5EncoderModel` with random weights and small
dimensions, and a synthetic UMT5-shaped sentencepiece model of exactly 256384 pieces (pad 0,
eos 1, bos 2, unk 3, as ggk's UMT5 tokenizer), laid out like the Wan diffusers snapshot the
pack downloads (`text_encoder/` + `tokenizer/spiece.model`), plus the GGUF_TRAINER_TINY marker.

Nothing of it is package data: `build_tiny_umt5(dest)` writes it (~40 MB: the 256384 x 64 bf16
embedding is 31 MiB, the tokenizer 5 MiB) in a few seconds when `gguf-trainer demo --pack
umt5xxl_wan` needs it. The pieces a prompt can produce are a small unigram model trained here on
the demo corpus (as the tiny T5's); they sit at ids spread over the whole vocabulary, the other
ids are filler pieces no prompt contains, so the seed table and the teacher's embedding have
the real 256384-row shape and prompts reach rows far past 65535.

Same seed, same files. Must not: download anything.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from gguf_trainer.base import atomic
from gguf_trainer.base.paths import TINY_MARKER
from gguf_trainer.tiny.t5_tiny import tiny_spm_corpus

UMT5_VOCAB = 256384  # UMT5-XXL's embedding rows (config vocab_size) and ggk's UMT5 seed table
SPECIAL = ("<pad>", "</s>", "<s>", "<unk>")  # ids 0-3 in UMT5 (the engine: PAD 0 EOS 1 BOS 2 UNK 3)

# UMT5 shape (gated-GELU, a relative position bias in every block), tiny sizes.
TINY_UMT5_CONFIG = {
    "architectures": ["UMT5EncoderModel"], "model_type": "umt5", "d_model": 64, "d_kv": 16,
    "num_heads": 4, "d_ff": 128, "num_layers": 2, "vocab_size": UMT5_VOCAB,
    "feed_forward_proj": "gated-gelu", "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128, "dropout_rate": 0.0, "layer_norm_epsilon": 1e-6,
    "initializer_factor": 1.0, "is_encoder_decoder": False, "use_cache": False,
    "tie_word_embeddings": False, "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0,
}
TINY_NOTE = "a tiny stand-in built by gguf_trainer.tiny.umt5; no reference figures apply\n"


def tiny_umt5_spm(vocab_size: int = UMT5_VOCAB) -> bytes:
    """A serialized sentencepiece ModelProto of `vocab_size` pieces: the 4 UMT5 specials, the
    pieces of a small unigram model trained on the demo corpus at evenly spread ids, and
    `▁<umt5-filler-N>` pieces (scored below every real piece) everywhere else."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(tiny_spm_corpus()), model_writer=buf, vocab_size=256,
        model_type="unigram", pad_id=0, eos_id=1, bos_id=2, unk_id=3, num_threads=1,
        hard_vocab_limit=False, shuffle_input_sentence=False, normalization_rule_name="identity",
        minloglevel=2)
    model = pb.ModelProto()
    model.ParseFromString(buf.getvalue())
    learned = list(model.pieces)[len(SPECIAL):]
    assert [p.piece for p in model.pieces[:len(SPECIAL)]] == list(SPECIAL)
    floor = min(p.score for p in learned) - 1.0
    step = (vocab_size - len(SPECIAL)) // len(learned)
    slots = {len(SPECIAL) + k * step + step // 2: p for k, p in enumerate(learned)}
    pieces = list(model.pieces[:len(SPECIAL)])
    for i in range(len(SPECIAL), vocab_size):
        hit = slots.get(i)
        pieces.append(hit if hit is not None else
                      pb.ModelProto.SentencePiece(piece=f"\u2581<umt5-filler-{i}>", score=floor))
    del model.pieces[:]
    model.pieces.extend(pieces)
    model.trainer_spec.vocab_size = vocab_size
    return model.SerializeToString()


def tiny_umt5_state(seed: int = 0) -> dict:
    """The encoder's tensors as the Wan snapshot stores them: bf16, no tied duplicate."""
    import torch
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    model = UMT5EncoderModel(UMT5Config(**TINY_UMT5_CONFIG))
    state = model.state_dict()
    state.pop("encoder.embed_tokens.weight", None)  # tied to shared.weight (one copy in the file)
    return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in state.items()}


def build_tiny_umt5(dest: Path, seed: int = 0) -> Path:
    """Write `text_encoder/{config.json, model.safetensors}`, `tokenizer/spiece.model` and the
    tiny-teacher marker under `dest` (each atomically); returns `dest`."""
    from safetensors.torch import save_file

    dest = Path(dest)
    (dest / "text_encoder").mkdir(parents=True, exist_ok=True)
    (dest / "tokenizer").mkdir(parents=True, exist_ok=True)
    atomic.write_text(dest / TINY_MARKER, TINY_NOTE)
    atomic.write_bytes(dest / "tokenizer" / "spiece.model", tiny_umt5_spm())
    atomic.write_text(dest / "text_encoder" / "config.json",
                      json.dumps(TINY_UMT5_CONFIG, indent=2, sort_keys=True) + "\n")
    with atomic.atomic_path(dest / "text_encoder" / "model.safetensors") as tmp:
        save_file(tiny_umt5_state(seed), str(tmp), metadata={"format": "pt"})
    return dest
