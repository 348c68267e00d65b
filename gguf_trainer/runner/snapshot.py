"""Snapshot job: a usable, step-tagged GGUF at any point of a run.

Clients start it as a DETACHED job (`start_job`, runner.jobs): the caller loads no torch
and its state shows in `status --json` under jobs.snapshot. While the train stage runs, the
job drops `snapshot.request`; the trainer validates and saves last.pt at the current step,
removes the file and keeps training (nothing is interrupted). `fresh=False`, or no training
running, takes the checkpoint on disk; a kept step (`step<N>`, data.kept_steps) is read from
checkpoints/history/ and never asks the trainer. The GGUF is `<name>-step<N>-<dtype>.gguf`
with provenance KVs; an optional eval runs on the CPU while training owns the device. Every
snapshot is recorded in snapshots.json.

One snapshot job per project at a time (its lock, snapshot.lock, is the job's lock);
reset refuses while one runs. Arguments, the project and the checkpoint are checked
before anything is written or spawned.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from gguf_trainer.base import atomic, locks
from gguf_trainer.base.errors import UserError, quote
from gguf_trainer.data import kept_steps
from gguf_trainer.stages.stage_list import TRAINING

from . import jobs, lock
from .status import read_state

log = logging.getLogger(__name__)

JOB = "snapshot"
CHECKPOINTS = ("last", "best")


def _request_fresh(paths, timeout_s: float) -> bool:
    """Ask the running trainer to validate + save now; True once it has."""
    atomic.write_text(paths.snapshot_request, f"{time.time()}\n")
    deadline = time.monotonic() + timeout_s
    while paths.snapshot_request.exists():
        if lock.probe(paths) is None or time.monotonic() > deadline:
            paths.snapshot_request.unlink(missing_ok=True)
            return False
        time.sleep(0.2)
    return True


def check_args(root, checkpoint: str, evaluate: bool, fresh: bool, device: str | None):
    """Validate everything a snapshot needs without torch; returns the project."""
    from gguf_trainer.store.project import load_project
    from gguf_trainer.store.project_schema import check_device

    step = kept_steps.parse_spec(checkpoint)
    if checkpoint not in CHECKPOINTS and step is None:
        raise UserError(f"--checkpoint must be last, best or a kept step (step<N>; `--checkpoint "
                        f"list` lists them), not {quote(checkpoint)}.")
    if device is not None:
        try:
            check_device(device, "--device")
        except ValueError as e:
            raise UserError(f"--device {e}.") from None
    project = load_project(root)
    paths = project.paths
    if step is not None:  # a kept step is on disk or it is not: no trainer is asked
        kept_steps.require_kept(paths, step)
        return project
    training = lock.probe(paths) is not None and (read_state(paths) or {}).get("stage") == TRAINING
    ck = paths.checkpoints / f"{checkpoint}.pt"
    if not ck.is_file() and not (fresh and training and checkpoint == "last"):
        raise UserError(f"there is no {checkpoint}.pt checkpoint yet in {paths.checkpoints}; "
                        "train first (gguf-trainer start) or wait for the first save.")
    return project


def start_job(paths, checkpoint: str = "last", evaluate: bool = False, fresh: bool = True,
              device: str | None = None) -> dict:
    """Check the arguments, then start the detached snapshot job; its state (jobs.job_status)."""
    check_args(paths.root, checkpoint, evaluate, fresh, device)
    return jobs.start_job(paths.root, JOB, "gguf_trainer.runner.snapshot:job_main",
                          {"checkpoint": checkpoint, "evaluate": bool(evaluate),
                           "fresh": bool(fresh), "device": device})


def job_main(folder: Path, job, checkpoint: str = "last", evaluate: bool = False,
             fresh: bool = True, device: str | None = None) -> dict:
    """The job process body (runner.jobs holds snapshot.lock around it)."""
    project = check_args(folder, checkpoint, evaluate, fresh, device)
    return _snapshot(project, checkpoint, evaluate, fresh, device, 600.0, job)


def run_snapshot(root, checkpoint: str = "last", evaluate: bool = False, fresh: bool = True,
                 device: str | None = None, timeout_s: float = 600.0) -> dict:
    """In this process (tests, scripts): the same work under the snapshot lock."""
    project = check_args(root, checkpoint, evaluate, fresh, device)
    with locks.hold_file(project.paths.snapshot_lock, "a snapshot export is already running"):
        return _snapshot(project, checkpoint, evaluate, fresh, device, timeout_s, None)


def _snapshot(project, checkpoint, evaluate, fresh, device, timeout_s, job) -> dict:
    from gguf_trainer.data.checkpoints import checkpoint_path, load_checkpoint
    from gguf_trainer.machine.hardware import resolve_device
    from gguf_trainer.stages.evaluate import evaluate_gguf
    from gguf_trainer.stages.export import export_checkpoint, record_snapshot

    paths = project.paths
    state = read_state(paths) or {}
    is_training = lock.probe(paths) is not None and state.get("stage") == TRAINING
    kept = kept_steps.parse_spec(checkpoint)
    if kept is not None:
        checkpoint, fresh = kept_steps.kept_name(kept), False
    if fresh and is_training:
        if job is not None:
            job.update(phase="asking the trainer to save")
        if not _request_fresh(paths, timeout_s):
            log.warning(
                "the trainer did not answer the snapshot request; using the checkpoint on disk"
            )
    ck_path = paths.kept_step(kept) if kept is not None else checkpoint_path(
        paths.checkpoints, checkpoint)
    if not ck_path.exists():
        raise UserError(
            f"there is no {checkpoint}.pt checkpoint yet; train first or wait for the first save."
        )
    if job is not None:
        job.update(phase="exporting")
    ck = kept_steps.load_kept(paths, kept) if kept is not None else load_checkpoint(ck_path)
    info = export_checkpoint(project, checkpoint, project.snapshot_gguf, is_snapshot=True, ck=ck)
    entry = {
        "id": f"step{info['step']}-{checkpoint}",
        "step": info["step"],
        "planned_steps": info["planned_steps"],
        "checkpoint": checkpoint,
        "kept": kept is not None,
        "val_cos": info["val_cos"],
        "best_val_cos": info["best_val_cos"],
        "path": info["path"],
        "size": info["bytes"],
        "time": time.time(),
        "while_training": is_training,
        "mock": info["mock"],
        "eval": None,
    }
    try:
        from gguf_trainer.base.safe_delete import sha256_file

        entry["sha256"] = sha256_file(info["path"])  # lets `reset output` prove it is ours
    except OSError:
        pass
    if evaluate:
        if job is not None:
            job.update(phase="evaluating")
        dev = device or ("cpu" if lock.probe(paths) is not None else project.settings.train.device)
        ev = evaluate_gguf(
            project, paths.root / info["path"], checkpoint, resolve_device(dev), ck=ck
        )
        entry["eval"] = {k: v for k, v in ev["metrics"].items() if isinstance(v, float)}
        entry["eval"]["headline"] = ev["val_cos"]
    record_snapshot(project, entry)
    return entry


def describe(entry: dict) -> str:
    ev = entry.get("eval") if isinstance(entry.get("eval"), dict) else None
    score = ev.get("headline") if ev else entry.get("val_cos")
    score = round(score, 4) if isinstance(score, (int, float)) else None
    return (
        f"snapshot written: {entry.get('path')} (step {entry.get('step')}/"
        f"{entry.get('planned_steps')}, {entry.get('checkpoint')}.pt, score {score})"
    )


def run_snapshot_cli(root, checkpoint="last", evaluate=False, fresh=True, device=None) -> int:
    print(describe(run_snapshot(root, checkpoint, evaluate, fresh, device)))
    return 0
