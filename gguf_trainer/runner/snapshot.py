"""Snapshot job: a usable, step-tagged GGUF at any point of a run.

While the train stage runs, the job drops `snapshot.request`; the trainer validates and
saves last.pt at the current step, removes the file and keeps training (nothing is
interrupted). `fresh=False`, or no training running, takes the checkpoint on disk. The
GGUF is `<name>-step<N>-f16.gguf` with provenance KVs; an optional eval runs on the CPU
while training owns the device. Every snapshot is recorded in snapshots.json.

One snapshot job per project at a time (its own lock); reset refuses while one runs.
"""

from __future__ import annotations

import logging
import time

from .. import atomic
from ..errors import UserError
from . import lock
from .status import read_state

log = logging.getLogger(__name__)


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


def run_snapshot(root, checkpoint: str = "last", evaluate: bool = False, fresh: bool = True,
                 device: str | None = None, timeout_s: float = 600.0) -> dict:
    from ..evaluate import evaluate_gguf
    from ..outputs import export_checkpoint, record_snapshot
    from ..precompute import resolve_device
    from ..project import load_project
    from ..train import checkpoint_path, load_checkpoint

    project = load_project(root)
    paths = project.paths
    if checkpoint not in ("last", "best"):
        raise UserError(f"--checkpoint must be last or best, not {checkpoint!r}.")
    with lock.hold_file(paths.snapshot_lock, "a snapshot export is already running"):
        state = read_state(paths) or {}
        is_training = lock.probe(paths) is not None and state.get("stage") == "train"
        if fresh and is_training:
            if not _request_fresh(paths, timeout_s):
                log.warning("the trainer did not answer the snapshot request; using the checkpoint on disk")
        ck_path = checkpoint_path(paths.checkpoints, checkpoint)
        if not ck_path.exists():
            raise UserError(f"there is no {checkpoint}.pt checkpoint yet; train first or wait for the first save.")
        ck = load_checkpoint(ck_path)
        info = export_checkpoint(project, checkpoint, project.snapshot_gguf, is_snapshot=True, ck=ck)
        entry = {"id": f"step{info['step']}-{checkpoint}", "step": info["step"],
                 "planned_steps": info["planned_steps"], "checkpoint": checkpoint, "val_cos": info["val_cos"],
                 "best_val_cos": info["best_val_cos"], "path": info["path"], "size": info["bytes"],
                 "time": time.time(), "while_training": is_training, "mock": info["mock"], "eval": None}
        if evaluate:
            dev = device or ("cpu" if lock.probe(paths) is not None else project.settings.train.device)
            ev = evaluate_gguf(project, paths.root / info["path"], checkpoint, resolve_device(dev), ck=ck)
            entry["eval"] = {k: v for k, v in ev["metrics"].items() if isinstance(v, float)}
            entry["eval"]["headline"] = ev["val_cos"]
        record_snapshot(project, entry)
        return entry


def describe(entry: dict) -> str:
    score = entry["eval"]["headline"] if entry.get("eval") else entry.get("val_cos")
    return (f"snapshot written: {entry['path']} (step {entry['step']}/{entry['planned_steps']}, "
            f"{entry['checkpoint']}.pt, score {score if score is None else round(score, 4)})")


def run_snapshot_cli(root, checkpoint="last", evaluate=False, fresh=True, device=None) -> int:
    print(describe(run_snapshot(root, checkpoint, evaluate, fresh, device)))
    return 0
