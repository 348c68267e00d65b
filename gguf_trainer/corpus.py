"""Corpus stage (text): local prompt files or ready-made train/val files -> data/train.txt, data/val.txt.

Whitespace is normalised here, once, when the corpus files are written; from then on
the exact line is what the student and the teacher see. One prompt per line, an empty
line is an empty prompt (the adapter must learn the empty CFG prompt). The split is
seeded, so the same settings and sources give the same files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from pathlib import Path

from . import atomic
from .errors import UserError

log = logging.getLogger(__name__)

TRAIN_TXT = "train.txt"
VAL_TXT = "val.txt"


def normalize(text: str) -> str:
    return " ".join(text.split())


def read_prompts(path: Path) -> list[str]:
    """Prompts of a corpus file as written by this stage (one per line, '' = empty prompt)."""
    text = path.read_text(encoding="utf-8")
    return text[:-1].split("\n") if text else []


def write_prompts(path: Path, prompts: list[str]) -> None:
    atomic.write_text(path, "".join(p + "\n" for p in prompts))


def _read_source(path: Path) -> list[str]:
    if not path.is_file():
        raise UserError(f"prompt file {path} does not exist; fix the path under Corpus.")
    if path.suffix.lower() == ".jsonl":
        prompts = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)["text"]
            except (json.JSONDecodeError, KeyError, TypeError):
                text = None
            if not isinstance(text, str):
                raise UserError(f"{path} line {n} is not a JSON object with a \"text\" string; "
                                "fix or remove that line.")
            prompts.append(text)
        return prompts
    if path.suffix.lower() == ".txt":
        return path.read_text(encoding="utf-8").splitlines()
    raise UserError(f"{path} is neither .txt (one prompt per line) nor .jsonl (a \"text\" field per line).")


def source_files(settings) -> list[Path]:
    c = settings.corpus
    paths = [c.train_file, c.val_file] if (c.train_file or c.val_file) else list(c.files)
    return [Path(p).expanduser() for p in paths]


def fingerprint_inputs(settings) -> dict:
    """The corpus settings plus a hash of every source file: what makes data/ current."""
    files = {}
    for p in source_files(settings):
        h = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "missing"
        files[str(p)] = h
    return {"settings": settings.corpus.model_dump(mode="json"), "files": files}


def _with_empties(prompts: list[str], frac: float, rng: random.Random) -> list[str]:
    """Insert ~frac empty prompts at seeded random positions (real prompts are kept)."""
    out = list(prompts)
    for _ in range(round(len(prompts) * frac)):
        out.insert(rng.randrange(len(out) + 1), "")
    return out


def build_split(settings) -> tuple[list[str], list[str]]:
    c = settings.corpus
    if c.train_file or c.val_file:
        if not (c.train_file and c.val_file):
            raise UserError("set both corpus.train_file and corpus.val_file, or neither.")
        train, val = (
            [normalize(p) for p in _read_source(Path(f).expanduser())] for f in (c.train_file, c.val_file))
        return train, val
    if not c.files:
        raise UserError("the corpus has no prompt sources; add .txt/.jsonl files under Corpus "
                        "(corpus.files) or set corpus.train_file and corpus.val_file.")
    pool, seen = [], set()
    for path in c.files:
        for raw in _read_source(Path(path).expanduser()):
            p = normalize(raw)
            if c.min_chars <= len(p) <= c.max_chars and p.lower() not in seen:
                seen.add(p.lower())
                pool.append(p)
    if len(pool) < c.n_val + 8:
        raise UserError(f"only {len(pool)} usable prompts after filtering; need more than {c.n_val + 8} "
                        "(add prompt files or lower corpus.n_val).")
    rng = random.Random(c.seed)
    rng.shuffle(pool)
    val, train = pool[: c.n_val], pool[c.n_val: c.n_val + c.n_train]
    if len(train) < c.n_train:
        log.warning("corpus: %d train prompts available, fewer than n_train=%d", len(train), c.n_train)
    return _with_empties(train, c.empty_frac, rng), _with_empties(val, c.empty_frac, rng)


def run_corpus(project, report) -> None:
    train, val = build_split(project.settings)
    out = project.paths.data
    write_prompts(out / VAL_TXT, val)
    write_prompts(out / TRAIN_TXT, train)
    n_empty = sum(1 for p in train if not p)
    log.info("corpus: %d train prompts (%d empty), %d val prompts", len(train), n_empty, len(val))
    report.progress(1, 1, "files", prompts=len(train) + len(val))
