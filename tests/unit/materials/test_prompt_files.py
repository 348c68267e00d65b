"""Prompt files that never end (issue 29, item 5): a one-line file of GiBs, a FIFO, a line past
any prompt are refused in one sentence naming the file (and the line), never read whole."""

from __future__ import annotations

import codecs
import os
import tracemalloc
from types import SimpleNamespace

import pytest

from gguf_trainer.base.errors import UserError
from gguf_trainer.materials.prompt_files import MAX_LINE_BYTES, read_source


def test_a_2_gib_one_line_corpus_file_is_a_sentence_naming_the_file_and_line(tmp_path):
    path = tmp_path / "corpus.txt"
    with open(path, "wb") as f:
        f.truncate(2 << 30)  # sparse: read whole it would be 2 GiB of memory, twice over
    tracemalloc.start()
    try:
        with pytest.raises(UserError) as info:
            read_source(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(info.value)
    assert f"prompt file {path} has a line 1 longer than {MAX_LINE_BYTES:,} bytes" in msg
    assert "\n" not in msg and peak < 8 * MAX_LINE_BYTES


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_the_long_line_is_named_by_its_number(tmp_path, suffix):
    path = tmp_path / f"p{suffix}"
    path.write_bytes(b'{"text": "a cat"}\n' * 2 + b"x" * (MAX_LINE_BYTES + 1) + b"\n")
    with pytest.raises(UserError, match="has a line 3 longer than"):
        read_source(path)
    path.write_bytes(b'{"text": "a cat"}\n' + b"y" * MAX_LINE_BYTES + b"\n")  # at the bound
    assert len(read_source(path)) == (1 if suffix == ".jsonl" else 2)


def test_a_utf16_file_is_streamed_with_the_same_bound(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes(("a red fox\r\nan owl\n" + "z" * MAX_LINE_BYTES).encode("utf-16"))
    with pytest.raises(UserError, match="has a line 3 longer than"):
        read_source(path)
    path.write_bytes("a red fox\r\nan owl\n".encode("utf-16"))
    assert [s.text for s in read_source(path)] == ["a red fox", "an owl"]
    assert path.read_bytes().startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))


def test_a_fifo_prompt_file_is_a_sentence_not_a_hang(tmp_path):
    path = tmp_path / "prompts.txt"
    os.mkfifo(path)
    with pytest.raises(UserError, match="prompt file .*prompts.txt is not a regular file"):
        read_source(path)


def test_a_refused_file_adds_nothing_to_the_tally(tmp_path):
    from collections import Counter

    path = tmp_path / "p.txt"
    path.write_bytes(b"caf\xe9\n" + b"\x00\x01\x02\n" * 5)
    tally = Counter()
    with pytest.raises(UserError, match="is not a text file"):
        read_source(path, tally)
    assert not tally


def _pad(n: int) -> bytes:
    """`n` bytes of blank lines (a .jsonl skips them)."""
    k, rest = divmod(n, 1000)
    return (b" " * 999 + b"\n") * k + (b" " * (rest - 1) + b"\n" if rest else b"")


def test_the_corpus_fingerprint_streams_the_file(tmp_path):
    from gguf_trainer.stages import corpus

    path = tmp_path / "prompts.jsonl"
    line = b'{"text": "a cat", "images": ["cat.png"]}\n'
    at = (1 << 20) - 3  # "images" across the first MiB's edge: still found
    path.write_bytes(_pad(at - line.index(b'"images"')) + line + _pad(64 << 20))
    settings = SimpleNamespace(corpus=SimpleNamespace(
        files=[str(path)], train_file=None, val_file=None,
        model_dump=lambda mode: {"files": [str(path)], "train_file": None, "val_file": None}))
    tracemalloc.start()
    try:
        fp = corpus.fingerprint_inputs(settings)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert fp["files"][0]["bytes"] == path.stat().st_size and "images" in fp
    assert peak < 16 << 20  # a MiB at a time, not the 65 MiB file
