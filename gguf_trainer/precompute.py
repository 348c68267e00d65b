"""Precompute stage: teacher rows + student states for every corpus prompt, written as shards.

Per shard: tokenize, sort by the teacher's length and pack teacher batches by a token
budget, sort by the student's length and pack student batches likewise (real ÷ processed
tokens stays high on heavy-tailed prompt lengths), keep only the rows that must be stored,
write the shard atomically. A stop request takes effect before the next teacher batch;
the partial shard is discarded. Existing shards made from the current inputs are skipped.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from . import atomic, shards
from .corpus import read_prompts
from .errors import UserError

log = logging.getLogger(__name__)


class Stopped(Exception):
    """A stop was requested; raised between teacher batches, never mid-write."""


@dataclass(frozen=True)
class Budgets:
    teacher_batch: int
    tok_budget: int
    student_batch: int
    student_tok_budget: int


def choose_budgets(pc, device: torch.device) -> Budgets:
    """Settings at 0 are chosen for the device (a big card gets bigger batches)."""
    if device.type == "cuda":
        big = torch.cuda.get_device_properties(device).total_memory > 24e9
        auto = (256, 65536, 256, 131072) if big else (64, 12288, 64, 24576)
    else:
        auto = (16, 4096, 32, 8192)
    given = (pc.teacher_batch, pc.tok_budget, pc.student_batch, pc.student_tok_budget)
    return Budgets(*(g or a for g, a in zip(given, auto)))


MIN_BATCH_EFFICIENCY = 0.9  # real ÷ processed tokens each batch keeps...
PAD_SLACK_TOKENS = 32  # ...unless it pads fewer tokens than this (tiny prompts: fewer calls)


def budget_batches(lengths: Sequence[int], max_batch: int, max_tokens: int) -> list[list[int]]:
    """Indices grouped into batches, sorted by length ascending. A batch costs count × its
    longest member (that is what padding processes): it is kept ≤ max_tokens, and closed
    before a longer member would push its real ÷ processed tokens under 0.9 (big budgets
    would otherwise pad hundreds of short prompts to a long one). ≥ 1 item per batch."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches, cur, real = [], [], 0
    for i in order:
        n, length = len(cur) + 1, lengths[i]
        padding = n * length - real - length
        if cur and (n > max_batch or n * length > max_tokens
                    or (padding > PAD_SLACK_TOKENS and real + length < MIN_BATCH_EFFICIENCY * n * length)):
            batches.append(cur)
            cur, real = [], 0
        cur.append(i)
        real += lengths[i]
    if cur:
        batches.append(cur)
    return batches


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device {name!r} was chosen but no CUDA device is available; choose cpu or auto.")
    return torch.device(name)


def student_dtype(name: str, device: torch.device) -> torch.dtype:
    """"auto" = fp32 everywhere: the engine multiplies pig_clip's f16 weights with f32
    activations, the 0.6B student is cheap next to any teacher, and bf16 matmul on CPUs is
    hundreds of times slower. bf16/f16 are there for small cards."""
    return {"auto": torch.float32, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[name]


def file_sha256(path: Path, cache_file: Path | None = None) -> str:
    """sha256 of a (multi-GB) file. With `cache_file`, a JSON map remembers it by path, size and
    mtime, so a restart does not re-read the student GGUF; any rewrite of the file re-hashes."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    cache = (atomic.read_json(cache_file, {}) or {}) if cache_file else {}
    if key not in cache:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                h.update(block)
        cache[key] = h.hexdigest()
        if cache_file:
            atomic.write_json(cache_file, cache)
    return cache[key]


def student_paths(project) -> tuple[Path, Path]:
    gguf = project.material_path("student")
    tok = project.material_path("student_tokenizer")
    if gguf is None or not gguf.is_file():
        raise UserError("the student GGUF is not set or missing; choose pig_clip-f16.gguf under "
                        "Setup → Materials (materials.student.path in project.json).")
    if tok is None or not (tok / "tokenizer.json").is_file():
        raise UserError("the student tokenizer snapshot is missing; download callgg/pig-clip-tokenizer "
                        "under Setup → Materials (materials.student_tokenizer.path).")
    return gguf, tok


def teacher_identity(project) -> dict:
    """What identifies the teacher's outputs: the mock function, or the snapshot's revision
    (else a hash of its config and index files; weights are too big to hash each start)."""
    pack = project.pack
    if project.settings.precompute.mock_teacher:
        return pack.build_mock_teacher(project).identity
    root = project.material_path("teacher")
    if root is None or not root.is_dir():
        mat = next((m for m in pack.teacher_materials if m.id == "teacher"), None)
        repo = f" ({mat.repo})" if mat else ""
        raise UserError(f"the teacher snapshot for {pack.title}{repo} is missing; download it and set "
                        "materials.teacher.path in project.json, or use the mock teacher.")
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.json")):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    return {"snapshot": h.hexdigest()}


class Context:
    """Student and teacher, loaded once per pipeline process and shared by val and train."""

    def __init__(self, project):
        from .student import load_student

        pc = project.settings.precompute
        self.device = resolve_device(pc.device)
        gguf, tok = student_paths(project)
        self.student = load_student(gguf, tok, device=self.device, dtype=student_dtype(pc.student_dtype, self.device))
        pack = project.pack
        self.teacher = (pack.build_mock_teacher(project) if pc.mock_teacher
                        else pack.build_teacher(project, self.device))
        self.budgets = choose_budgets(pc, self.device)
        self.pack = pack


@dataclass
class _Sample:
    index: int
    text: str
    ids: list[int]


def _student_rows(ctx: Context, samples: list[_Sample], report) -> list[torch.Tensor]:
    from .student import pad_batch

    out: list[torch.Tensor | None] = [None] * len(samples)
    b = ctx.budgets
    for batch in budget_batches([len(s.ids) for s in samples], b.student_batch, b.student_tok_budget):
        ids, keep = pad_batch([samples[i].ids for i in batch])
        with torch.no_grad():
            h = ctx.student.hidden(ids.to(ctx.device), keep.to(ctx.device)).float().cpu()
        for j, i in enumerate(batch):
            out[i] = h[j, : len(samples[i].ids)].to(torch.bfloat16)
    return out


def _teacher_rows(ctx: Context, samples: list[_Sample], report, on_batch) -> list:
    out: list = [None] * len(samples)
    b = ctx.budgets
    lengths = ctx.teacher.lengths([s.text for s in samples], [s.ids for s in samples])
    batches = budget_batches(lengths, b.teacher_batch, b.tok_budget)
    for k, batch in enumerate(batches):
        if report.stop_requested():
            raise Stopped()
        with torch.no_grad():
            rows = ctx.teacher.targets([samples[i].text for i in batch], [samples[i].ids for i in batch])
        for i, r in zip(batch, rows):
            out[i] = r
        on_batch((k + 1) / len(batches))
    return out


def build_shard(ctx: Context, samples: list[_Sample], report, on_batch) -> dict[str, torch.Tensor]:
    targets = _teacher_rows(ctx, samples, report, on_batch)
    students = _student_rows(ctx, samples, report)
    rows = torch.cat([t.rows.float() for t in targets])  # (Tt, D)
    tensors = {
        "student_rows": torch.cat(students),
        "student_ids": torch.tensor([i for s in samples for i in s.ids], dtype=torch.int32),
        "student_len": torch.tensor([len(s.ids) for s in samples], dtype=torch.int32),
        "target_rows": rows.to(torch.bfloat16),
        "target_len": torch.tensor([t.rows.shape[0] for t in targets], dtype=torch.int32),
        "sample_index": torch.tensor([s.index for s in samples], dtype=torch.int64),
    }
    # Moments of the rows as stored (bf16), so the statistics describe the training targets.
    stored = tensors["target_rows"].double()
    tensors["moment_sum"] = stored.sum(0)
    tensors["moment_sq"] = (stored * stored).sum(0)
    tensors["moment_n"] = torch.tensor([stored.shape[0]], dtype=torch.int64)
    if targets[0].seed_ids is not None:
        tensors["seed_ids"] = torch.tensor([t.seed_ids for t in targets], dtype=torch.int32)
    if ctx.pack.adapter_kind == "token_aligned_vision":
        tensors["sup_start"] = torch.tensor([t.sup_start for t in targets], dtype=torch.int32)
    return tensors


def tokenize_samples(ctx: Context, prompts: list[str], start: int) -> tuple[list[_Sample], int]:
    from .student import tokenize

    ids = tokenize(ctx.student.tokenizer, [ctx.pack.format_prompt(p) for p in prompts])
    keep, skipped = [], 0
    for k, (p, t) in enumerate(zip(prompts, ids)):
        if len(t) > ctx.pack.max_len_student:
            skipped += 1  # never truncate: a cut student sequence no longer matches its teacher rows
            continue
        keep.append(_Sample(start + k, p, t))
    return keep, skipped


def run_precompute(project, report, split: str, ctx_holder: dict, fingerprint: str) -> None:
    """Write every missing shard of `split` ("val" or "train")."""
    pc = project.settings.precompute
    prompts = read_prompts(project.paths.data / f"{split}.txt")
    size = pc.val_shard_size if split == "val" else pc.shard_size
    n_shards = max(1, math.ceil(len(prompts) / size))
    folder = project.paths.shard_dir(split)
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"fingerprint": fingerprint, "contract": project.pack.shard_contract,
            "mock": str(project.settings.precompute.mock_teacher).lower(), "pack": project.pack.id}
    done = sum(1 for k in range(n_shards) if (folder / shards.shard_name(split, k)).exists())
    report.progress(done, n_shards, "shards")
    for k in range(n_shards):
        path = folder / shards.shard_name(split, k)
        if path.exists():
            continue
        if "ctx" not in ctx_holder:
            report.fields(detail="loading the student and the teacher")
            ctx_holder["ctx"] = Context(project)
            report.fields(detail=None)
        ctx = ctx_holder["ctx"]
        t0 = time.monotonic()
        samples, skipped = tokenize_samples(ctx, prompts[k * size: (k + 1) * size], k * size)
        if skipped:
            log.warning("precompute[%s] shard %05d: skipped %d prompts longer than %d student tokens",
                        split, k, skipped, ctx.pack.max_len_student)
        if not samples:
            raise UserError(f"every prompt of {split} shard {k} is longer than {ctx.pack.max_len_student} tokens; "
                            "lower corpus.max_chars.")
        tensors = build_shard(ctx, samples, report,
                              lambda frac: report.progress(done + frac, n_shards, "shards"))
        shards.write_shard(path, tensors, meta)
        done += 1
        rate = len(samples) / max(time.monotonic() - t0, 1e-9)
        report.progress(done, n_shards, "shards", prompts_per_s=round(rate, 2))
        log.info("precompute[%s] shard %05d: %d prompts in %.1fs (%.1f p/s), %d shards left",
                 split, k, len(samples), time.monotonic() - t0, rate, n_shards - done)
