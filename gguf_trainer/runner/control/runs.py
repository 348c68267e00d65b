"""The control API's runs: the one pre-flight, the pipeline started detached (one machine or
several), stopped, killed, waited on; its status, metrics and results. Torch-free, like all of
runner.control: the pipeline runs in its own process (runner.supervisor)."""

from __future__ import annotations

from typing import Any

from gguf_trainer.base import locks
from gguf_trainer.base.errors import UserError
from gguf_trainer.runner import capacity, lock, supervisor
from gguf_trainer.runner import status as status_mod
from gguf_trainer.runner.control.helpers import PathLike, _paths, _set_steps_idle
from gguf_trainer.runner.stages import env_wants_mock
from gguf_trainer.runner.views import RunPlan
from gguf_trainer.stages.stage_list import EVALUATING, EXPORTING


# ---- runs -----------------------------------------------------------------------------
def start(
    root: PathLike,
    only: list[str] | None = None,
    force: bool = False,
    steps: Any = None,
    launch=None,
) -> int:
    """Launch the pipeline detached; returns the pipeline's pid once it holds the lock.
    `steps` (optional) is stored first. Refused (UserError) while it runs, when
    project.json is broken, when another project in the same output folder has the same
    name, or when the materials are missing (with the path tried and the fix)."""
    paths = _paths(root)
    plan = preflight_run(paths.root, only, steps, launch)  # every check before any write
    steps, launch = plan.steps, plan.launch
    if not launch.is_main_machine:
        raise UserError(
            "start runs machine rank 0 (it holds the project); on the other "
            "machines use `gguf-trainer run` with the same flags."
        )
    if steps is not None:
        _set_steps_idle(paths, steps)
    # Several machines: rank 0 starts only once every machine has joined the rendezvous.
    wait = {"wait_s": JOIN_WAIT_S} if launch.several_machines else {}
    return supervisor.start(paths.root, only=only, force=force, launch=launch, **wait)


JOIN_WAIT_S = 600.0  # how long `start` on machine 0 waits for the other machines


def preflight_run(root: PathLike, only: list[str] | None = None, steps: Any = None,
                  launch=None) -> RunPlan:
    """The pre-flight sequence of every run — `run` (alone or launched), `start`, the GUI's
    Start — in one order: the steps parsed, the launch resolved (flags, processes, capacity),
    then on the machine that holds the project (machine rank 0) `preflight`'s project checks.
    Writes nothing but the material links and a stale stop request cleared; the caller then
    stores the steps and starts."""
    from gguf_trainer.store.project_schema import parse_steps

    steps = None if steps is None else parse_steps(steps)
    launch = resolve_launch(root, launch)
    linked = preflight(root, only=only) if launch.is_main_machine else []
    return RunPlan(steps=steps, launch=launch, linked=linked)


def resolve_launch(root: PathLike, launch=None):
    """The launch of a run (runner.launch.Launch): the flags given, the processes per
    machine from precompute.processes / train.processes when no flag says."""
    from gguf_trainer.runner.launch import Launch
    from gguf_trainer.store import project

    proj = project.load_project(_paths(root).root)
    launch = (launch or Launch()).resolved(proj.settings)
    launch.check()
    if launch.needed() and launch.config_file is None:  # a config file says it all itself
        mock = proj.settings.precompute.mock_teacher or env_wants_mock()
        flag = "precompute.processes / train.processes" if launch.per_stage else "--processes"
        capacity.check_processes(launch.processes or 1, capacity.read_capacity(proj, mock), flag)
    return launch


def export(root: PathLike, evaluate: bool = True) -> int:
    """Re-export (and re-evaluate) from best.pt in a detached pipeline: `start --only export
    eval --force`. Works after the teacher folder was deleted (fingerprints come from the
    recorded manifests). Returns the pid."""
    return start(root, only=[EXPORTING, EVALUATING] if evaluate else [EXPORTING], force=True)


def read_metrics(root: PathLike, offset: int = 0) -> tuple[list[dict], int]:
    """metrics.jsonl rows appended since byte `offset` and the next offset (see
    runner.state.read_metrics: a row whose step is <= one already held means a resume
    truncated the file; drop held rows from that step on)."""
    from gguf_trainer.runner.state import read_metrics as _read

    try:
        offset = max(0, int(offset))
    except (TypeError, ValueError):
        offset = 0
    return _read(_paths(root), offset)


def preflight(root: PathLike, only: list[str] | None = None) -> list[str]:
    """The checks `start` and `run` make before anything is written or launched: a valid
    project.json, the run not already live, no name clash in the output folder, the
    materials present (missing ones linked first to a copy discovery finds), and a stale stop
    request cleared. Raises UserError with the sentence; returns a line per material linked."""
    from gguf_trainer.store import project

    paths = _paths(root)
    proj = project.load_project(paths.root)
    holder = lock.probe(paths)
    if holder is not None:
        raise locks.LockHeld(holder)
    project.check_name_clash(proj)
    from gguf_trainer.runner import downloads

    linked = downloads.check_materials(proj, only)
    clear_stale_requests(paths.root)
    return linked


def clear_stale_requests(root: PathLike) -> list[str]:
    """Remove a stop request left by a `stop` that timed out or a `kill` (nobody holds the
    lock, so nobody will answer it): the next start must not stop at once. Returns what
    was removed. Never touches a live run's requests."""
    paths = _paths(root)
    if lock.probe(paths) is not None:
        return []
    removed = []
    for p in (paths.stop_request, paths.snapshot_request):
        try:
            p.unlink()
            removed.append(str(p))
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            raise UserError(f"{p} is a folder; remove it (the tool writes a file there).") from None
    return removed


def stop(root: PathLike, timeout_s: float = supervisor.STOP_TIMEOUT_S) -> str:
    """Graceful stop: "stopped" | "stopping" (timeout_s 0: do not wait) | "not running".
    Raises supervisor.StopTimeout when it is still finishing after timeout_s."""
    return supervisor.stop(_paths(root).root, timeout_s=timeout_s)


def kill(root: PathLike) -> str:
    """SIGKILL the verified pipeline and its children: "killed" | "not running"."""
    return supervisor.kill(_paths(root).root)


def status(root: PathLike) -> dict:
    """The `gguf-trainer status --json` dict (see runner.status.derive_status): status,
    message, pid, stage, stages, step, steps, val_cos, error, mock, settings_error (a broken
    project.json), jobs ({"snapshot": job state, ...}), results (where the GGUF, eval.json
    and ggk command are once exported), stopping (a stop was requested and the run is still
    alive: show "stopping…" until it has ended). Never raises for any content of the tool's
    files."""
    paths = _paths(root)
    info = status_mod.derive_status(paths)
    # stop.request outlives a run that was killed (clear_stale_requests removes it at the
    # next start), so it only means "stopping" while the run is alive.
    try:
        requested = paths.stop_request.is_file()
    except OSError:
        requested = False
    info["stopping"] = supervisor.is_active(info) and requested
    return info


def wait(root: PathLike, timeout_s: float | None = None) -> dict:
    """Block until the pipeline is not running/stalled (or timeout); the last status."""
    return supervisor.wait(_paths(root).root, timeout_s=timeout_s)


def results(root: PathLike) -> dict:
    """Where the outputs are: {"gguf": path or None (exists), "eval_json": path or None,
    "ggk": pasteable command or None, "notes": [sentences], "mock": bool}."""
    from gguf_trainer.store.results import describe_results

    # the files the user set for the command's placeholders (render --file) go in it
    return describe_results(_paths(root).root, supervisor.render_files())


def results_text(root: PathLike) -> str:
    """`results()` as the lines `run`, `start`'s end and `demo` print."""
    r = results(root)
    lines = []
    if r.get("gguf"):
        lines.append(f"adapter:   {r['gguf']}")
    if r.get("eval_json"):
        lines.append(
            f"eval:      {r['eval_json']}" + (f"  ({r['eval_line']})" if r.get("eval_line") else "")
        )
    if r.get("ggk"):
        lines.append(f"ggk:       {r['ggk']}")
    lines += [f"note:      {n}" for n in r.get("notes") or []]
    return "\n".join(lines)
