"""Prompt files the user brings: `.txt` (one prompt per line) and `.jsonl` (a "text" string
per line, optionally "images": [paths relative to the .jsonl file] for packs that take
images) -> Sample records (gguf_trainer.data.samples), decoded and cleaned.

Any bytes are accepted, by one rule (`decode_lines` + `clean_text`), each case counted in
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
Whitespace is normalised here, once; from then on the exact text is what the student and
the teacher see. Images are not opened here (the corpus stage checks them). Knows nothing
of projects; imports no torch.

    samples = read_source(Path("prompts.jsonl"), tally)   # [Sample], images as absolute paths
"""

from __future__ import annotations

import codecs
import json
import re
from collections import Counter
from pathlib import Path

from gguf_trainer.base import atomic
from gguf_trainer.base.errors import UserError
from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.prompt_syntax import training_text

_SURROGATE = re.compile("[\ud800-\udfff]")
_BINARY_BYTES = re.compile(rb"[\x00-\x08\x0e-\x1f]")  # control bytes text files do not hold
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def normalize(text: str) -> str:
    return " ".join(text.split())


def decode_lines(raw: bytes, tally: Counter) -> list[str | None]:
    """The lines of a prompt file's bytes (None = a binary line, skipped). See the module doc."""
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return raw.decode("utf-16", errors="replace").replace("\r\n", "\n").split("\n")
    raw = raw.removeprefix(codecs.BOM_UTF8)
    out: list[str | None] = []
    for line in raw.split(b"\n"):
        line = line.removesuffix(b"\r")
        if b"\x00" in line:
            tally["binary"] += 1
            out.append(None)
            continue
        try:
            out.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            tally["legacy"] += 1
            try:
                out.append(line.decode("cp1252"))
            except UnicodeDecodeError:
                out.append(line.decode("latin-1"))
    return out


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


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise UserError(f"prompt file {path} does not exist; fix the path under Corpus.")
    try:
        return path.read_bytes()
    except OSError as e:
        raise UserError(
            f"prompt file {path} cannot be read ({e.strerror}); check the file."
        ) from None


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


def _refuse_binary(path: Path, raw: bytes) -> None:
    """A file that is mostly binary lines is not a prompt list: refused with a sentence."""
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return
    lines = [line for line in raw.split(b"\n") if line.strip()]
    bad = sum(1 for line in lines if _is_binary_line(line))
    if lines and bad * 2 > len(lines):
        raise UserError(
            f"prompt file {path} is not a text file ({bad} of {len(lines)} lines are "
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
    raw = _read_bytes(path)
    _refuse_binary(path, raw)
    lines = decode_lines(raw, tally)
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it is not an empty prompt
    if suffix == ".txt":
        texts = (clean_text(s, tally) for s in lines if s is not None)
        out = [Sample(t) for t in texts if t is not None]
    else:
        base = path.parent.resolve()
        maybe = [_jsonl_sample(s, base, tally) for s in lines if s is not None and s.strip()]
        out = [s for s in maybe if s is not None]
    return out
