"""Reset: delete a stage's outputs and everything built on them, on the user's request.

    corpus -> data, shards, checkpoints, eval.json, snapshots.json, ranks
    shards -> shards, checkpoints, eval.json, snapshots.json, ranks
    train  -> checkpoints, eval.json, snapshots.json, ranks
    output -> this project's exported GGUFs (final, copies, snapshots) by the exact paths
              recorded in exports.json and snapshots.json, never by name prefix; then those
              two records

Every delete goes through gguf_trainer.base.safe_delete: project folders only inside the
project and never through a symlink; recorded exports only when they are still the
regular file the tool wrote (size + sha256, or GGUF metadata naming this project), and only
where and as the project writes exports (its folder, export.output_dir, export.copy_to;
`<name>[-step<N>]-<dtype>.gguf` or a companion): a record is not proof of ownership.
`ranks/` (a launched run's rank progress files and logs) goes with the stages these
targets set back to pending: it describes that run's precompute and training.
Anything else is reported in `kept` and left alone. `plan()` is the dry run and runs the
same checks, so what it lists is exactly what `reset()` deletes.

Refused while the pipeline or a snapshot job of the project runs. While deleting it holds
the pipeline lock, so it is then the one writer of state.json: the stages it cleared are
set back to "pending", and `status` no longer shows them done.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from gguf_trainer.base import atomic, places, safe_delete
from gguf_trainer.base.errors import UserError, quote
from gguf_trainer.base.jsonvals import number
from gguf_trainer.base.paths import TOOL_FILES, ProjectPaths
from gguf_trainer.stages.stage_list import EXPORTING, SHARD_STAGES, STAGES, TRAINING, stages_from
from gguf_trainer.store.project import written_by_another

from . import lock

log = logging.getLogger(__name__)
TARGETS = ("corpus", "shards", "train", "output")
CLEARS = {  # stages whose outputs a reset removes (shown "pending" afterwards)
    "corpus": STAGES, "shards": stages_from(SHARD_STAGES[0]), "train": stages_from(TRAINING),
    "output": (EXPORTING,),
}


def _read_obj(path: Path) -> dict:
    try:
        data = atomic.read_json(path, {}, inside=path.parent)  # records sit at the top level
    except (ValueError, OSError):
        return {}
    return data if isinstance(data, dict) else {}


def recorded_exports(paths: ProjectPaths) -> list[dict]:
    """Files this project recorded writing (exports.json, plus snapshot GGUFs listed in
    snapshots.json) where and as it writes them (Project.export_places): [{path, kind, time,
    size, sha256, exists}], newest first. Any garbage in the records reads as fewer (or no)
    entries; a record naming another place or name is ignored with one log line."""
    places_now = _export_places(paths)
    items = []
    for it in _all_recorded(paths):
        why = places_now.why_not(it["path"])
        if why:
            log.warning("%s in %s's records %s", it["path"], paths.root, why)
        else:
            items.append(it)
    for it in items:
        it["exists"] = Path(it["path"]).is_file()
        if it["exists"] and not isinstance(it.get("size"), int):
            it["size"] = Path(it["path"]).stat().st_size
    return items


def _export_places(paths: ProjectPaths) -> safe_delete.ExportPlaces:
    """The project's export places now; none (so nothing is deleted) when project.json
    cannot be read."""
    from gguf_trainer.store.project import load_project

    try:
        return load_project(paths.root).export_places()
    except UserError:
        return safe_delete.ExportPlaces((), "")


def _all_recorded(paths: ProjectPaths) -> list[dict]:
    """Every entry of the records, wherever it points: [{path, kind, time, size, sha256}]."""
    out: dict[str, dict] = {}
    files = _read_obj(paths.exports_json).get("files")
    root = paths.root.resolve()
    for p, rec in (files.items() if isinstance(files, dict) else []):
        rec = rec if isinstance(rec, dict) else {}
        p = str(places.recorded_path(str(p), root))  # relative: beside this project's folder
        out[p] = {"path": p, "kind": rec.get("kind") if isinstance(rec.get("kind"), str)
                       else "file", "time": number(rec.get("time")), "size": rec.get("size"),
                       "sha256": rec.get("sha256"), "project": rec.get("project")}
    snaps = _read_obj(paths.snapshots_json).get("snapshots")
    for e in snaps if isinstance(snaps, list) else []:
        if not isinstance(e, dict) or not isinstance(e.get("path"), str):
            continue
        p = places.recorded_path(e["path"], root)
        key = str(p)
        if key not in out and str(p.resolve()) not in out:
            out[key] = {"path": key, "kind": "snapshot", "time": number(e.get("time")),
                        "size": e.get("size") if isinstance(e.get("sha256"), str) else None,
                        "sha256": e.get("sha256"), "project": e.get("project")}
    return sorted(out.values(), key=lambda it: -(it["time"] or 0.0))


def _project_name(paths: ProjectPaths) -> str | None:
    from gguf_trainer.store.project import load_project

    try:
        return load_project(paths.root).settings.name
    except UserError:
        return None


def _owned(paths: ProjectPaths, target: str) -> list[tuple[Path, str]]:
    dirs = {"corpus": [paths.data, paths.shards], "shards": [paths.shards], "train": [],
            "output": []}[target]
    items = [(d, "dir") for d in dirs]
    if target != "output":
        items += [(paths.checkpoints, "dir"), (paths.eval_json, "file"),
                  (paths.snapshots_json, "file"), (paths.ranks, "dir")]
    return items


def _recorded_by_another(path: Path, paths: ProjectPaths) -> str | None:
    """Why `path` is kept: another project beside it records it too. A copied project's
    records (absolute ones from an older version, or relative ones of a copy made in the same
    folder) name the original's files, which a reset of the copy must never delete."""
    me = os.path.realpath(paths.root)
    try:
        others = [d for d in path.parent.iterdir() if d.is_dir() and os.path.realpath(d) != me
                  and ProjectPaths(d).exports_json.is_file()]
    except OSError:
        return None
    for other in others:
        if str(path) in {it["path"] for it in recorded_exports(ProjectPaths(other))}:
            return (f"the project {other} records it too (this one is a copy of it?); left alone")
    return None


def _check_target(target: str) -> None:
    if target not in TARGETS:
        raise UserError(f"unknown reset target {quote(target)}; "
                        f"choose one of {', '.join(TARGETS)}.")


def _blocked(paths: ProjectPaths, target: str) -> str | None:
    from . import jobs

    pid = lock.probe(paths)
    if pid is not None:
        return (
            f"the pipeline is running (pid {pid}); stop it first with "
            f"gguf-trainer stop --project {paths.root}"
        )
    if jobs.is_running(paths.root, "snapshot"):
        return f"a snapshot export is running; wait for it before resetting {target}"
    if jobs.is_running(paths.root, "publish"):  # it reads the exports a reset would delete
        return f"a publish is uploading this project's files; wait for it before resetting {target}"
    return None


def _decide(paths: ProjectPaths, target: str) -> tuple[list[tuple], list[dict]]:
    """([(path, how, arg)], kept): what to delete (how: owned|recorded) and what to keep."""
    todo, kept = [], []
    if target == "output":
        name, places_now = _project_name(paths), _export_places(paths)
        for it in _all_recorded(paths):
            p = Path(it["path"])
            if not (p.exists() or p.is_symlink()):
                continue
            writer = written_by_another(p, paths.root, it)
            reason = (safe_delete.check_recorded_file(p, it, name, places_now)
                      or (f"the project {writer} wrote it and records it too (this one is a "
                          "copy of it?); left alone" if writer else None)
                      or _recorded_by_another(p, paths))
            if reason:
                kept.append({"path": str(p), "reason": reason})
            else:
                todo.append((p, "recorded", it))
        owned = [(paths.exports_json, "file"), (paths.snapshots_json, "file")]
    else:
        owned = _owned(paths, target)
    for p, kind in owned:
        if not (p.exists() or p.is_symlink()):
            continue
        reason = safe_delete.check_owned(p, paths.root, kind, TOOL_FILES.get(p.name))
        if reason:
            kept.append({"path": str(p), "reason": reason})
        else:
            todo.append((p, "owned", kind))
    return todo, kept


def plan(paths: ProjectPaths, target: str) -> dict:
    """The dry run: {target, delete: [paths], keep: [{path, reason}], blocked}."""
    _check_target(target)
    todo, kept = _decide(paths, target)
    return {
        "target": target,
        "delete": [str(p) for p, _h, _a in todo],
        "keep": kept,
        "blocked": _blocked(paths, target),
    }


def reset(paths: ProjectPaths, target: str) -> dict:
    """Delete what plan() lists; {target, deleted, kept}. UserError while a run or job is live."""
    _check_target(target)
    why = _blocked(paths, target)
    if why:
        raise UserError(why)
    # Hold the pipeline lock while deleting, so a start cannot slip in after the check.
    with lock.hold(paths, retry_s=0):
        todo, kept = _decide(paths, target)
        deleted = []
        for p, how, arg in todo:
            if how == "recorded":
                v = safe_delete.remove_recorded_file(p, arg, _project_name(paths),
                                                     _export_places(paths))
            else:
                v = safe_delete.remove_owned(p, paths.root, arg, TOOL_FILES.get(p.name))
            if v.deleted:
                deleted.append(str(p))
            elif v.reason:
                kept.append({"path": str(p), "reason": v.reason})
        _mark_pending(paths, CLEARS[target])
    return {"target": target, "deleted": deleted, "kept": kept}


def _mark_pending(paths: ProjectPaths, stages: tuple[str, ...]) -> None:
    """state.json: the cleared stages back to pending (we hold the pipeline lock, so we
    are its one writer now). A missing or unreadable state.json is left as it is."""
    from .state import _pending_stage

    state = _read_obj(paths.state_json)
    if not state or not isinstance(state.get("stages"), dict):
        return
    for name in stages:
        if name in state["stages"]:
            fresh = _pending_stage()
            fresh["detail"] = "reset"
            state["stages"][name] = fresh
    if state.get("status") == "done":
        state["status"] = "stopped"  # the run's outputs are gone: it is no longer done
        state["error"] = None
    if TRAINING in stages:
        state.pop("ranks", None)  # gathered from the rank files this reset deleted
    state["reset"] = {"time": time.time(), "stages": list(stages)}
    try:
        atomic.write_json(paths.state_json, state)
    except (OSError, ValueError, TypeError):
        pass  # status then still shows the old stages; the deletes already happened


def reset_project(root, target: str) -> list[str]:
    """Back-compatible wrapper: deleted paths (see reset)."""
    from gguf_trainer.store.project import load_project

    _check_target(target)
    return reset(load_project(root).paths, target)["deleted"]
