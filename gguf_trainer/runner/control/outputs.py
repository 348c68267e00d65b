"""The control API's outputs: what a run leaves (the exports, eval.json, the snapshots and
their detached job, the verify job, the logs) and the reset that deletes a stage's outputs.
Torch-free, like all of runner.control: snapshot and verify run as detached jobs."""

from __future__ import annotations

from gguf_trainer.base import places
from gguf_trainer.base.errors import NoProjectError, UserError, quote
from gguf_trainer.runner.control.helpers import (
    TAIL_MAX_BYTES,
    PathLike,
    _paths,
    _read_json_quiet,
    read_tail,
)
from gguf_trainer.runner.views import ResetPlan, ResetResult

LOGS = ("pipeline", "snapshot", "download")


# ---- outputs --------------------------------------------------------------------------
def list_exports(root: PathLike) -> list[dict]:
    """This project's exported GGUFs as recorded in exports.json: [{path, kind, time,
    size, exists}], newest first. Garbage in exports.json reads as no exports."""
    from gguf_trainer.runner import reset as reset_mod

    return reset_mod.recorded_exports(_paths(root))


def read_eval(root: PathLike) -> dict | None:
    """eval.json (the last evaluation), or None when there is none or it is unreadable.
    LeadsOutside (its sentence) when it leads outside the project (a symlink)."""
    paths = _paths(root)
    data = _read_json_quiet(paths.eval_json, paths.root)
    return data if isinstance(data, dict) else None


def list_snapshots(root: PathLike) -> list[dict]:
    """snapshots.json entries (step, planned_steps, checkpoint, val_cos, path, size, time,
    eval), by step; entries that are not objects are dropped."""
    paths = _paths(root)
    data = _read_json_quiet(paths.snapshots_json, paths.root)
    items = data.get("snapshots") if isinstance(data, dict) else None
    root = paths.root.resolve()  # recorded relative to the project's parent (places.py)
    return [
        {**e, "path": str(places.recorded_path(e["path"], root))}
        if isinstance(e.get("path"), str)
        else e
        for e in items or []
        if isinstance(e, dict)
    ]


def request_snapshot(
    root: PathLike,
    checkpoint: str = "last",
    evaluate: bool = False,
    fresh: bool = True,
    device: str | None = None,
) -> dict:
    """Start a snapshot export as a DETACHED job (the caller loads no torch) and return its
    job state ({"status": "running", "pid", ...}); follow it in status(root)["jobs"]
    ["snapshot"] or `snapshot_job(root)`. Arguments, the checkpoint's existence and a
    running snapshot job are checked before anything is written."""
    from gguf_trainer.runner import snapshot as snap

    return snap.start_job(_paths(root), checkpoint, evaluate, fresh, device)


def snapshot_job(root: PathLike) -> dict:
    """The snapshot job's state: {"status": idle|running|done|failed|interrupted, "pid",
    "started", "finished", "error", "result" (the snapshots.json entry when done), ...}."""
    from gguf_trainer.runner import jobs

    return jobs.job_status(_paths(root).root, "snapshot")


def start_verify(root: PathLike, repair: bool = False) -> dict:
    """Start `verify` (re-read every shard and checkpoint; `repair` recomputes the damaged
    shards) as a DETACHED job; its state as verify_job() gives it."""
    from gguf_trainer.runner import jobs

    paths = _paths(root)
    if not paths.exists():
        raise NoProjectError(
            f"{paths.root} is not a gguf-trainer project (no project.json); check the path."
        )
    return jobs.start_job(
        paths.root, "verify", "gguf_trainer.runner.verify:job_main", {"repair": bool(repair)}
    )


def verify_job(root: PathLike) -> dict:
    """The verify job's state; when done, "result" holds the report and its "lines"."""
    from gguf_trainer.runner import jobs

    return jobs.job_status(_paths(root).root, "verify")


def wait_snapshot(root: PathLike, timeout_s: float | None = None) -> dict:
    """Block until the snapshot job is not running; its last state."""
    from gguf_trainer.runner import jobs

    return jobs.wait(_paths(root).root, "snapshot", timeout_s)


def tail_log(
    root: PathLike, offset: int = 0, log: str = "pipeline", max_bytes: int = TAIL_MAX_BYTES
) -> tuple[str, int]:
    """New text of a log from byte `offset`: (text, new_offset). Reads at most max_bytes
    (from the end if more is new); a log that shrank (rotated, deleted) restarts at 0.
    `log`: pipeline | snapshot | download. Only whole lines are returned."""
    if log not in LOGS:
        raise UserError(f"unknown log {quote(log)}; choose one of {', '.join(LOGS)}.")
    paths = _paths(root)
    path = paths.pipeline_log if log == "pipeline" else paths.root / f"{log}.log"
    return read_tail(path, offset, max_bytes, inside=paths.root)


# ---- reset ----------------------------------------------------------------------------
def reset_plan(root: PathLike, target: str) -> ResetPlan:
    """Dry run of `reset`: exactly the paths it would delete, and those it would leave
    (with the reason). `blocked` says why reset is refused now (a live run or job)."""
    from gguf_trainer.runner import reset as reset_mod

    return ResetPlan(**reset_mod.plan(_paths(root), target))


def reset(root: PathLike, target: str) -> ResetResult:
    """Delete a stage's outputs and everything built on them (see runner.reset). Refused
    while the pipeline or a job runs. Deletes exactly `reset_plan(root, target).delete`."""
    from gguf_trainer.runner import reset as reset_mod

    return ResetResult(**reset_mod.reset(_paths(root), target))
