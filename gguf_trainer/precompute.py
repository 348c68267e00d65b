"""Precompute stages (val, then train): teacher rows + student states for every corpus sample,
written as shards.

Per shard: tokenize, drop (and count) samples over the student's or the teacher's length
limit — never truncate one side only —, sort by the teacher's length and pack teacher
batches by a token budget, sort by the student's length and pack student batches likewise
(real ÷ processed tokens stays high on heavy-tailed prompt lengths), keep only the rows that
must be stored, write the shard atomically. A stop request takes effect before the next
teacher batch; the partial shard is discarded. Existing shards made from the current inputs
are skipped. The student and the teacher are loaded once per pipeline run (`check`, before
anything is invalidated) from resolved material paths and a placement plan, and closed when
no stage needs them any more.

    PRECOMPUTE_VAL, PRECOMPUTE_TRAIN   the two stage objects
"""

from __future__ import annotations

import gc
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from . import atomic, distributed, hardware, safe_delete, shards, vision
from .adapters import TOKEN_ALIGNED_KINDS
from .errors import UserError
from .materials import (
    recorded_stand_ins,
    student_identity,
    student_paths,
    teacher_identity,
    teacher_paths,
    tokenizer_identity,
)
from .paths import VERIFIED_JSON
from .qwen_bpe import engine_bpe
from .samples import count_samples, iter_samples
from .stage_list import Stage, Stopped, shard_stage

log = logging.getLogger(__name__)

CACHE_KEY = "precompute"  # the loaded Context in the run's shared cache


@dataclass
class TeacherPlan:
    """Where the teacher goes and why: what precompute decides before any weights load, and
    what the GUI's pre-flight shows (ui/preflight.py asks this same function)."""

    hw: object  # hardware.Hardware of the device
    folders: dict  # the teacher's material folders by id ({} with the mock teacher)
    need_gib: float  # the teacher's weights once loaded
    plan: object  # hardware.Plan: mode, memory caps, budgets
    warnings: list[str]  # the memory pre-flight's warnings (a refusal raises UserError)


def plan_teacher(project, device) -> TeacherPlan:
    """The memory pre-flight and the teacher's placement on `device`; UserError when it
    cannot fit. Reads headers only: no weights load."""
    pc, pack = project.settings.precompute, project.pack
    hw = hardware.read_hardware(device)
    folders = {} if pc.mock_teacher else teacher_paths(project)
    need_gib = pack.teacher_gib(folders, device) if folders else pack.teacher_memory_gib
    plan = hardware.plan_teacher(need_gib, pc, hw, is_mock=pc.mock_teacher,
                                 offload=pack.teacher_offload)
    return TeacherPlan(hw, folders, need_gib, plan, list(hardware.preflight(need_gib, plan, hw)))


class Context:
    """Student and teacher, loaded once per pipeline process and shared by val and train.
    The teacher is placed by `hardware.plan_teacher` after a memory pre-flight that refuses
    before any weights load."""

    def __init__(self, project):
        from .student import load_student

        pc, pack = project.settings.precompute, project.pack
        self.device = distributed.rank_device(hardware.resolve_device(pc.device))
        self.pack = pack
        planned = plan_teacher(project, self.device)
        folders, self.plan = planned.folders, planned.plan
        for line in self.plan.info:
            log.info("%s", line)
        for line in planned.warnings:
            log.warning("%s", line)
        gguf, tok = student_paths(project)
        self.student = load_student(gguf, tok, device=self.device,
                                    dtype=hardware.student_dtype(pc.student_dtype, self.device))
        self.teacher = (pack.build_mock_teacher(project) if pc.mock_teacher
                        else pack.load_teacher(folders, self.plan, self.device))
        self.budgets = self.plan.budgets
        # The project's frozen map (fitted when the fingerprint was taken): image rows reach
        # the student through it, exactly as the engine splices them.
        self.vision_proj = (
            vision.load_vision_proj(project.paths.vision_proj) if pack.vis_dim else None
        )
        log.info(
            "precompute: teacher mode %s on %s, budgets %s",
            self.plan.mode,
            self.device,
            self.budgets,
        )

    def close(self) -> None:
        """Free the teacher's and the student's memory (the stage that opened them calls this)."""
        close = getattr(self.teacher, "close", None)
        if close is not None:
            close()
        self.teacher = self.student = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


@dataclass
class _Sample:
    index: int  # position in the split
    sample: object  # the gguf_trainer.samples.Sample record the teacher gets
    ids: list[int]  # the student's token ids
    vision: list = None  # VisionSegment per image (raw rows + start in ids); [] without images


def _student_rows(ctx: Context, samples: list[_Sample]) -> list[torch.Tensor]:
    from .student import pad_batch

    out: list[torch.Tensor | None] = [None] * len(samples)
    b = ctx.budgets
    for batch in hardware.budget_batches(
        [len(s.ids) for s in samples], b.student_batch, b.student_tok_budget
    ):
        ids, keep = pad_batch([samples[i].ids for i in batch])
        keep, pos = _template_pads(ctx.pack.padding, [samples[i].ids for i in batch], keep)
        splices = [
            (j, seg.start, seg.rows.float() @ ctx.vision_proj.T)
            for j, i in enumerate(batch)
            for seg in samples[i].vision or ()
        ]
        with torch.no_grad():
            h = (
                ctx.student.hidden(
                    ids.to(ctx.device), keep.to(ctx.device), splices=splices, position_ids=pos
                )
                .float()
                .cpu()
            )
        for j, i in enumerate(batch):
            out[i] = h[j, : len(samples[i].ids)].to(torch.bfloat16)
    return out


def _template_pads(padding, id_lists, keep: torch.Tensor):
    """The family's appended pads (template_padding.py) masked as student keys, as the engine
    masks them, and their rope positions (None: 0..L-1)."""
    if not padding.pads:
        return keep, None
    keep = keep.clone()
    pos = torch.arange(keep.shape[1]).repeat(len(id_lists), 1)
    for j, ids in enumerate(id_lists):
        keep[j, padding.real_length(ids) :] = False
        at = padding.positions(ids)
        if at is not None:
            pos[j, : len(at)] = torch.tensor(at)
    return keep, pos


def _teacher_rows(
    ctx: Context, samples: list[_Sample], lengths: list[int], report, on_batch
) -> list:
    out: list = [None] * len(samples)
    b = ctx.budgets
    batches = hardware.budget_batches(lengths, b.teacher_batch, b.tok_budget)
    for k, batch in enumerate(batches):
        if report.stop_requested():
            raise Stopped()
        with torch.no_grad():
            vis = [samples[i].vision or [] for i in batch] if ctx.vision_proj is not None else None
            rows = ctx.teacher.targets(
                [samples[i].sample for i in batch], [samples[i].ids for i in batch], vis
            )
        for i, r in zip(batch, rows):
            out[i] = r
        on_batch((k + 1) / len(batches))
    return out


def build_shard(
    ctx: Context, samples: list[_Sample], report, on_batch, lengths: list[int] | None = None
) -> dict[str, torch.Tensor]:
    if lengths is None:
        lengths = ctx.teacher.lengths([s.sample for s in samples], [s.ids for s in samples])
    targets = _teacher_rows(ctx, samples, lengths, report, on_batch)
    students = _student_rows(ctx, samples)
    rows = torch.cat([t.rows.float() for t in targets])  # (Tt, D)
    tensors = {
        "student_rows": torch.cat(students),
        "student_ids": torch.tensor([i for s in samples for i in s.ids], dtype=torch.int32),
        "student_len": torch.tensor([len(s.ids) for s in samples], dtype=torch.int32),
        "target_rows": rows.to(torch.bfloat16),
        "target_len": torch.tensor([t.rows.shape[0] for t in targets], dtype=torch.int32),
        "sample_index": torch.tensor([s.index for s in samples], dtype=torch.int64),
    }
    if ctx.vision_proj is not None and not ctx.pack.dit_reads_vision_rows:
        tensors["target_keep"] = _keep_rows(samples, targets)
    # Moments of the rows as stored (bf16) that the loss reads, so the statistics describe
    # the training targets.
    stored = tensors["target_rows"].double()
    if "target_keep" in tensors:
        stored = stored[tensors["target_keep"]]
    tensors["moment_sum"] = stored.sum(0)
    tensors["moment_sq"] = (stored * stored).sum(0)
    tensors["moment_n"] = torch.tensor([stored.shape[0]], dtype=torch.int64)
    if targets[0].seed_ids is not None:
        tensors["seed_ids"] = torch.tensor([t.seed_ids for t in targets], dtype=torch.int32)
    if ctx.pack.adapter_kind in TOKEN_ALIGNED_KINDS:  # one row per token: the DiT's first row
        tensors["sup_start"] = torch.tensor([t.sup_start for t in targets], dtype=torch.int32)
    if ctx.vision_proj is not None:
        tensors.update(_vision_tensors(samples, ctx.vision_proj.shape[1]))
    return tensors


def _keep_rows(samples: list[_Sample], targets: list) -> torch.Tensor:
    """(Tt,) bool: every target row but the image slots (the pads each image's rows are
    spliced at), which a DiT that lays reference latents there never reads
    (pack.dit_reads_vision_rows False). Token-aligned: target row j is student token j."""
    keep = []
    for s, t in zip(samples, targets):
        assert t.rows.shape[0] == len(s.ids), "image slots are student positions: token-aligned"
        k = torch.ones(t.rows.shape[0], dtype=torch.bool)
        for seg in s.vision or ():
            k[seg.start : seg.start + seg.rows.shape[0]] = False
        keep.append(k)
    return torch.cat(keep)


def _vision_tensors(samples: list[_Sample], vis_dim: int) -> dict[str, torch.Tensor]:
    """Raw vision rows of every image (bf16), the token position of each row, rows per sample."""
    segs = [seg for s in samples for seg in s.vision or ()]
    rows = torch.cat([seg.rows.float() for seg in segs]) if segs else torch.zeros(0, vis_dim)
    pos = [p for seg in segs for p in range(seg.start, seg.start + seg.rows.shape[0])]
    return {
        "vis_rows": rows.to(torch.bfloat16),
        "vis_pos": torch.tensor(pos, dtype=torch.int32),
        "vis_len": torch.tensor(
            [sum(seg.rows.shape[0] for seg in s.vision or ()) for s in samples], dtype=torch.int32
        ),
    }


def _vision_rows(ctx: Context, records: list) -> list[list[torch.Tensor]]:
    """Raw vision rows per image of each record ([] for text-only records or packs)."""
    if ctx.vision_proj is None or not any(r.images for r in records):
        return [[] for _ in records]
    with torch.no_grad():  # one call for the shard's images: the teacher batches its tower
        rows = list(ctx.teacher.vision([p for r in records for p in ctx.pack.vision_inputs(r)]))
    out, at = [], 0
    for r in records:
        out.append(rows[at : at + len(r.images)])
        at += len(r.images)
    return out


def _segments(pack, ids: list[int], rows: list[torch.Tensor]):
    """The VisionSegments of one sample, or None when its image-token runs do not match its
    images (a prompt that spells `<|image_pad|>` itself): such a sample is dropped."""
    from .teachers.base import VisionSegment

    if not pack.image_pad_id:
        return []
    runs = vision.image_runs(ids, pack.image_pad_id)
    if [n for _, n in runs] != [r.shape[0] for r in rows]:
        return None
    return [VisionSegment(start, r) for (start, _), r in zip(runs, rows)]


def tokenize_samples(
    ctx: Context, records: list, start: int
) -> tuple[list[_Sample], list[int], dict]:
    """The samples within both length limits, their teacher lengths, and the drop counts."""
    pack = ctx.pack
    raw = _vision_rows(ctx, records)
    encode = engine_bpe(ctx.student.tokenizer).encode  # the engine's ids, piece by piece
    ids = [pack.student_ids(encode, r, [v.shape[0] for v in rows]) for r, rows in zip(records, raw)]
    segments = [_segments(pack, t, rows) for t, rows in zip(ids, raw)]
    within = [
        _Sample(start + k, r, t, seg)
        for k, (r, t, seg) in enumerate(zip(records, ids, segments))
        if len(t) <= pack.max_len_student and seg is not None
    ]
    n_spelled = sum(1 for seg in segments if seg is None)
    if n_spelled:
        log.warning(
            "precompute: dropped %d samples whose text spells the image token itself", n_spelled
        )
    dropped = {"student": len(records) - len(within) - n_spelled, "teacher": 0}
    lengths = (
        ctx.teacher.lengths([s.sample for s in within], [s.ids for s in within]) if within else []
    )
    keep = [(s, n) for s, n in zip(within, lengths) if n <= pack.max_len_teacher]
    dropped["teacher"] = len(within) - len(keep)
    return [s for s, _ in keep], [n for _, n in keep], dropped


def _log_dropped(split: str, k: int, dropped: dict, pack) -> None:
    for side, limit in (("student", pack.max_len_student), ("teacher", pack.max_len_teacher)):
        if dropped[side]:
            # never truncate: a cut sequence on one side no longer matches the other side's rows
            log.warning(
                "precompute[%s] shard %05d: dropped %d samples longer than %d %s tokens",
                split,
                k,
                dropped[side],
                limit,
                side,
            )


def samples_file(project, split: str) -> Path:
    return project.paths.samples(split)


def expected_shards(project, split: str) -> int:
    n = count_samples(samples_file(project, split))
    return max(1, math.ceil(n / shard_size(project, split)))


def shard_size(project, split: str) -> int:
    pc = project.settings.precompute
    return pc.val_shard_size if split == "val" else pc.shard_size


def context(project, cache: dict) -> Context:
    """The run's Context, loaded on first use."""
    if CACHE_KEY not in cache:
        cache[CACHE_KEY] = Context(project)
    return cache[CACHE_KEY]


def run_precompute(project, report, split: str, cache: dict, fingerprint: str) -> None:
    """Write every missing shard of `split` ("val" or "train")."""
    size = shard_size(project, split)
    n_samples = count_samples(samples_file(project, split))
    n_shards = max(1, math.ceil(n_samples / size))
    folder = project.paths.shard_dir(split)
    folder.mkdir(parents=True, exist_ok=True)
    meta = {
        "fingerprint": fingerprint,
        "contract": project.pack.shard_contract,
        "mock": str(project.settings.precompute.mock_teacher).lower(),
        "pack": project.pack.id,
    }
    count = lambda: sum(
        1 for k in range(n_shards) if (folder / shards.shard_name(split, k)).exists()
    )
    done = count()
    report.progress(done, n_shards, "shards")
    if done < n_shards:
        _disk_preflight(project, split)
    n_ranks = distributed.stage_ranks(project, shard_stage(split))  # shard k -> rank k mod N
    for k in range(n_shards):
        path = folder / shards.shard_name(split, k)
        if path.exists() or not distributed.owns(k, n_ranks):
            continue
        if n_ranks > 1:  # the other ranks' shards count too
            done = count()
        if CACHE_KEY not in cache:
            report.fields(detail="loading the student and the teacher")
        ctx = context(project, cache)
        report.fields(detail=None)
        t0 = time.monotonic()
        records = list(iter_samples(samples_file(project, split), k * size, (k + 1) * size))
        samples, lengths, dropped = tokenize_samples(ctx, records, k * size)
        _log_dropped(split, k, dropped, ctx.pack)
        if not samples:
            raise UserError(
                f"every sample of {split} shard {k} is longer than {ctx.pack.max_len_student} "
                f"student or {ctx.pack.max_len_teacher} teacher tokens; lower corpus.max_chars."
            )
        tensors = build_shard(
            ctx,
            samples,
            report,
            lambda frac, _done=done: report.progress(_done + frac, n_shards, "shards"),
            lengths,
        )
        shards.write_shard(path, tensors, meta)
        done += 1
        rate = len(samples) / max(time.monotonic() - t0, 1e-9)
        report.progress(done, n_shards, "shards", prompts_per_s=round(rate, 2))
        log.info(
            "precompute[%s] shard %05d: %d prompts in %.1fs (%.1f p/s), %d shards left",
            split,
            k,
            len(samples),
            time.monotonic() - t0,
            rate,
            n_shards - done,
        )


def _disk_preflight(project, split: str) -> None:
    """Before the first shard of a run: the estimate of the shard bytes still to write (the
    pack's bytes per sample × the corpus), refused with both numbers when the disk cannot
    hold them, a warning when they would leave under 10% free."""
    from .disk_space import check_precompute_disk, gb, precompute_need_bytes

    need = precompute_need_bytes(project)
    if need:
        log.info(
            "precompute[%s]: the shards still to write need ~%s (~%s per sample)",
            split,
            gb(need),
            gb(project.pack.bytes_per_sample),
        )
    tight = check_precompute_disk(project)
    if tight:
        log.warning("precompute: %s", tight)


def _verified_record(folder: Path) -> dict:
    try:
        record = atomic.read_json(folder / VERIFIED_JSON, {})
    except (ValueError, OSError):  # a garbage cache is rebuilt, never fatal
        record = {}
    return record if isinstance(record, dict) else {}


def _unverified(folder: Path, record: dict):
    """(path, [size, mtime]) of each shard the record does not vouch for."""
    for path in shards.shard_files(folder):
        st = path.stat()
        key = [st.st_size, st.st_mtime_ns]
        if record.get(path.name) != key:
            yield path, key


def split_whole(project, split: str, fingerprint: str) -> bool:
    """Every shard of `split` is whole and current (looks only: verify_split repairs)."""
    folder = project.paths.shard_dir(split)
    return not any(
        shards.verify_shard(path, fingerprint)
        for path, _ in _unverified(folder, _verified_record(folder))
    )


def verify_split(project, split: str, fingerprint: str) -> None:
    """Recompute-instead-of-train-on: delete any shard that is truncated, corrupted or stale.
    Verified shards are remembered by (size, mtime) so a restart does not re-hash them."""
    folder = project.paths.shard_dir(split)
    record_path = folder / VERIFIED_JSON
    record = _verified_record(folder)
    changed = False
    for path, key in list(_unverified(folder, record)):
        reason = shards.verify_shard(path, fingerprint)
        if reason:
            # only the tool's own file inside the project: shards/<split> linked to a folder
            # of someone's *.safetensors must not lose them as "not shards"
            safe_delete.unlink_owned(path, project.paths.root, safe_delete.DAMAGED_SHARD)
            log.warning("shard %s/%s is %s; recomputing it", split, path.name, reason)
            record.pop(path.name, None)
        else:
            record[path.name] = key
        changed = True
    for tmp in folder.glob(".*.tmp"):  # a partial shard of a killed run
        safe_delete.unlink_owned(tmp, project.paths.root, safe_delete.DAMAGED_SHARD)
    if changed:
        atomic.write_json(record_path, record)


class PrecomputeStage(Stage):
    """One split's shards. Shards resume one by one; only whole, current shards count."""

    shares = (CACHE_KEY,)
    distributed = True  # every rank computes the shards k mod N it owns

    def __init__(self, split: str):
        self.split = split
        self.name = shard_stage(split)

    def inputs(self, project, upstream, recorded):
        st, pack = project.settings, project.pack
        recorded = recorded or {}
        student_sha = student_identity(project, recorded.get("student_sha256"))
        teacher = teacher_identity(project, recorded.get("teacher"))
        fp = {
            "corpus": upstream["corpus"],
            "student_sha256": student_sha,
            "teacher": teacher,
            "contract": pack.shard_contract,
            "mock": st.precompute.mock_teacher,
            "student_dtype": st.precompute.student_dtype,
            "vision_proj": vision.project_vision_sha(project, student_sha, teacher),
            "max_len_student": pack.max_len_student,
            "max_len_teacher": pack.max_len_teacher,
            "split": self.split,
            "shard_size": shard_size(project, self.split),
        }
        # The tokenizer's identity: shards recorded before it was part of the fingerprint
        # (no key, all else equal) keep standing; any rebuild records it.
        if (
            not recorded
            or "student_tokenizer" in recorded
            or recorded != json.loads(json.dumps(fp))
        ):
            fp["student_tokenizer"] = tokenizer_identity(project, recorded.get("student_tokenizer"))
        return fp

    def make_inputs(self, project, recorded) -> None:
        """Fit the vision projection (vision packs) once per student and teacher: its sha256
        is one of this stage's inputs, which `inputs` then reads. Says which missing
        materials the identities recorded with the shards stand in for."""
        gone = recorded_stand_ins(project, recorded)
        if gone:
            log.info("%s: missing; using the identity recorded with the %s shards",
                     ", ".join(gone), self.split)
        if not project.pack.vis_dim:
            return
        recorded = recorded or {}
        vision.ensure_for_project(
            project,
            student_identity(project, recorded.get("student_sha256")),
            teacher_identity(project, recorded.get("teacher")),
        )

    def folder(self, paths):
        return paths.shard_dir(self.split)

    def recorded_fingerprints(self, project) -> set[str]:
        metas = (shards.read_meta(p) for p in shards.shard_files(self.folder(project.paths)))
        return {m["fingerprint"] for m in metas if m and isinstance(m.get("fingerprint"), str)}

    def check(self, project, run) -> None:
        """Load the student and the teacher now: a broken student GGUF or a teacher that does
        not fit is refused before any shard or checkpoint is touched. Shards that cannot fit
        on the disk are refused first, before the teacher loads (counted from the corpus on
        disk; without one, run_precompute checks once the corpus is written)."""
        if CACHE_KEY not in run.cache and all(
            samples_file(project, s).is_file() for s in ("train", "val")
        ):
            _disk_preflight(project, self.split)
        context(project, run.cache)

    def tidy(self, project, run) -> None:
        if self.folder(project.paths).is_dir():
            verify_split(
                project, self.split, run.fingerprint
            )  # drops truncated/corrupt/stale shards

    def is_done(self, project, run) -> bool:
        if not samples_file(project, self.split).is_file():
            return False
        n = len(shards.shard_files(self.folder(project.paths)))
        return n >= expected_shards(project, self.split) and split_whole(
            project, self.split, run.fingerprint
        )

    def run(self, project, report, run) -> str:
        try:
            run_precompute(project, report, self.split, run.cache, run.fingerprint)
            stopped = False
        except Stopped:
            stopped = True
        # Launched: every rank waits here for the others' shards; one stopped rank stops the run.
        stopped = distributed.any_true(stopped)
        if distributed.world().is_distributed:  # the bar counts every rank's shards
            report.progress(
                len(shards.shard_files(self.folder(project.paths))),
                expected_shards(project, self.split),
                "shards",
            )
        return "stopped" if stopped else "done"


PRECOMPUTE_VAL = PrecomputeStage("val")
PRECOMPUTE_TRAIN = PrecomputeStage("train")
STAGE = (PRECOMPUTE_VAL, PRECOMPUTE_TRAIN)  # this module's stage objects, in order
