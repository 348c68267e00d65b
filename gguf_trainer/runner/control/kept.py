"""The control API's kept steps (data.kept_steps): list them with the total on disk, delete
one, and plan before a run how many files the schedule makes and their size. Torch-free:
exporting a kept step is a snapshot job (`request_snapshot(root, "step<N>")`)."""

from __future__ import annotations

from gguf_trainer.base.errors import UserError
from gguf_trainer.data import kept_steps
from gguf_trainer.runner.control.helpers import PathLike, _paths


def list_kept_steps(root: PathLike) -> dict:
    """{"items": [{step, name, path, size, val_cos, val, time, reason, ...}] ascending,
    "total": bytes on disk, "schedule": the schedule in words}."""
    paths = _paths(root)
    items = kept_steps.list_kept(paths)
    try:
        plan = kept_plan(root)["text"]
    except UserError as e:  # a project.json that does not read: the list still shows
        plan = str(e)
    return {"items": items, "total": kept_steps.total_bytes(items), "schedule": plan}


def delete_kept_step(root: PathLike, step: int) -> list[dict]:
    """Delete kept step `step` (its file and sidecar) by the ownership rule; refused while a
    snapshot job runs (it may be exporting that very step). The verdicts, as dicts."""
    from gguf_trainer.runner import jobs

    paths = _paths(root)
    if jobs.is_running(paths.root, "snapshot"):
        raise UserError("a snapshot export is running; wait for it before deleting a kept step.")
    kept_steps.require_kept(paths, int(step))
    verdicts = kept_steps.delete_kept(paths, int(step))
    bad = next((v for v in verdicts if v.reason), None)
    if bad is not None:
        raise UserError(f"{bad.path} {bad.reason}.")
    return [v.as_dict() for v in verdicts]


def kept_plan(root: PathLike) -> dict:
    """What the saved schedule makes over train.steps, before the run: {"files" (on disk at
    the end, after history_keep), "planned" (written), "kept_bytes" (one), "last_bytes"
    (last.pt, for scale), "text"}. Sizes are from the shards' dims once precomputed, else
    from the pack's declared dims."""
    from gguf_trainer.store.project import load_project

    project = load_project(root)
    t, pack = project.settings.train, project.pack
    schedule = kept_steps.Schedule.from_settings(t)
    dims = kept_steps.shard_dims(project.paths.shard_dir("train")) or {
        "in_dim": pack.in_dim, "out_dim": pack.out_dim, "vis_dim": pack.vis_dim}
    size = kept_steps.estimate_for(
        pack.adapter_kind, **dims, width=t.width, depth=t.depth,
        num_queries=pack.num_queries, seed_vocab=pack.seed_vocab,
        taps=tuple(pack.taps or ()))
    planned = schedule.planned(t.steps)
    files = schedule.files_on_disk(t.steps)
    out = {"files": files, "planned": len(planned), **size}
    if not schedule.enabled:
        out["text"] = "kept steps are off (train.history)"
    elif not planned:
        out["text"] = (f"the window (steps {t.history_from} to {t.history_to or t.steps}) holds "
                       "no step of this run; nothing would be kept")
    else:
        grid = (f"every {t.history_every} steps" if t.history_every
                else f"at every validation (every {t.val_every} steps)")
        kept_note = f", the newest {t.history_keep} stay" if t.history_keep else ""
        size_note = (
            f"{files} file(s) of about {size['kept_bytes'] / 1e6:.1f} MB, "
            f"{files * size['kept_bytes'] / 1e9:.2f} GB on disk (last.pt is about "
            f"{size['last_bytes'] / 1e6:.1f} MB)" if size["kept_bytes"] else
            f"{files} file(s), each the weights alone, without last.pt's optimizer state")
        out["text"] = (
            f"{len(planned)} kept step(s) {grid} from step {planned[0]} to {planned[-1]}"
            f"{kept_note}: {size_note}; a stop or snapshot inside the window adds one")
    return out
