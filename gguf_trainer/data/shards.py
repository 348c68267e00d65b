"""Shard format, train statistics and the deterministic, resumable batch stream.

A shard is one safetensors file (no pickle) holding only the rows that must be stored,
in bf16, concatenated over its samples:

    student_rows [Ts, in_dim] bf16   final-norm states of the real student tokens
    student_ids  [Ts] int32          their token ids
    student_len  [S] int32
    target_rows  [Tt, out_dim] bf16  teacher rows: all queries / real slots / every token
    target_len   [S] int32
    target_keep  [Tt] bool           rows the loss and the figures read (absent: every row);
                                     0 at image slots whose rows the DiT never reads
    target_pos   [Tt] int32          token-aligned shards that store only some rows (K pads a
                                     sample, none before the start row: data/recipe.py
                                     stored_rows): the template row of each stored row
                                     (absent: rows 0..len-1, every row)
    seed_ids     [S, Q] int32        seeded resampler only: the T5 window
    sup_start    [S] int32           token-aligned only: first row the DiT consumes
    sample_index [S] int64           line of the corpus file
    vis_rows     [Tv, vis_dim] bf16  vision packs only: raw vision-tower rows of every image
    vis_pos      [Tv] int32          ...the student-token position each row is spliced at;
                                     with seed_ids (slot kinds) the teacher slot it sits on
    vis_len      [S] int32           ...rows per sample (0 for a text-only sample)
    moment_sum, moment_sq [out_dim] f64, moment_n [1] i64   per-dimension moments of the kept rows

The adapter's dims are read from the header (`dims`): in_dim = student_rows' width,
out_dim = target_rows', vis_dim = vis_rows' (0 without vision).
Metadata carries the inputs fingerprint, the pack contract, the mock flag and a sha256
over all tensor bytes: a truncated or corrupted shard fails `verify_shard` and is
recomputed, never trained on. Library code: knows nothing of projects or packs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load, save_file

from gguf_trainer.base import atomic, bounded, safe_delete
from gguf_trainer.base.errors import UserError
from gguf_trainer.engine.template_padding import unpadded_length

log = logging.getLogger(__name__)

FORMAT = "gguf-trainer-shard/1"
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on a header (safetensors/src/tensor.rs)
SUFFIX = ".safetensors"


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}{SUFFIX}"


def _checksum(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        if t.numel():
            h.update(t.view(torch.uint8).numpy())  # hashed in place: no copy of the shard
    return h.hexdigest()


def write_shard(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> None:
    """Atomically write a shard with its checksum."""
    metadata = {**meta, "format": FORMAT, "checksum": _checksum(tensors)}
    with atomic.atomic_path(path, suffix=SUFFIX) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
        _sort_metadata(tmp)


def _sort_metadata(path: Path) -> None:
    """safetensors writes the metadata in hash-map order, which differs between processes;
    sorted, the same shard is the same bytes whichever process (or rank) wrote it. The header
    keeps its length (same keys and values), so only the header is rewritten."""
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        text = json.dumps(header, separators=(",", ":")).encode()
        if len(text) > n:  # never: the same keys and values
            return
        f.seek(8)
        f.write(text.ljust(n, b" "))


def read_meta(path: Path) -> dict[str, str] | None:
    """The shard's metadata, or None when the file cannot be parsed (truncated, not a shard)."""
    try:
        bounded.open_regular(path).close()  # a FIFO would hang safe_open's open
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError):
        return None


def verify_shard(path: Path, fingerprint: str) -> str | None:
    """None when the shard is whole and made from `fingerprint`; else the reason it is not."""
    meta = read_meta(path)
    if meta is not None and meta.get("format") == FORMAT and meta.get("fingerprint") != fingerprint:
        return "made from other inputs"
    return check_shard(path)


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and metadata of one snapshot of the file's bytes. Read into memory, never
    memory-mapped: a shard truncated by another process while it is mapped would kill the
    trainer with SIGBUS instead of raising ShardCorrupted."""
    # A regular file only (a FIFO never blocks, /dev/zero is refused), read no further than
    # its header says it ends: a sparse 6 GiB file is refused before it is read.
    with bounded.open_regular(path) as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        bounded.check_size(path, n, min(bounded.size_of(f) - 8, MAX_HEADER_BYTES),
                           "a shard's header")
        header = json.loads(f.read(n))
        try:
            ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
        except (AttributeError, TypeError, KeyError, IndexError):
            raise ValueError("not a safetensors header") from None
        implied = 8 + n + max(ends, default=0)
        if bounded.size_of(f) != implied:
            raise ValueError("its size is not the one its header implies")
        f.seek(0)
        with bounded.reading(path, implied):  # out of memory: this shard, not the batch
            raw = f.read(implied)
    meta = header.get("__metadata__") or {}
    with bounded.reading(path, implied):
        return load(raw), meta


def check_shard(path: Path) -> str | None:
    """None when the shard is whole (every tensor byte matches the checksum it was written
    with); else the reason it is not. Reads the whole file."""
    try:
        tensors, meta = _read(path)
    except (SafetensorError, OSError, ValueError):
        return "unreadable or truncated"
    if meta.get("format") != FORMAT:
        return "unreadable or truncated"
    if _checksum(tensors) != meta.get("checksum"):
        return "checksum mismatch (corrupted)"
    return None


class ShardCorrupted(UserError):
    """A shard read for training or eval no longer matches the checksum it was written with
    (changed on disk after its first verification, truncated, or gone). The pipeline catches
    it, `discard()`s the file and runs the stages again: precompute redoes that shard and
    training resumes from last.pt. Raised only where the shard is used, so a prefetch that is
    never consumed deletes nothing."""

    def __init__(self, path: Path, reason: str):
        self.path, self.reason = Path(path), reason
        super().__init__(f"shard {path} is {reason}; delete it and start again to recompute "
                         "it (training resumes from last.pt).")

    def discard(self, inside: Path) -> None:
        """Delete the shard (derived data: the precompute stage recomputes a missing shard),
        by safe_delete's rule: only a regular file under `inside` (the project), never through
        a link (a shards/<split> linked elsewhere is one sentence, nothing deleted)."""
        if self.path.is_file() or self.path.is_symlink():
            safe_delete.unlink_owned(self.path, inside, safe_delete.DAMAGED_SHARD)


def load_verified(path: Path) -> dict[str, torch.Tensor]:
    """The shard's tensors, checked against its checksum on every read: the size+mtime cache
    of the precompute stage cannot see bytes that changed in place. ShardCorrupted otherwise."""
    if path.exists() and not path.is_file():  # never delete what we did not write
        raise UserError(f"{path} is not a shard file; move it away and start again to "
                        "recompute the shard.")
    try:
        tensors, meta = _read(path)
    except FileNotFoundError:
        raise ShardCorrupted(path, "missing") from None
    except (SafetensorError, OSError, ValueError):
        tensors = meta = None
    if tensors is None or meta.get("format") != FORMAT:
        reason = "unreadable or truncated"
    elif _checksum(tensors) != meta.get("checksum"):
        reason = "changed since it was written (checksum mismatch)"
    else:
        return tensors
    raise ShardCorrupted(path, reason)


@dataclass(frozen=True)
class Stats:
    """Per-dimension target statistics over the train split. sigma_f = max(sigma, floor) is
    the one scale used for whitening in training AND folded at export."""

    mu: torch.Tensor  # [D] float32
    sigma: torch.Tensor  # [D] float32, unfloored
    sigma_f: torch.Tensor  # [D] float32, floored
    n: int

    @property
    def n_floored(self) -> int:
        return int((self.sigma < self.sigma_f).sum())


def load_stats(files: list[Path], sigma_floor: float) -> Stats:
    s = s2 = None
    n = 0
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            a, b = f.get_tensor("moment_sum"), f.get_tensor("moment_sq")
            n += int(f.get_tensor("moment_n")[0])
        s, s2 = (a, b) if s is None else (s + a, s2 + b)
    mu = s / n
    var = (s2 / n - mu * mu).clamp_min(0.0)
    sigma = var.sqrt()
    return Stats(mu.float(), sigma.float(), sigma.clamp_min(sigma_floor).float(), n)


def student_dim(path: Path) -> int:
    """The student's hidden size, from a shard's header (the adapter's in_dim)."""
    return dims(path)["in_dim"]


def dims(path: Path) -> dict[str, int]:
    """{"in_dim", "out_dim", "vis_dim"} of the adapter these shards train, from the header;
    "bank_dim" too when they hold a second target set (data/bank_rows.py)."""
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
        vis = f.get_slice("vis_rows").get_shape()[1] if "vis_rows" in keys else 0
        bank = {"bank_dim": int(f.get_slice("bank_rows").get_shape()[1])} \
            if "bank_rows" in keys else {}
        return {"in_dim": int(f.get_slice("student_rows").get_shape()[1]),
                "out_dim": int(f.get_slice("target_rows").get_shape()[1]), "vis_dim": int(vis),
                **bank}


def linear_fit(files: list[Path], stats: Stats | None = None, max_rows: int = 65536):
    """Ridge fit target ≈ W·student + b over the token-aligned rows of `files` (at most
    `max_rows`, taken in file order); with `stats`, of the standardized targets (t − μ)/σ_f.
    Returns (weight (out, in), bias (out,)) float32: the least-squares start of `skip`."""
    from gguf_trainer.model.ridge import RidgeAccumulator

    acc = None
    for path in files:
        t = load_verified(path)  # read for training: checked like every other read
        if "target_pos" in t:  # the stored rows' student rows: each sample's offset + its row
            starts = torch.tensor(_offsets(t["student_len"])[:-1]).repeat_interleave(
                t["target_len"].long())
            t["student_rows"] = t["student_rows"][starts + t["target_pos"].long()]
            t["student_len"] = t["target_len"]
        if not torch.equal(t["student_len"], t["target_len"]):
            raise ValueError(f"{path} is not token-aligned: a linear start needs one row per token")
        x, y = t["student_rows"].float(), t["target_rows"].float()
        if "target_keep" in t:  # fit the rows the loss reads
            x, y = x[t["target_keep"]], y[t["target_keep"]]
        if stats is not None:
            y = (y - stats.mu) / stats.sigma_f
        acc = acc or RidgeAccumulator(x.shape[1], y.shape[1])
        take = max_rows - acc.n
        acc.add(x[:take], y[:take])
        if acc.n >= max_rows:
            break
    return acc.solve(bias=True)


class Shard:
    """A shard loaded into memory, with per-sample row offsets."""

    def __init__(self, path: Path):
        self.path = path
        self.t = load_verified(path)
        self.n = int(self.t["student_len"].shape[0])
        self.s_off = _offsets(self.t["student_len"])
        self.t_off = _offsets(self.t["target_len"])
        self.v_off = _offsets(self.t["vis_len"]) if "vis_len" in self.t else None
        self.keep = self.t.get("target_keep")
        self.pos = self.t.get("target_pos")

    @property
    def selects_rows(self) -> bool:
        """Whether some target rows are not read: image slots (target_keep) or rows not
        stored (target_pos)."""
        return self.keep is not None or self.pos is not None

    def target_keep(self, i: int) -> torch.Tensor:
        """(R,) bool: the target rows of sample i that the loss and the figures read (rows a
        shard does not store are never read)."""
        a, b = self.t_off[i], self.t_off[i + 1]
        keep = torch.ones(b - a, dtype=torch.bool) if self.keep is None else self.keep[a:b]
        if self.pos is None:
            return keep
        out = torch.zeros(self._rows(i), dtype=torch.bool)
        out[self.pos[a:b].long()] = keep
        return out

    def _rows(self, i: int) -> int:
        """Template rows of sample i (token-aligned: one per student id)."""
        return self.s_off[i + 1] - self.s_off[i]

    def student(self, i: int) -> torch.Tensor:
        return self.t["student_rows"][self.s_off[i]: self.s_off[i + 1]]

    def target(self, i: int) -> torch.Tensor:
        """(R, D) the target rows of sample i at their template rows; a row the shard does not
        store is 0 there (target_keep says it is not read)."""
        rows = self.t["target_rows"][self.t_off[i]: self.t_off[i + 1]]
        if self.pos is None:
            return rows
        out = torch.zeros(self._rows(i), rows.shape[1], dtype=rows.dtype)
        out[self.pos[self.t_off[i]: self.t_off[i + 1]].long()] = rows
        return out

    def student_ids(self, i: int) -> torch.Tensor:
        return self.t["student_ids"][self.s_off[i]: self.s_off[i + 1]]

    def vision(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw vision rows (n, vis_dim) of sample i and their token positions (n,)."""
        a, b = self.v_off[i], self.v_off[i + 1]
        return self.t["vis_rows"][a:b], self.t["vis_pos"][a:b]


def _offsets(lengths: torch.Tensor) -> list[int]:
    return [0] + torch.cumsum(lengths.long(), 0).tolist()


@dataclass
class Batch:
    """A padded training/validation batch (float32, batch-first).

    hidden [B, L, in], mask [B, L] (real student tokens); target [B, R, out] with
    row_mask [B, R] (rows that are supervised: real rows the shard's target_keep keeps, the one
    mask of the loss and of every figure); seed_ids [B, Q] or None; sup_start [B] or None.
    For token-aligned kinds R == L and row_mask == mask, less the rows target_keep drops.
    Vision packs: vis [B, L, vis_dim] raw vision rows at image positions, zeros elsewhere (None
    when no sample has an image: the same as zeros for `vis_in`, which has no bias) and
    vis_mask [B, L] (True at image tokens, supervised or not). Token-aligned kinds: n_real [B],
    each template's length less its appended pads (data/recipe.py's row classes).
    Slot kinds with references: vis [B, V, vis_dim] each sample's rows first (zeros after),
    vis_at [B, S] True at the image slots (row k of a sample sits on its k-th True), and
    vis_mask [B, R] True at those slots' target rows (cos_vis / cos_txt).
    """

    hidden: torch.Tensor
    mask: torch.Tensor
    target: torch.Tensor
    row_mask: torch.Tensor
    seed_ids: torch.Tensor | None
    sup_start: torch.Tensor | None
    samples: list[tuple[int, int]]  # (shard file index, row) per sample, for bookkeeping
    vis: torch.Tensor | None = None
    vis_mask: torch.Tensor | None = None
    n_real: torch.Tensor | None = None
    bank: object = None  # data/bank_rows.BankBatch: the Qwen3.5 bridge's FLUX.3 bank targets
    vis_at: torch.Tensor | None = None

    def to(self, device) -> Batch:
        move = lambda x: None if x is None else x.to(device, non_blocking=True)
        return Batch(move(self.hidden), move(self.mask), move(self.target), move(self.row_mask),
                     move(self.seed_ids), move(self.sup_start), self.samples, move(self.vis),
                     move(self.vis_mask), move(self.n_real), move(self.bank), move(self.vis_at))

    def vision_kwargs(self) -> dict:
        """The vision arguments of the adapter's forward: `vis`, and a slot kind's `vis_at`."""
        return {"vis": self.vis} if self.vis_at is None else {"vis": self.vis,
                                                              "vis_at": self.vis_at}


def _pad(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    n, width = max(r.shape[0] for r in rows), rows[0].shape[1]
    out = torch.zeros(len(rows), n, width, dtype=torch.float32)
    mask = torch.zeros(len(rows), n, dtype=torch.bool)
    for b, r in enumerate(rows):
        out[b, : r.shape[0]] = r
        mask[b, : r.shape[0]] = True
    return out, mask


def collate(shard: Shard, rows: list[int], file_index: int, fixed_rows: int = 0) -> Batch:
    """Gather samples `rows` of `shard` into a padded Batch. `fixed_rows` pads targets to a
    fixed window (seeded resampler: the num_queries slots)."""
    hidden, mask = _pad([shard.student(i) for i in rows])
    target, row_mask = _pad([shard.target(i) for i in rows])
    if shard.selects_rows:  # image slots the DiT replaces, rows not stored: never supervised
        keep = torch.zeros_like(row_mask)
        for b, i in enumerate(rows):
            k = shard.target_keep(i)
            keep[b, : k.shape[0]] = k
        row_mask &= keep
    if fixed_rows and target.shape[1] < fixed_rows:
        extra = fixed_rows - target.shape[1]
        target = torch.nn.functional.pad(target, (0, 0, 0, extra))
        row_mask = torch.nn.functional.pad(row_mask, (0, extra))
    seed = shard.t.get("seed_ids")
    sup = shard.t.get("sup_start")
    vis_at = None
    if seed is not None and shard.v_off is not None:  # a slot kind's references
        vis, vis_at, vis_mask = _slot_vision(shard, rows, seed[rows], target.shape[1])
    else:
        vis, vis_mask = _vision(shard, rows, hidden.shape[1])
    n_real = None
    if sup is not None:
        n_real = torch.tensor([unpadded_length(shard.student_ids(i).tolist()) for i in rows])
    from gguf_trainer.data.bank_rows import collate_bank

    return Batch(hidden, mask, target, row_mask,
                 None if seed is None else seed[rows].long(),
                 None if sup is None else sup[rows].long(),
                 [(file_index, i) for i in rows], vis, vis_mask, n_real, collate_bank(shard, rows),
                 vis_at)


def _vision(shard: Shard, rows: list[int], length: int):
    """(vis [B, L, vis_dim] or None, vis_mask [B, L]) for vision shards, else (None, None)."""
    if shard.v_off is None:
        return None, None
    mask = torch.zeros(len(rows), length, dtype=torch.bool)
    parts = [shard.vision(i) for i in rows]
    if not any(r.shape[0] for r, _ in parts):
        return None, mask
    vis = torch.zeros(len(rows), length, shard.t["vis_rows"].shape[1], dtype=torch.float32)
    for b, (r, pos) in enumerate(parts):
        vis[b, pos.long()] = r.float()
        mask[b, pos.long()] = True
    return vis, mask


def _slot_vision(shard: Shard, rows: list[int], seed: torch.Tensor, width: int):
    """(vis [B, V, vis_dim] or None, vis_at [B, S] or None, vis_mask [B, width]) for a slot
    kind's shard: each sample's rows in order from row 0 (the engine's `vis`, conditioner.hpp
    4401-4418), the slots they sit on (its `vis_slot`, built from these by the adapter), and
    the target rows of those slots (after the rows a kind emits before its slots: Ming's
    caption rows, target_len less the slots)."""
    n_slots = (seed >= 0).sum(1)
    at = torch.zeros(len(rows), max(int(n_slots.max()), 1), dtype=torch.bool)
    tags = torch.zeros(len(rows), width, dtype=torch.bool)
    parts = [shard.vision(i) for i in rows]
    n = max(r.shape[0] for r, _ in parts)
    if not n:
        return None, None, tags
    vis = torch.zeros(len(rows), n, shard.t["vis_rows"].shape[1], dtype=torch.float32)
    for b, (i, (r, pos)) in enumerate(zip(rows, parts)):
        vis[b, : r.shape[0]] = r.float()
        at[b, pos.long()] = True
        lead = int(shard.t["target_len"][i]) - int(n_slots[b])
        tags[b, lead + pos.long()] = True
    return vis, at, tags


@dataclass
class StreamPos:
    """Where the stream is: the next batch to yield. Saved in checkpoints for exact resume."""

    epoch: int = 0
    shard_i: int = 0
    batch_i: int = 0

    def as_dict(self) -> dict:
        return {"epoch": self.epoch, "shard_i": self.shard_i, "batch_i": self.batch_i}


class ShardStream:
    """Endless, seeded stream of batches over the train shards.

    Per epoch the shard order is a permutation seeded by (seed, epoch) and the rows of
    shard f a permutation seeded by (seed, epoch, f); batches are consecutive slices, so
    the sequence depends only on the seed and the shard files, and `pos` restores it
    exactly. While a shard is consumed the next one is read in a background thread (two
    shards in RAM at most); benchmarks/bench_pipeline.py measures what loading costs per step.
    """

    def __init__(self, files: list[Path], seed: int, batch_size: int, fixed_rows: int = 0,
                 pos: StreamPos | None = None):
        self.files, self.seed = files, seed
        self.batch_size, self.fixed_rows = batch_size, fixed_rows
        self.pos = pos or StreamPos()
        self._cache: tuple[int, Shard] | None = None
        self._prefetch: tuple[int, Future] | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-prefetch")

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.files))

    def _shard(self, file_index: int) -> Shard:
        if self._cache is None or self._cache[0] != file_index:
            ahead = self._prefetch
            shard = (
                ahead[1].result()
                if ahead and ahead[0] == file_index
                else Shard(self.files[file_index])
            )
            self._cache = (file_index, shard)
            p = self.pos
            nxt = (
                self._order(p.epoch)[p.shard_i + 1]
                if p.shard_i + 1 < len(self.files)
                else self._order(p.epoch + 1)[0]
            )
            self._prefetch = (
                None
                if int(nxt) == file_index
                else (int(nxt), self._pool.submit(Shard, self.files[int(nxt)]))
            )
        return self._cache[1]

    def next_batch(self) -> Batch:
        while True:
            p = self.pos
            f = int(self._order(p.epoch)[p.shard_i])
            shard = self._shard(f)
            perm = np.random.default_rng([self.seed, p.epoch, f]).permutation(shard.n)
            rows = perm[p.batch_i * self.batch_size : (p.batch_i + 1) * self.batch_size].tolist()
            if rows:
                self.pos = StreamPos(p.epoch, p.shard_i, p.batch_i + 1)
                return self._collate(shard, rows, f)
            last = p.shard_i + 1 >= len(self.files)
            self.pos = (
                StreamPos(p.epoch + 1, 0, 0) if last else StreamPos(p.epoch, p.shard_i + 1, 0)
            )

    def _collate(self, shard: Shard, rows: list[int], file_index: int) -> Batch:
        """The batch of `rows` (distributed.TrainRanks keeps this rank's slice of them)."""
        return collate(shard, rows, file_index, self.fixed_rows)

    def __iter__(self) -> Iterator[Batch]:
        while True:
            yield self.next_batch()


def iter_batches(files: list[Path], batch_size: int, fixed_rows: int = 0) -> Iterator[Batch]:
    """Every sample of `files` once, in file order (validation / eval), one shard in RAM at a
    time."""
    for fi, path in enumerate(files):
        shard = Shard(path)
        for start in range(0, shard.n, batch_size):
            yield collate(
                shard, list(range(start, min(start + batch_size, shard.n))), fi, fixed_rows
            )


def shard_files(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"*{SUFFIX}"))


def meta_json(obj) -> str:
    return json.dumps(obj, sort_keys=True)
