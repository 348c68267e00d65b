"""Reading a ggk `SD_DUMP_COND` folder (engine-contract §4b): headerless little-endian f32
`[rows, dim]` files, id files of one decimal id per line, and an edit dump's reference images,
each bounded by what this check can hold and refused in one sentence when it is not the engine's.
Must not: write anything.

    rows = read_dump(folder, dim=2560, max_rows=256)    # the first of DUMP_FILES in the folder
    ids = read_ids(folder / TOKENS_TXT)                 # None when absent
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gguf_trainer.base import bounded
from gguf_trainer.base.errors import UserError

# Reference files, first found wins: an external teacher context (trainer8's m1 dump),
# the engine's adapter output, a plain LLM run.
DUMP_FILES = ("context.bin", "adapter_out.bin", "llm_hidden.bin")
TOKENS_TXT = "tokens.txt"
# the engine's student states: tells a student problem from an adapter one
QWEN_HIDDEN = "qwen_hidden.bin"
T5_IDS_TXT = "t5_ids.txt"
# why t5_ids.txt was not compared, when neither --t5-model nor a project's teacher gave a tokenizer
NO_T5_MODEL = ("pass --t5-model with the T5 teacher's spiece.model, or --project DIR with its "
               "teacher linked")
# an edit dump's reference images (conditioner.hpp 2753-2775): raw mmproj rows, "start n" each
VIS_EMBEDS = "vis_embeds.bin"
VIS_POS = "vis_pos.txt"


def read_dump(path, dim: int, max_rows: int) -> np.ndarray:
    """A dump file (or the first of DUMP_FILES in a folder) as float32 [rows, dim].
    `max_rows`: the most rows it can hold for this check (the rows the adapter makes for this
    prompt, the prompt's student tokens, the images' rows in vis_pos.txt): a larger file (an
    8 GiB context.bin, a 6 GiB sparse dump) is refused in one sentence before it is read."""
    path = Path(path)
    if path.is_dir():
        found = next((path / n for n in DUMP_FILES if (path / n).is_file()), None)
        if found is None:
            raise UserError(
                f"{path} holds none of {', '.join(DUMP_FILES)}; run the engine with "
                "SD_DUMP_COND set to that folder (it must exist), or name the .bin file."
            )
        path = found
    if not path.is_file():
        raise UserError(
            f"{path} does not exist; pass the SD_DUMP_COND folder or a .bin file in it."
        )
    with bounded.open_regular(path) as f:  # a FIFO or a device is refused, never read
        n_bytes = bounded.size_of(f)
        bounded.check_size(path, n_bytes, max_rows * dim * 4,
                           f"a dump of {max_rows} rows of {dim} f32 values (what this adapter "
                           "and prompt make)")
        if n_bytes == 0 or n_bytes % (4 * dim):
            raise UserError(
                f"{path} has {n_bytes} bytes, not a whole number of f32 rows of {dim}; "
                "it was not written for this adapter's output width."
            )
        with bounded.reading(path, n_bytes):
            rows = np.fromfile(f, dtype="<f4", count=n_bytes // 4)
    if rows.size != n_bytes // 4:  # shrunk while read
        raise UserError(f"{path} changed while it was read; run the check again.")
    rows = rows.reshape(-1, dim)
    if not np.isfinite(rows).all():
        raise UserError(f"{path} holds NaN or infinite values, so it is no measure of anything; "
                        "rerun the engine (its run that wrote this dump went wrong).")
    return rows


MAX_IDS_BYTES = 1 << 20


def read_ids(path) -> list[int] | None:
    """One decimal id per line, or None when the file is absent."""
    path = Path(path)
    if not path.is_file():
        return None
    # a line per token: bounded by 1 MiB, which no prompt's ids come near (ggk caps a prompt
    # far below 100k tokens); a FIFO or device is refused in a sentence
    data = bounded.read_bytes(path, MAX_IDS_BYTES, "an engine's tokens.txt")
    try:
        return [int(line) for line in data.decode("utf-8").split()]
    except ValueError:
        raise UserError(f"{path} is not one id per line; use the file the engine wrote.") from None


def read_vision_dump(dump_dir: Path, vis_dim: int) -> list[tuple[int, np.ndarray]] | None:
    """An edit dump's reference images as (start row, raw rows [n, vis_dim]) in order, or None
    when the dump has no `vis_pos.txt` (a text-only pass)."""
    path = dump_dir / VIS_POS
    if not path.is_file():
        return None
    try:  # a "start n" line per image: bounded as tokens.txt (a FIFO is a sentence)
        text = bounded.read_text(path, MAX_IDS_BYTES, "an engine's vis_pos.txt")
        runs = [tuple(int(v) for v in line.split()) for line in text.splitlines() if line.strip()]
    except (bounded.LargerThanImplied, bounded.NotRegular):
        raise
    except ValueError:  # not numbers, not UTF-8
        runs = [()]
    if not runs or any(len(r) != 2 or r[0] < 0 or r[1] <= 0 for r in runs):
        raise UserError(f"{path} is not one \"start rows\" pair per image; use the file the "
                        "engine wrote.")
    if not vis_dim:
        raise UserError(f"{dump_dir} is an edit dump (it has {VIS_POS}) but this adapter has no "
                        "vision extension; check it against a text-to-image dump.")
    rows = read_dump(dump_dir / VIS_EMBEDS, vis_dim, max_rows=sum(n for _, n in runs))
    if rows.shape[0] != sum(n for _, n in runs):
        raise UserError(f"{dump_dir / VIS_EMBEDS} holds {rows.shape[0]} rows but {VIS_POS} "
                        f"names {sum(n for _, n in runs)}; use the files of one engine run.")
    at = np.cumsum([0] + [n for _, n in runs])
    return [(s, rows[at[i] : at[i + 1]]) for i, (s, _) in enumerate(runs)]

