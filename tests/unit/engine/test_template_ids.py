"""Every pack's student ids follow the engine's chunked rule (conditioner.hpp 2551-2623,
3443-3464, PixArtT5Embedder): template pieces tokenized one by one, the prompt's weight chunks
each on its own, the engine's Qwen2 BPE (no NFC). Expected ids are built from the pieces by
hand; the Hugging Face tokenizer on the joined string is the old (wrong) reading they differ
from. tests/engine compares the same rule with the engine's own code."""

from __future__ import annotations

import pytest

from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.qwen_bpe import SPECIAL_IDS, engine_bpe, token_split
from gguf_trainer.engine.template_ids import Piece, chunks, student_ids
from gguf_trainer.model.student import load_student, load_tokenizer
from gguf_trainer.packs import get_pack
from gguf_trainer.tiny import qwen_tokenizer_dir

LLADA_HUMAN = "<role>HUMAN</role> Generate an image:"
LLADA_TAIL = "\n<role>ASSISTANT</role>\n<IMAGE1>"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(qwen_tokenizer_dir())


@pytest.fixture(scope="module")
def enc(tok):
    return engine_bpe(tok).encode


def hf(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_llada_prompt_ending_in_punctuation_keeps_the_engines_30_ids(tok, enc):
    pack = get_pack("llada_image")
    ids = pack.student_ids(enc, Sample("a sheep in sunglasses."))
    assert len(ids) == 30
    assert ids == hf(tok, LLADA_HUMAN) + hf(tok, " a sheep in sunglasses.") + hf(tok, LLADA_TAIL)
    assert len(hf(tok, pack.format_prompt("a sheep in sunglasses."))) == 29  # "." merged with "\n"


def test_llada_weighted_prompt_is_chunked_with_the_space_its_own_chunk(tok, enc):
    pack = get_pack("llada_image")
    ids = pack.student_ids(enc, Sample("(a cat in a hat:1.2)"))
    assert [c for p in pack.student_pieces(Sample("(a cat in a hat:1.2)")) for c in chunks(p)] == [
        LLADA_HUMAN, " ", "a cat in a hat", LLADA_TAIL]
    assert ids == hf(tok, LLADA_HUMAN) + hf(tok, " ") + hf(tok, "a cat in a hat") + hf(
        tok, LLADA_TAIL
    )
    assert ids != hf(tok, LLADA_HUMAN + " a cat in a hat" + LLADA_TAIL)


def test_llada_teacher_reads_the_weighted_prompts_words_without_brackets():
    pack = get_pack("llada_image")
    assert (
        pack.format_prompt("(a cat:1.2) in [rain]") == LLADA_HUMAN + " a cat in rain" + LLADA_TAIL
    )


def test_llada_empty_prompt_is_the_engines_single_piece(enc, tok):
    pack = get_pack("llada_image")
    (piece,) = pack.student_pieces(Sample(""))
    assert piece == Piece("<role>HUMAN</role> Generate an image.\n<role>ASSISTANT</role>\n<IMAGE1>")
    assert pack.student_ids(enc, Sample("")) == hf(tok, piece.text)
    assert pack.format_prompt("") == piece.text  # the teacher's pipeline form is the same string


def test_pixart_student_reads_the_raw_chunks_and_empty_is_the_qwen_pad(tok, enc):
    pack = get_pack("t5xxl_pixart")
    assert pack.student_ids(enc, Sample("")) == [151643]
    assert pack.student_ids(enc, Sample("an (important) word")) == (
        hf(tok, "an ") + hf(tok, "important") + hf(tok, " word")
    )


def test_mageflow_edit_pieces_keep_image_runs_where_the_engine_splices(tok, enc):
    pack = get_pack("qwen3vl_mageflow")
    sample = Sample("make it night.", images=("a.png", "b.png"))
    ids = pack.student_ids(enc, sample, (6, 4))
    runs = [i for i, t in enumerate(ids) if t == SPECIAL_IDS["<|image_pad|>"]]
    assert runs[0] == 70 and runs[6] == 70 + 6 + 1 + 6  # 64 + 6, then 1 + n + 6 later
    assert len(runs) == 10
    assert (
        len(hf(tok, pack.student_text(Sample(""))))
        == len(pack.student_ids(enc, Sample("")))
        == 34 + 5
    )


def test_the_engines_bpe_does_not_nfc_normalise(tok, enc):
    decomposed = "a cafe\u0301 at dusk"
    assert enc(decomposed) != hf(tok, decomposed)  # Hugging Face composes é first
    assert enc(decomposed) == enc("a cafe") + hf(tok, "\u0301") + enc(" at") + enc(" dusk")
    assert enc("a café at dusk") == hf(tok, "a café at dusk")


def test_the_engines_pre_split_quirks():
    assert token_split("It'S") == ["It", "'s"]  # the contraction is lowercased, as the engine does
    assert token_split("x²") == ["x", "²"]  # \p{N} is ASCII digits only: ² is punctuation
    assert token_split("a\u3000b") == ["a", "\u3000b"]  # U+3000 joins the next word's piece
    assert token_split("a  b") == ["a", " ", " b"]


def test_characters_the_engines_isspace_reads_as_space_are_dropped(enc, tok):
    """tokenize_util.cpp calls C isspace on code points past 255 (undefined: glibc reads past its
    table, qwen_cspace.py); the engine built on Linux drops what it answers "space" for."""
    assert enc("１２３") == [] and enc("ＡＢＣ１２３") == enc("ＡＢＣ")  # full-width digits
    assert enc("a🚀") == enc("a") and enc("a😀") != enc("a")  # U+1F680 dropped, U+1F600 kept
    assert hf(tok, "１２３") != []


def test_precompute_and_check_use_the_rule(tiny_materials):
    """The student ids the pipeline stores are the pack's engine ids (not the joined string's)."""
    from gguf_trainer.stages import precompute_shard

    student = load_student(tiny_materials["student"], tiny_materials["tokenizer"])

    class Ctx:
        pack = get_pack("llada_image")
        vision_proj = None

    Ctx.student = student

    class Teacher:
        def lengths(self, samples, ids):
            return [1 for _ in samples]

    Ctx.teacher = Teacher()
    samples, _, _ = precompute_shard.tokenize_samples(Ctx, [Sample("a sheep in sunglasses.")], 0)
    assert samples[0].ids == student_ids(
        engine_bpe(student.tokenizer).encode,
        Ctx.pack.student_pieces(Sample("a sheep in sunglasses.")),
    )
    assert len(samples[0].ids) == 30
