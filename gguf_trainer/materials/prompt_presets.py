"""Public prompt datasets: what they are on the Hub, and reading one column of them.

Each preset is a downloadable material (a `HubDataset`): only its data files are fetched,
with the same resumable, locked, verified downloads as a teacher (runner.downloads), into
`<project>/materials/datasets/<name>` (or a complete copy found elsewhere is linked).
Reading takes only the prompt column: parquet through pyarrow's column projection (the
other column chunks, e.g. DiffusionDB's image metadata, are never read), CSV through
pyarrow's streaming reader with `include_columns` (rows it cannot parse are skipped and
counted). Never `datasets.load_dataset` of a whole split: VidProM is 1.67M rows next to a
20 GB embedding file, DiffusionDB 2M rows next to 14M images.

Their fingerprint is repo + revision + commit + each data file's hash, taken from the
listing saved at download time (the Hub's sha256 of each LFS file, checked when the file
arrived), so a corpus rebuilds only when the data really changed.

Library code: no project I/O beyond reading the folders it is given.

    for text in read_preset(folder, PRESETS["gustavosta"], tally): ...
    pools = {"gustavosta": [...], "files": [...]}; mix_pools(pools, {"files": 3}, 60000, rng)
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gguf_trainer.base.errors import UserError
from gguf_trainer.materials.folder_check import LISTING_JSON, MANIFEST_DIR, local_files, matches
from gguf_trainer.materials.spec import Material

BATCH_ROWS = 65536
PARQUET_CONVERSION = "refs/convert/parquet"  # the Hub's own parquet export of a dataset


@dataclass(frozen=True)
class HubDataset(Material):
    """A dataset material: its revision and how to read it (column, format)."""

    revision: str = "main"
    column: str = ""
    fmt: str = "parquet"  # "parquet" | "csv"
    rows: int = 0  # about how many rows it has (for the UI)


def _preset(pid: str, title: str, repo: str, revision: str, patterns: tuple, column: str,
            fmt: str, rows: int, size_gb: float) -> HubDataset:
    return HubDataset(id=f"prompts_{pid}", title=f"Prompts: {title}", kind="hf_snapshot",
                      repo=repo, patterns=patterns, subdir=f"datasets/{repo.split('/')[-1]}",
                      required=False, size_gb=size_gb, repo_type="dataset",
                      hint=f"{repo}, column {column!r}", revision=revision, column=column,
                      fmt=fmt, rows=rows)


# Sizes are the data files only (what is downloaded), as listed on the Hub.
PRESETS: dict[str, HubDataset] = {
    "gustavosta": _preset("gustavosta", "Stable Diffusion prompts (~80k)",
                          "Gustavosta/Stable-Diffusion-Prompts", PARQUET_CONVERSION,
                          ("default/train/*.parquet",), "Prompt", "parquet", 73_718, 0.01),
    "midjourney": _preset("midjourney", "Midjourney prompts (~250k)",
                          "succinctly/midjourney-prompts", PARQUET_CONVERSION,
                          ("default/train/*.parquet",), "text", "parquet", 249_734, 0.1),
    "diffusiondb": _preset("diffusiondb", "DiffusionDB prompts (~2M rows, ~1.8M unique)",
                           "poloclub/diffusiondb", "main", ("metadata.parquet",), "prompt",
                           "parquet", 2_000_000, 0.6),
    "vidprom": _preset("vidprom", "VidProM prompts (~1.67M)", "WenhaoWang/VidProM", "main",
                       ("VidProM_unique.csv",), "prompt", "csv", 1_670_000, 0.38),
}


def preset_ids() -> list[str]:
    return list(PRESETS)


def get_preset(pid: str) -> HubDataset:
    try:
        return PRESETS[pid]
    except KeyError:
        raise UserError(
            f"unknown prompt dataset {pid!r}; choose from {', '.join(PRESETS)}."
        ) from None


def data_files(folder: Path, preset: HubDataset) -> list[Path]:
    files = sorted(p for p in local_files(folder) if matches(p, preset.patterns))
    return [folder / p for p in files]


def iter_column(
    source: str | Path | BinaryIO, column: str, fmt: str, tally: Counter
) -> Iterator[str]:
    """The strings of one column, streamed in batches; other columns are never decoded
    (parquet: never read). Missing or non-text values are counted in `tally["empty"]`,
    unparsable CSV rows in `tally["bad_row"]`."""
    import pyarrow as pa

    if fmt == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(source)
        if column not in pf.schema_arrow.names:
            raise UserError(
                f"{_name(source)} has no column {column!r} (it has "
                f"{', '.join(pf.schema_arrow.names[:8])}); the dataset changed."
            )
        batches = pf.iter_batches(batch_size=BATCH_ROWS, columns=[column])
    elif fmt == "csv":
        from pyarrow import csv

        def skip(_row) -> str:
            tally["bad_row"] += 1
            return "skip"

        try:
            batches = csv.open_csv(
                source,
                read_options=csv.ReadOptions(block_size=1 << 22),
                parse_options=csv.ParseOptions(newlines_in_values=True, invalid_row_handler=skip),
                convert_options=csv.ConvertOptions(
                    include_columns=[column], column_types={column: pa.string()}
                ),
            )
        except pa.ArrowInvalid as e:
            raise UserError(
                f"{_name(source)} cannot be read as CSV with a {column!r} column "
                f"({e}); the dataset changed."
            ) from None
    else:
        raise ValueError(f"unknown format {fmt!r}")
    for batch in batches:
        for value in batch.column(0).to_pylist():
            if isinstance(value, str) and value.strip():
                yield value
            else:
                tally["empty"] += 1


def _name(source) -> str:
    return str(source) if isinstance(source, (str, Path)) else getattr(source, "name", "the file")


def read_preset(
    folder: str | Path, preset: HubDataset, tally: Counter | None = None, limit: int | None = None
) -> Iterator[str]:
    """Prompts of a downloaded preset folder, file by file, up to `limit`."""
    tally = tally if tally is not None else Counter()
    files = data_files(Path(folder), preset)
    if not files:
        raise UserError(
            f"{folder} holds no {', '.join(preset.patterns)} of {preset.repo}; "
            f"download it (gguf-trainer download --id {preset.id})."
        )
    n = 0
    for path in files:
        for text in iter_column(path, preset.column, preset.fmt, tally):
            yield text
            n += 1
            if limit is not None and n >= limit:
                return


def fingerprint(folder: str | Path, preset: HubDataset, hashes_json: Path | None = None) -> dict:
    """repo, revision, commit and a hash per data file: from the saved listing, else (a
    copy linked from elsewhere) sha256 of the files, cached in `hashes_json`."""
    folder = Path(folder)
    try:
        listing = json.loads((folder / MANIFEST_DIR / LISTING_JSON).read_text(encoding="utf-8"))
        files = {p: f.get("sha256") or f.get("blob_id") for p, f in listing["files"].items()}
        commit = listing.get("commit")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        from gguf_trainer.materials.materials import files_sha256

        paths = data_files(folder, preset)
        files = dict(
            zip((p.relative_to(folder).as_posix() for p in paths), files_sha256(paths, hashes_json))
        )
        commit = None
    return {
        "repo": preset.repo,
        "revision": preset.revision,
        "commit": commit,
        "column": preset.column,
        "files": dict(sorted(files.items())),
    }


def mix_pools(
    pools: dict[str, list[str]], weights: dict[str, float], n: int, rng: random.Random
) -> list[str]:
    """`n` prompts drawn from the pools in proportion to `weights` (missing weight = the
    pool's size, i.e. plain concatenation). A pool smaller than its share gives all it
    has and the rest is shared among the others. Each pool is drawn without replacement
    in a seeded order; the result is shuffled."""
    unknown = [k for k in weights if k not in pools]
    if unknown:
        raise UserError(
            f"corpus.weights names {', '.join(unknown)}, which is not a selected "
            f"source ({', '.join(pools)}); remove it or select it."
        )
    bad = [k for k, w in weights.items() if not w >= 0]
    if bad:
        raise UserError(f"corpus.weights must be 0 or more ({', '.join(bad)} is not).")
    order = {k: rng.sample(v, len(v)) for k, v in pools.items()}
    wanted = {k: float(weights.get(k, len(v))) for k, v in pools.items()}
    take = dict.fromkeys(pools, 0)
    left = min(n, sum(len(v) for k, v in pools.items() if wanted[k] > 0))
    while left > 0:
        open_ = {k: w for k, w in wanted.items() if w > 0 and take[k] < len(pools[k])}
        total = sum(open_.values())
        if not total:
            break
        shares = {k: max(1, int(left * w / total)) for k, w in open_.items()}
        for k, share in shares.items():
            got = min(share, len(pools[k]) - take[k], left)
            take[k] += got
            left -= got
    out = [p for k in pools for p in order[k][: take[k]]]
    rng.shuffle(out)
    return out
