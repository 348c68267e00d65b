"""Precompute stages (val, then train): teacher rows + student states for every corpus sample,
written as shards.

Shard by shard, each a stop point: the records of the corpus split are tokenized and turned
into tensors (precompute_shard.py: length limits, batches by token budget, the rows to
store), and the shard is written atomically; a stop request takes effect before the next
teacher batch and the partial shard is discarded. Existing shards made from the current
inputs are skipped (precompute_inputs.py checks them, and the disk before the first). The
student and the teacher are loaded once per pipeline run (`check`, before anything is
invalidated) from resolved material paths and a placement plan (precompute_context.py), and
closed when no stage needs them any more.

    PRECOMPUTE_VAL, PRECOMPUTE_TRAIN   the two stage objects
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

from gguf_trainer.base import project_file
from gguf_trainer.base.errors import UserError
from gguf_trainer.data import shards
from gguf_trainer.data.recipe import Recipe, StoredRows
from gguf_trainer.data.recipe import stored_rows as recipe_stored_rows
from gguf_trainer.data.samples import count_samples, iter_samples
from gguf_trainer.machine import distributed
from gguf_trainer.materials.materials import (
    recorded_stand_ins,
    student_identity,
    teacher_identity,
    tokenizer_identity,
)
from gguf_trainer.stages.precompute_context import Context
from gguf_trainer.stages.precompute_inputs import (
    disk_preflight,
    ensure_vision_for_project,
    project_vision_sha,
    split_whole,
    verify_split,
)
from gguf_trainer.stages.precompute_shard import build_shard, log_dropped, tokenize_samples
from gguf_trainer.stages.stage_list import Stage, Stopped, shard_stage

log = logging.getLogger(__name__)

CACHE_KEY = "precompute"  # the loaded Context in the run's shared cache


def samples_file(project, split: str) -> Path:
    return project.paths.samples(split)


def expected_shards(project, split: str) -> int:
    n = count_samples(samples_file(project, split))
    return max(1, math.ceil(n / shard_size(project, split)))


def shard_size(project, split: str) -> int:
    pc = project.settings.precompute
    return pc.val_shard_size if split == "val" else pc.shard_size


def stored_rows(project) -> StoredRows:
    """The target rows the shards store per sample under the project's recipe."""
    return recipe_stored_rows(Recipe.from_settings(project.settings.train, project.pack),
                              project.pack)


def context(project, cache: dict) -> Context:
    """The run's Context, loaded on first use."""
    if CACHE_KEY not in cache:
        cache[CACHE_KEY] = Context(project)
    return cache[CACHE_KEY]


def slot_references(project, split: str) -> bool:
    """Whether this split's shards carry a slot kind's reference rows: the pack places them
    on its teacher's slots (`slot_vision`) and some sample of the split has an image. Decided
    per split, so every shard of it has the same tensors (the adapter's vis_dim is read from
    the first train shard) and a split without references stores what it always stored."""
    if not getattr(project.pack, "slot_vision", False):
        return False
    return any(s.images for s in iter_samples(samples_file(project, split)))


def run_precompute(project, report, split: str, cache: dict, fingerprint: str) -> None:
    """Write every missing shard of `split` ("val" or "train")."""
    size = shard_size(project, split)
    n_samples = count_samples(samples_file(project, split))
    n_shards = max(1, math.ceil(n_samples / size))
    folder = project_file.make_dir(project.paths.root, project.paths.shard_dir(split))
    stored = stored_rows(project)
    refs = slot_references(project, split)
    meta = {
        "fingerprint": fingerprint,
        "contract": project.pack.shard_contract,
        "mock": str(project.settings.precompute.mock_teacher).lower(),
        "pack": project.pack.id,
        "stored_rows": stored.label,
    }
    count = lambda: sum(
        1 for k in range(n_shards) if (folder / shards.shard_name(split, k)).exists()
    )
    done = count()
    report.progress(done, n_shards, "shards")
    if done < n_shards:
        disk_preflight(project, split)
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
        samples, lengths, dropped = tokenize_samples(ctx, records, k * size, refs)
        log_dropped(split, k, dropped, ctx.pack)
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
            stored.pads,
            stored.from_start,
            refs,
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
            "vision_proj": project_vision_sha(project, student_sha, teacher),
            "max_len_student": pack.max_len_student,
            "max_len_teacher": pack.max_len_teacher,
            "split": self.split,
            "shard_size": shard_size(project, self.split),
        }
        # The rows the shards store follow the recipe (data/recipe.py stored_rows): shards of
        # every row (no key: every project before it keeps its fingerprint) are recomputed
        # when the recipe stores K pad rows or the rows from the start row on, and the other
        # way round.
        stored = stored_rows(project)
        if not stored.every:
            fp["stored_rows"] = stored.label
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
        ensure_vision_for_project(
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
            disk_preflight(project, self.split)
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
