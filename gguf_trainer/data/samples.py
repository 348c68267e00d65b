"""Sample records: what one training example is, on disk and in memory.

A sample is a record, not a line: its text, the images it references (a MageFlow edit
sample has one or two; a text-only sample none) and any extra fields a pack needs.
The corpus stage writes `data/{split}.jsonl`, one JSON object per line:

    {"text": "make it night", "images": ["images/3f1c….png"]}
    {"text": "a red fox, oil painting"}

`images` (optional) are paths relative to the folder of the .jsonl file (the corpus
copies every image into `data/images/`, named by content hash); other keys are kept in
`extra` for packs. Library code: no projects, packs or torch. The reader streams: a
split of 100k image samples is never held in memory as a list unless asked for.

    write_samples(path, samples)            # atomic
    for s in iter_samples(path): ...         # streaming, images resolved to absolute paths
    n = count_samples(path)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gguf_trainer.base import atomic
from gguf_trainer.base.errors import UserError


@dataclass(frozen=True)
class Sample:
    """One example. `images` are absolute paths once read back with `iter_samples`."""

    text: str
    images: tuple[Path, ...] = ()
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    # line of the split file (0-based), set by the reader
    index: int = field(default=-1, compare=False)

    def to_record(self, base: Path | None = None) -> dict:
        rec: dict = {"text": self.text}
        if self.images:
            rec["images"] = [_rel(p, base) for p in self.images]
        rec.update(self.extra)
        return rec


def _rel(path: Path, base: Path | None) -> str:
    p = Path(path)
    if base is not None and p.is_absolute():
        try:
            return p.relative_to(base).as_posix()
        except ValueError:
            pass
    return p.as_posix()


def from_record(rec: dict, base: Path, index: int = -1) -> Sample:
    """A Sample from a parsed record; relative image paths are resolved against `base`."""
    images = tuple((base / p) if not os.path.isabs(p) else Path(p) for p in rec.get("images") or ())
    extra = {k: v for k, v in rec.items() if k not in ("text", "images")}
    return Sample(rec["text"], images, extra, index)


def write_samples(path: Path, samples: Iterable[Sample]) -> int:
    """Write records atomically (images relative to the file's folder); returns the count."""
    base = Path(path).parent
    lines = [json.dumps(s.to_record(base), ensure_ascii=False) + "\n" for s in samples]
    atomic.write_text(path, "".join(lines))
    return len(lines)


def iter_samples(path: Path, start: int = 0, stop: int | None = None) -> Iterator[Sample]:
    """Samples [start, stop) of a split file written by `write_samples`, streamed line by line."""
    base = Path(path).parent
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if stop is not None and i >= stop:
                return
            if i < start:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise UserError(f"{path} line {i + 1} is not a JSON record; delete {path.parent} "
                                "to rebuild the corpus.") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                raise UserError(f"{path} line {i + 1} has no \"text\" string; delete {path.parent} "
                                "to rebuild the corpus.")
            yield from_record(rec, base, i)


def read_samples(path: Path) -> list[Sample]:
    return list(iter_samples(path))


def count_samples(path: Path) -> int:
    """Records in a split file (one per line), without parsing them."""
    with open(path, "rb") as f:
        return sum(1 for _ in f)
