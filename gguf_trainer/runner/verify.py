"""`gguf-trainer verify`: re-read every shard and checkpoint of a project and report rot.

A run trusts a shard it verified once while its size and mtime stay the same (verified.json),
so bit rot in a finished project would only surface at its next read, mid-training. verify
reads every byte: each shard against the checksum it was written with, each checkpoint
through the same safe load training uses. `repair` deletes just the damaged shards (derived
data) and recomputes them with the precompute stages; a damaged checkpoint is reported with
what to do (the run cannot rebuild hours of training from nothing).

Runs in the CLI process (like `check`) or as the detached job `verify` for the GUI; never
while a pipeline holds the project when repairing.

    report = verify_project(root, repair=False)   # {"ok": bool, "shards": ..., "checkpoints": ...}
    jobs.start_job(root, "verify", "gguf_trainer.runner.verify:job_main", {"repair": True})
"""

from __future__ import annotations

import logging
from pathlib import Path

from gguf_trainer.base import safe_delete
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import BEST, HISTORY_DIR, LAST, ProjectPaths
from gguf_trainer.data import kept_steps, shards
from gguf_trainer.data.checkpoints import checkpoint_path, load_checkpoint
from gguf_trainer.stages.stage_list import shard_stage

from . import lock, pipeline

log = logging.getLogger(__name__)

JOB = "verify"
SPLITS = ("val", "train")


def check_shards(paths: ProjectPaths) -> dict[str, dict]:
    """{split: {"ok": n, "damaged": {file name: reason}}} over every shard on disk."""
    out = {}
    for split in SPLITS:
        damaged, ok = {}, 0
        for path in shards.shard_files(paths.shard_dir(split)):
            reason = shards.check_shard(path)
            if reason:
                damaged[path.name] = reason
            else:
                ok += 1
        out[split] = {"ok": ok, "damaged": damaged}
    return out


def check_checkpoints(paths: ProjectPaths) -> dict[str, str]:
    """{last|best|history/step<N>: "ok" | the sentence loading it gives} for each checkpoint
    present, kept steps included."""
    out = {}
    for which in (LAST, BEST):
        path = checkpoint_path(paths.checkpoints, which)
        if not path.is_file():
            continue
        try:
            load_checkpoint(path)
            out[which] = "ok"
        except UserError as e:
            out[which] = str(e)
    for step in kept_steps.kept_steps_on_disk(paths):  # train.history's kept steps
        name = f"{HISTORY_DIR}/{kept_steps.kept_name(step)}"
        try:
            kept_steps.load_kept(paths, step)
            out[name] = "ok"
        except UserError as e:
            out[name] = str(e)
    return out


def verify_project(root, repair: bool = False) -> dict:
    """The report; with `repair`, damaged shards are deleted and recomputed first-hand."""
    paths = ProjectPaths(Path(root))
    if not paths.exists():
        raise UserError(
            f"{paths.root} is not a gguf-trainer project (no project.json); check the path."
        )
    report = {
        "shards": check_shards(paths),
        "checkpoints": check_checkpoints(paths),
        "repaired": [],
    }
    damaged = [(s, name) for s in SPLITS for name in report["shards"][s]["damaged"]]
    if repair and damaged:
        holder = lock.probe(paths)
        if holder is not None:
            raise UserError(f"the pipeline is running (pid {holder}); stop it, then repair.")
        for split, name in damaged:
            safe_delete.unlink_owned(paths.shard_dir(split) / name, paths.root,
                                     safe_delete.DAMAGED_SHARD)
            log.warning(
                "verify: shard %s/%s is %s; recomputing it",
                split,
                name,
                report["shards"][split]["damaged"][name],
            )
        only = [shard_stage(s) for s in SPLITS if any(d[0] == s for d in damaged)]
        code = pipeline.run_foreground(paths, only=only)
        if code != 0:
            raise UserError(f"recomputing the damaged shards failed; see {paths.pipeline_log}.")
        report["repaired"] = [f"{s}/{n}" for s, n in damaged]
        report["shards"] = check_shards(paths)
    report["ok"] = not any(report["shards"][s]["damaged"] for s in SPLITS) and all(
        v == "ok" for v in report["checkpoints"].values()
    )
    return report


def describe(report: dict, root) -> list[str]:
    """The lines the CLI prints and the GUI shows."""
    lines = []
    for split in SPLITS:
        got = report["shards"][split]
        lines.append(f"shards/{split}: {got['ok']} whole, {len(got['damaged'])} damaged")
        lines += [f"  {name}: {why}" for name, why in sorted(got["damaged"].items())]
    for which, verdict in report["checkpoints"].items():
        lines.append(f"checkpoints/{which}.pt: {verdict}")
    if report["repaired"]:
        lines.append(f"recomputed: {', '.join(report['repaired'])}")
    if any(report["shards"][s]["damaged"] for s in SPLITS):
        lines.append(
            f"recompute the damaged shards with: gguf-trainer verify --project {root} --repair"
        )
    shards = sum(report["shards"][s]["ok"] + len(report["shards"][s]["damaged"]) for s in SPLITS)
    if not shards and not report["checkpoints"]:  # a project never run: nothing to vouch for
        lines.append("nothing to verify yet: no shards and no checkpoints (the run writes them)")
    else:
        lines.append("verified: every shard and checkpoint is whole" if report["ok"]
                     else "damage found (above)")
    return lines


def job_main(folder: Path, job, repair: bool = False) -> dict:
    """The detached job the GUI starts (runner.jobs)."""
    report = verify_project(folder, repair)
    return {**report, "lines": describe(report, folder)}
