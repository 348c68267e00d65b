"""Prompt files the user brings: `.txt` (one prompt per line) and `.jsonl` (a "text" string
per line, optionally "images": [paths relative to the .jsonl file] for packs that take
images) -> Sample records (gguf_trainer.data.samples), decoded and cleaned.

Any bytes are accepted, by one rule (`decode_line` + `clean_text`), each case counted in
the caller's tally (the corpus stage logs the counts, corpus_build.REASONS):
  * UTF-8, with or without a BOM, is read as is; a UTF-16 file with a BOM is decoded as UTF-16;
  * a line that is not valid UTF-8 is decoded as Windows-1252 (latin-1 for the 5 bytes
    cp1252 leaves undefined): legacy files are read, never dropped;
  * a line holding NUL bytes is binary data (or UTF-16 without a BOM) and is skipped;
  * a file whose lines are mostly binary (NUL or other control bytes, or bytes that neither
    UTF-8 nor Windows-1252 reads) is refused as "not a text file": training on the scraps
    that survive decoding would be training on noise;
  * lone surrogates (from JSON escapes) are removed, other control characters become spaces;
  * a .jsonl line that is not a JSON object with a "text" string is skipped;
  * prompt-weight syntax (`(x)`, `(x:1.2)`, `[x]`, `\\(`) is kept: the student and T5 ids are
    the engine's chunk ids (template_ids.py), as at inference; a prompt the engine's parser
    throws on is skipped (prompt_syntax.training_text, an exact port of that parser).
The file is streamed a line at a time (a multi-GB prompt list costs its samples, not its bytes
twice over): only a regular file is opened (a FIFO or a device is a sentence, never a hang), and
a line longer than MAX_LINE_BYTES (more than any prompt can be: a 2 GiB one-line file) is
refused in one sentence naming the file and the line, before it is held in memory.
Whitespace is normalised here, once; from then on the exact text is what the student and
the teacher see. Images are not opened here (the corpus stage checks them). Knows nothing
of projects; imports no torch.

    samples = read_source(Path("prompts.jsonl"), tally)   # [Sample], images as absolute paths
"""

from __future__ import annotations

import codecs
import io
import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from gguf_trainer.base import atomic, bounded
from gguf_trainer.base.errors import UserError
from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.prompt_syntax import training_text

_SURROGATE = re.compile("[\ud800-\udfff]")
_BINARY_BYTES = re.compile(rb"[\x00-\x08\x0e-\x1f]")  # control bytes text files do not hold
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def normalize(text: str) -> str:
    return " ".join(text.split())


def decode_line(line: bytes, tally: Counter) -> str | None:
    """One line of a prompt file's bytes (no newline) as text (None = a binary line, skipped).
    See the module doc."""
    line = line.removesuffix(b"\r")
    if b"\x00" in line:
        tally["binary"] += 1
        return None
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        tally["legacy"] += 1
        try:
            return line.decode("cp1252")
        except UnicodeDecodeError:
            return line.decode("latin-1")


def clean_text(text: str, tally: Counter) -> str | None:
    """Text the tokenizer and a UTF-8 file can hold: no lone surrogates, no control characters,
    whitespace collapsed, weight syntax kept. None: the engine's parser throws on it.
    Every prompt of every pack passes here (captions of image sources pass the same
    prompt_syntax.training_text in image_sources)."""
    if _SURROGATE.search(text):
        tally["surrogates"] += 1
        text = _SURROGATE.sub("", text)
    if _CONTROL.search(text.replace("\t", " ").replace("\n", " ").replace("\r", " ")):
        tally["control"] += 1
    return training_text(normalize(_CONTROL.sub(" ", text)), tally)


def read_prompts(path: Path) -> list[str]:
    """Prompts of a plain prompt list written by `write_prompts` (one per line, '' = empty)."""
    text = path.read_text(encoding="utf-8")
    return text[:-1].split("\n") if text else []


def write_prompts(path: Path, prompts: list[str]) -> None:
    atomic.write_text(path, "".join(p + "\n" for p in prompts))


# The longest line a prompt file may hold. No pack reads more than a few thousand tokens of a
# prompt (max_len_student / max_len_teacher; a longer sample is dropped), so a line of a MiB
# (a quarter of a million tokens and more, with a .jsonl line's other fields) is past any
# prompt by far; what the format implies, not a cap on the file, which is streamed.
MAX_LINE_BYTES = 1 << 20


def _open(path: Path) -> BinaryIO:
    """The prompt file opened for streaming: a regular file only (bounded.open_regular)."""
    try:
        if not bounded.exists_regular(path):
            raise UserError(f"prompt file {path} does not exist; fix the path under Corpus.")
        return bounded.open_regular(path)
    except bounded.NotRegular:
        raise UserError(
            f"prompt file {path} is not a regular file (a FIFO, a device or a folder), so it "
            "is not read; choose the text file itself under Corpus."
        ) from None
    except OSError as e:
        raise _unreadable(path, e) from None


def _unreadable(path: Path, e: OSError) -> UserError:
    return UserError(f"prompt file {path} cannot be read ({e.strerror}); check the file.")


def _too_long(path: Path, n: int) -> UserError:
    return UserError(
        f"prompt file {path} has a line {n} longer than {MAX_LINE_BYTES:,} bytes, more than "
        "any prompt can be, so it is not read; use a file with one prompt per line under "
        "Corpus."
    )


def _raw_lines(path: Path, f: BinaryIO) -> Iterator[bytes]:
    """The byte lines of a prompt file (split at "\\n", which is dropped), each read with a
    bound: a line over MAX_LINE_BYTES is a sentence, never held whole."""
    n = 0
    while True:
        line = f.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        n += 1
        if line.endswith(b"\n"):
            line = line[:-1]
        elif len(line) > MAX_LINE_BYTES:
            raise _too_long(path, n)
        yield line


def _utf16_lines(path: Path, f: BinaryIO) -> Iterator[str]:
    """The lines of a UTF-16 file (with its BOM), decoded as they stream, bounded the same."""
    limit = MAX_LINE_BYTES // 2  # characters: two bytes or more each
    text = io.TextIOWrapper(f, encoding="utf-16", errors="replace", newline="\n")
    n = 0
    while True:
        line = text.readline(limit + 1)
        if not line:
            return
        n += 1
        if line.endswith("\n"):
            line = line[:-1]
        elif len(line) > limit:
            raise _too_long(path, n)
        yield line.removesuffix("\r")


def _is_binary_line(line: bytes) -> bool:
    if _BINARY_BYTES.search(line):
        return True
    for encoding in ("utf-8", "cp1252"):
        try:
            line.decode(encoding)
            return False
        except UnicodeDecodeError:
            continue
    return True


def _refuse_binary(path: Path, bad: int, lines: int) -> None:
    """A file that is mostly binary lines (`bad` of its `lines` not blank) is not a prompt
    list: refused with a sentence."""
    if lines and bad * 2 > lines:
        raise UserError(
            f"prompt file {path} is not a text file ({bad} of {lines} lines are "
            "binary: NUL bytes, control bytes or bytes no text encoding reads), so it "
            "gives no usable prompts; choose a text file with one "
            "prompt per line under Corpus."
        )


def _jsonl_sample(line: str, base: Path, tally: Counter) -> Sample | None:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        rec = None
    images = rec.get("images", []) if isinstance(rec, dict) else None
    if (
        not isinstance(rec, dict)
        or not isinstance(rec.get("text"), str)
        or not isinstance(images, list)
        or not all(isinstance(p, str) and p for p in images)
    ):
        tally["bad_json"] += 1
        return None
    text = clean_text(rec["text"], tally)
    extra = {k: v for k, v in rec.items() if k not in ("text", "images")}  # for packs (samples.py)
    return None if text is None else Sample(text, tuple((base / p) for p in images), extra)


def read_source(path: Path, tally: Counter | None = None) -> list[Sample]:
    """The samples of one source file, decoded and cleaned (texts normalised, images as
    absolute paths, not yet checked). `tally` receives the counts of what was changed or
    skipped (legacy, binary, surrogates, control, bad_json, syntax_error)."""
    tally = Counter() if tally is None else tally
    suffix = path.suffix.lower()
    if suffix not in (".txt", ".jsonl"):
        raise UserError(
            f'{path} is neither .txt (one prompt per line) nor .jsonl (a "text" field '
            "per line); convert it or remove it from Corpus."
        )
    local: Counter = Counter()  # into `tally` only when the file is read: a refused one adds none
    base = path.parent.resolve() if suffix == ".jsonl" else path.parent
    out: list[Sample] = []
    bad = lines = 0

    def take(text: str | None) -> None:
        if suffix == ".txt":
            clean = None if text is None else clean_text(text, local)
            if clean is not None:
                out.append(Sample(clean))
        elif text is not None and text.strip():
            sample = _jsonl_sample(text, base, local)
            if sample is not None:
                out.append(sample)

    with _open(path) as f, bounded.reading(path, bounded.size_of(f)):
        try:
            if f.peek(2)[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
                for text in _utf16_lines(path, f):
                    take(text)
            else:
                for i, line in enumerate(_raw_lines(path, f)):
                    if line.strip():
                        lines += 1
                        bad += _is_binary_line(line)
                    take(decode_line(line.removeprefix(codecs.BOM_UTF8) if i == 0 else line,
                                     local))
        except OSError as e:
            raise _unreadable(path, e) from None
    _refuse_binary(path, bad, lines)
    tally.update(local)
    return out
