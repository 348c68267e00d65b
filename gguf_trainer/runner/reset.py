"""Reset: delete a stage's outputs and everything built on them, on the user's request.

    corpus -> data, shards, checkpoints, eval.json, snapshots.json
    shards -> shards, checkpoints, eval.json, snapshots.json
    train  -> checkpoints, eval.json, snapshots.json
    output -> this project's exported GGUFs (final, copies, snapshots) by the exact paths
              recorded in exports.json, never by name prefix; and snapshots.json

Refused while the pipeline or a snapshot job of the project runs. Returns what it deleted.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .. import atomic
from ..errors import UserError
from ..paths import ProjectPaths
from . import lock

TARGETS = ("corpus", "shards", "train", "output")


def _planned(paths: ProjectPaths, target: str) -> list[Path]:
    later = {"corpus": [paths.data, paths.shards], "shards": [paths.shards], "train": [], "output": []}[target]
    if target == "output":
        man = atomic.read_json(paths.exports_json, {"files": {}}) or {"files": {}}
        return [Path(p) for p in sorted(man["files"])] + [paths.exports_json, paths.snapshots_json]
    return later + [paths.checkpoints, paths.eval_json, paths.snapshots_json]


def reset_project(root, target: str) -> list[str]:
    from ..project import load_project

    if target not in TARGETS:
        raise UserError(f"unknown reset target {target!r}; choose one of {', '.join(TARGETS)}.")
    paths = load_project(root).paths
    pid = lock.probe(paths)
    if pid is not None:
        raise UserError(f"the pipeline is running (pid {pid}); stop it before resetting {target}.")
    if lock.probe_file(paths.snapshot_lock) is not None:
        raise UserError(f"a snapshot export is running; wait for it before resetting {target}.")
    # Hold the pipeline lock while deleting, so a start cannot slip in after the check.
    with lock.hold(paths, retry_s=0):
        deleted = []
        for path in _planned(paths, target):
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
            else:
                continue
            deleted.append(str(path))
    return deleted
