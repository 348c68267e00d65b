"""Disk pre-flight: will it fit where it goes? Refuse (or warn) with both numbers.

Used before a download (the bytes still to fetch, runner.downloads) and before a
precompute (the pack's shard bytes per sample × the corpus's sample counts × 1.1, minus
the shards already written). Reads only; the callers decide when to ask.

    require_free(dest, need_bytes, "callgg/t5-v1_1-xxl-encoder-bf16", "free space or link a copy")
    warning = check_precompute_disk(project)   # UserError if it cannot fit, a sentence if tight
"""

from __future__ import annotations

import shutil
from pathlib import Path

from gguf_trainer.base.errors import UserError

PRECOMPUTE_MARGIN = 1.1  # shard headers, stats files and the corpus beside the shards
TIGHT_SHARE = 0.9  # warn when a job would leave less than 10% of the free space


def free_bytes(path: str | Path) -> int:
    """Free bytes on the file system that holds `path` (or would, once created)."""
    probe = Path(path).expanduser().resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def gb(n: float) -> str:
    """Bytes for a sentence: GB above 1 GB, else MB (a tiny GB figure reads as zero)."""
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def require_free(path: str | Path, need_bytes: int, what: str, fix: str) -> None:
    free = free_bytes(path)
    if need_bytes > free:
        raise UserError(f"{what} needs {gb(need_bytes)} more at {path} but only {gb(free)} "
                        f"are free there; {fix}.")


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def sample_counts(project) -> dict[str, int]:
    """Samples per split: the corpus's real count (`data/{split}.jsonl`, one record a line)
    once it is written, else the settings (a small prompt file gives far fewer samples than
    the default corpus.n_train, and the estimate must not refuse it for a size it never has)."""
    from gguf_trainer.data.samples import count_samples

    c = project.settings.corpus
    wanted = {"train": c.n_train + round(c.n_train * c.empty_frac),
              "val": c.n_val + round(c.n_val * c.empty_frac)}
    out = {}
    for split, n in wanted.items():
        path = project.paths.samples(split)
        out[split] = count_samples(path) if path.is_file() else n
    return out


def shard_bytes_per_sample(project) -> int:
    """The pack's shard bytes per sample for the rows this project's recipe stores (K pad
    rows a sample, no row before the start row: data/recipe.py stored_rows)."""
    from gguf_trainer.data.recipe import Recipe, stored_rows

    pack = project.pack
    stored = stored_rows(Recipe.from_settings(project.settings.train, pack), pack)
    return pack.shard_bytes(stored.pads, stored.from_start)


def precompute_need_bytes(project) -> int:
    """Shard bytes still to write for the project's corpus (0 when the pack gives no size)."""
    per_sample = shard_bytes_per_sample(project)
    total = int(per_sample * sum(sample_counts(project).values()) * PRECOMPUTE_MARGIN)
    return max(0, total - _folder_bytes(project.paths.shards))


def check_precompute_disk(project) -> str | None:
    """UserError when the shards cannot fit; a warning sentence when they leave <10% free."""
    need = precompute_need_bytes(project)
    fix = "free space, move the project, or lower corpus.n_train"
    require_free(project.paths.shards, need, f"the precompute ({project.pack.id} shards)", fix)
    free = free_bytes(project.paths.shards)
    if need > TIGHT_SHARE * free:
        return (f"the precompute needs {gb(need)} and {gb(free)} are free at "
                f"{project.paths.shards}: less than 10% would be left")
    return None
