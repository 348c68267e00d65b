"""The stage loop and its bookkeeping: fingerprints, manifests, validation, invalidation.

corpus -> precompute_val -> precompute_train -> train -> export -> eval
(stages.stage_list; each stage module exposes its stage object: stages.corpus,
precompute, train, export, evaluate. This module knows no stage by name.)

Each fingerprinted stage records the inputs of its outputs in `<folder>/manifest.json`. A
stage is done when its outputs exist and were made from the current inputs. When an input
changes, that stage and every stage whose inputs name it are invalidated (checkpoints are
moved aside to `checkpoints.stale-<time>/`, never deleted) and the log says which input
changed. Validate before destroy: every stage that is about to be redone loads and checks
its new inputs (`Stage.check`: the student file, the teacher, the settings) first; nothing
is invalidated unless all checks pass. Settings that do not change any output
(train.steps, devices, batch/token budgets, teacher placement, threads) are in no fingerprint.

Bookkeeping heals from the data: a manifest that is missing or damaged is rebuilt (one log
line) when the outputs vouch for the current inputs — every shard and checkpoint records the
fingerprint it was made from, and a stage whose outputs record none (the corpus) is vouched
for by a later stage made from it. Only a real input change moves work aside.

    run_stages(paths, report, only=None, force=False) -> "done" | "stopped"
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field

from gguf_trainer.base import atomic, project_file
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import MANIFEST_JSON, ProjectPaths
from gguf_trainer.stages.stage_list import FORCEABLE, STAGES, Stage, Stopped

log = logging.getLogger(__name__)

MOCK_ENV = "GGUF_TRAINER_MOCK_TEACHER"


def env_wants_mock() -> bool:
    return os.environ.get(MOCK_ENV, "").strip().lower() not in ("", "0", "false")


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def stage_objects() -> tuple[Stage, ...]:
    """The stage objects in pipeline order (imports torch through the stage modules)."""
    from gguf_trainer.stages import corpus, evaluate, export, precompute, train

    objs = (corpus.STAGE, *precompute.STAGE, train.STAGE, export.STAGE, evaluate.STAGE)
    names = tuple(s.name for s in objs)
    if names != STAGES:  # a programmer error: stage_list and the stage modules disagree
        raise RuntimeError(f"stage objects {names} do not match stage_list.STAGES {STAGES}")
    return objs


@dataclass
class RunContext:
    """What the loop hands a stage: its fingerprint, everyone's, and a cache shared by the
    stages of this pipeline run (objects with close() are closed once no stage needs them)."""

    fingerprints: dict[str, str] = field(default_factory=dict)
    cache: dict = field(default_factory=dict)
    force: bool = False
    fingerprint: str | None = None

    def for_stage(self, stage: Stage) -> RunContext:
        self.fingerprint = self.fingerprints.get(stage.name)
        return self

    def release(self, keep: set[str]) -> None:
        for key in [k for k in self.cache if k not in keep]:
            obj = self.cache.pop(key)
            close = getattr(obj, "close", None)
            if close is not None:
                close()


# ---------------------------------------------------------------- manifests


def read_manifest(paths: ProjectPaths, stage: Stage) -> dict | None:
    folder = stage.folder(paths)
    if folder is None:
        return None
    try:
        man = atomic.read_json(folder / MANIFEST_JSON)
    except (ValueError, OSError):  # garbage or a folder in its place: not a record of anything
        return None
    # JSON of another shape (no fingerprint, no inputs) is damage too, not a change of inputs.
    if not isinstance(man, dict) or not isinstance(man.get("fingerprint"), str) \
            or not isinstance(man.get("inputs"), dict):
        return None
    return man


def write_manifest(paths: ProjectPaths, stage: Stage, inputs: dict, **extra) -> None:
    folder = project_file.make_dir(paths.root, stage.folder(paths))
    atomic.write_json(folder / MANIFEST_JSON, {"fingerprint": digest(inputs), "inputs": inputs,
                                               "time": time.time(), **extra})


def changed_keys(old: dict, new: dict, prefix: str = "") -> list[str]:
    keys = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += changed_keys(a, b, f"{prefix}{k}.")
        elif a != b:
            keys.append(prefix + k)
    return keys


def stage_inputs(project, objs: tuple[Stage, ...] | None = None) -> dict[str, dict]:
    """The inputs of each fingerprinted stage (a chain: each names its upstream's digest).
    Materials that are gone are stood in for by what the stage's manifest recorded."""
    objs = objs or stage_objects()
    inputs: dict[str, dict] = {}
    upstream: dict[str, str] = {}
    for stage in objs:
        man = read_manifest(project.paths, stage) or {}
        recorded = man.get("inputs") if isinstance(man.get("inputs"), dict) else None
        stage.make_inputs(project, recorded)  # fits what the inputs read (inputs only look)
        got = stage.inputs(project, dict(upstream), recorded)
        if got is not None:
            inputs[stage.name] = got
            upstream[stage.name] = digest(got)
    return inputs


def _vouched(project, objs, inputs: dict[str, dict], stage: Stage) -> bool:
    """The stage's outputs were made from its current inputs, by their own record (shards:
    any shard made from them, the others are recomputed as always; checkpoints: every one),
    or, for outputs that record nothing, by a later stage made from them."""
    fp = digest(inputs[stage.name])
    own = stage.recorded_fingerprints(project)
    if own:
        return own == {fp} if stage.manifest_first else fp in own
    folder = stage.folder(project.paths)
    if folder is None or not any(p.name != MANIFEST_JSON for p in folder.glob("*")):
        return False
    for later in objs:
        if later.name == stage.name or inputs.get(later.name, {}).get(stage.name) != fp:
            continue
        later_fp = digest(inputs[later.name])
        man = read_manifest(project.paths, later)
        if (man and man["fingerprint"] == later_fp) or later_fp in (
            later.recorded_fingerprints(project) or ()
        ):
            return True
    return False


def _clear_place(path) -> bool:
    """The manifest's path can take a file: absent, a file, or an empty folder (removed; it
    holds nothing). A folder with contents is left to the stage's own clear."""
    if path.is_dir() and not path.is_symlink():
        if any(path.iterdir()):
            return False
        path.rmdir()
    return True


def heal_manifests(project, objs, inputs: dict[str, dict]) -> list[str]:
    """Rebuild each missing or damaged manifest whose outputs vouch for the current inputs
    (hours of GPU work are not redone for a 1 KB file); returns the stages healed."""
    healed = []
    for stage in objs:
        if (
            stage.name in inputs
            and read_manifest(project.paths, stage) is None
            and _clear_place(stage.folder(project.paths) / MANIFEST_JSON)
            and _vouched(project, objs, inputs, stage)
        ):
            write_manifest(project.paths, stage, inputs[stage.name], complete=True, healed=True)
            healed.append(stage.name)
    if healed:
        log.warning(
            "rebuilt the missing or damaged manifest of %s from the fingerprints their "
            "shards and checkpoints record; nothing is redone",
            " and ".join(healed),
        )
    return healed


def dependents(objs: tuple[Stage, ...], inputs: dict[str, dict], name: str) -> list[str]:
    """`name` and every stage whose inputs name it, directly or through another."""
    out = [name]
    for stage in objs:
        if stage.name not in out and any(dep in inputs.get(stage.name, {}) for dep in out):
            out.append(stage.name)
    return out


def stale_stages(project, objs, inputs: dict[str, dict]) -> dict[str, str]:
    """{stage: why} for every stage whose recorded inputs differ from the current ones, and
    all their dependents; a train-like stage (manifest_first) with outputs but no manifest too."""
    stale: dict[str, str] = {}
    for stage in objs:
        if stage.name not in inputs or stage.name in stale:
            continue
        man = read_manifest(project.paths, stage)
        if man is None:
            folder = stage.folder(project.paths)
            if (
                stage.manifest_first
                and folder is not None
                and folder.is_dir()
                and any(folder.iterdir())
            ):
                stale[stage.name] = "outputs without a manifest"
            continue
        if man.get("fingerprint") != digest(inputs[stage.name]):
            old = man.get("inputs") if isinstance(man.get("inputs"), dict) else {}
            why = ", ".join(changed_keys(old, inputs[stage.name])) or "format"
            for name in dependents(objs, inputs, stage.name):
                stale.setdefault(name, f"{stage.name} inputs changed ({why})")
    return stale


def invalidate(project, objs, stale: dict[str, str]) -> None:
    logged: set[str] = set()
    for stage in objs:
        if stage.name not in stale:
            continue
        why = stale[stage.name]
        if why not in logged:
            logged.add(why)
            redo = [s for s in stale if stale[s] == why]
            log.warning("%s: redoing %s", why, " and ".join(redo))
        stage.clear(project.paths)


def invalidate_changed(project, inputs: dict[str, dict] | None = None) -> None:
    """Clear every stage whose recorded inputs differ from the current ones, and its dependents
    (no validation: `run_stages` checks the new inputs first)."""
    objs = stage_objects()
    inputs = inputs if inputs is not None else stage_inputs(project, objs)
    invalidate(project, objs, stale_stages(project, objs, inputs))


# ---------------------------------------------------------------- done-ness


def is_done(project, stage: Stage, inputs: dict[str, dict], run: RunContext) -> bool:
    """The manifest names the current inputs and is complete, then the stage's outputs are
    repaired (Stage.tidy: the one place they are, the predicates only look) and judged."""
    if stage.name in inputs:
        man = read_manifest(project.paths, stage)
        if (
            man is None
            or man.get("fingerprint") != digest(inputs[stage.name])
            or not man.get("complete")
        ):
            return False
    stage.tidy(project, run.for_stage(stage))
    return stage.is_done(project, run)


# ---------------------------------------------------------------- the loop


def prepare_run(paths: ProjectPaths):
    """Record run settings that must stay fixed across resumes (mock flag, thread count)."""
    from gguf_trainer.store.project import load_project, update_settings

    project = load_project(paths.root)
    changes = {}
    if env_wants_mock() and not project.settings.precompute.mock_teacher:
        changes["precompute.mock_teacher"] = True
    if project.settings.train.threads == 0:
        changes["train.threads"] = max(1, min(os.cpu_count() or 1, 8))
    if changes:
        log.info("recording run settings in project.json: %s", changes)
        project = update_settings(paths.root, changes)
    return project


def _plan(objs, only) -> list[Stage]:
    unknown = [s for s in (only or []) if s not in STAGES]
    if unknown:
        raise UserError(f"unknown stage {unknown[0]!r}; choose from {', '.join(STAGES)}.")
    return [s for s in objs if not only or s.name in only]


def _check_stale(project, objs, stale: dict[str, str], run: RunContext) -> None:
    """Validate before destroy: every stage about to be redone loads and checks its new inputs
    (student file, teacher, settings) before anything is cleared. A run with nothing to clear
    loads lazily, stage by stage (the corpus is then refused before any model loads)."""
    for stage in objs:
        if stage.name in stale:
            stage.check(project, run.for_stage(stage))


def run_stages(paths: ProjectPaths, report, only=None, force: bool = False) -> str:
    from gguf_trainer.machine import distributed, hardware

    from . import ranks

    project = prepare_run(paths)
    hardware.pin_threads(distributed.rank_threads(project.settings.train.threads))
    hardware.apply_determinism(hardware.resolve_device(project.settings.train.device))
    if project.settings.precompute.mock_teacher:
        log.warning(
            "MOCK teacher: synthetic targets, a smoke test of the machinery, never a usable adapter"
        )
    report.fields(mock=project.settings.precompute.mock_teacher)
    objs = stage_objects()
    plan = _plan(objs, only)
    inputs = stage_inputs(project, objs)
    run = RunContext(fingerprints={k: digest(v) for k, v in inputs.items()}, force=force)
    try:
        heal_manifests(project, objs, inputs)
        stale = stale_stages(project, objs, inputs)
        _check_stale(project, objs, stale, run)
        invalidate(project, objs, stale)
        outcome = _loop(project, objs, plan, inputs, report, run)
        ranks.lead_end(outcome)  # launched: the other ranks leave too
        return outcome
    finally:
        run.release(keep=set())


def _loop(project, objs, plan, inputs, report, run: RunContext) -> str:
    for i, stage in enumerate(plan):
        outcome = _visit(project, stage, inputs, report, run)
        if outcome == "stopped":
            return "stopped"
        run.release(keep={k for s in plan[i + 1 :] for k in getattr(s, "shares", ())})
    return "done"


def _visit(project, stage: Stage, inputs, report, run: RunContext) -> str:
    """Skip the stage (done, or turned off) or run it; reports either way."""
    off = stage.skipped_because(project)
    if off:
        report.begin_stage(stage.name)
        report.end_stage(stage.name, "skipped", skipped=True, detail=off)
        return "done"
    forced = run.force and stage.name in FORCEABLE
    if not forced and is_done(project, stage, inputs, run):
        report.begin_stage(stage.name)
        report.end_stage(stage.name, "done", skipped=True)
        return "done"
    if report.stop_requested():
        return "stopped"
    report.begin_stage(stage.name)
    outcome = _run_one(project, stage, inputs, report, run)
    report.end_stage(stage.name, "stopped" if outcome == "stopped" else "done")
    return outcome


def _run_one(project, stage: Stage, inputs: dict, report, run: RunContext) -> str:
    paths = project.paths
    fingerprinted = stage.name in inputs
    if stage.restart:
        stage.clear(paths)
    if fingerprinted and (stage.restart or read_manifest(paths, stage) is None):
        write_manifest(paths, stage, inputs[stage.name], complete=stage.manifest_first)
    from . import ranks

    ranks.lead(
        stage.name, run.fingerprints.get(stage.name), stage.distributed
    )  # launched: ranks join
    try:
        outcome = stage.run(project, report, run.for_stage(stage))
    except Stopped:
        outcome = "stopped"
    if outcome == "done" and fingerprinted and not stage.manifest_first:
        write_manifest(paths, stage, inputs[stage.name], complete=True)
    return outcome
