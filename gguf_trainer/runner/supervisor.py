"""The supervisor: the one place the CLI and the GUI start, stop, kill and watch pipelines.

Owns: launching pipelines (through processes.spawn_detached), the launch monitor (records how a job
process ended in exit.json, since nobody can record its own SIGKILL), signalling VERIFIED
processes only, and ~/.gguf-trainer/settings.json. Must not: import torch, write
state.json (the pipeline's), or signal a pid it has not just matched to the lock holder's
start time (pids are reused; the earlier trainer SIGTERMed strangers after a reboot).

Process tree of a detached run (one session, no controlling terminal):
    monitor   python -m gguf_trainer.runner.supervisor monitor --exit-file exit.json -- ...
      └ pipeline  python -m gguf_trainer.runner.pipeline --project DIR ...   (lock holder)
`status()["pid"]` is always the lock holder, never the monitor.

Usage:
    pid = supervisor.start(project_dir)          # UserError "already running (pid N)"
    supervisor.status(project_dir)["status"]     # idle|running|stalled|interrupted|stopped|
                                                 # failed|done
    supervisor.stop(project_dir)                 # "stopped" | "not running"; StopTimeout
    supervisor.kill(project_dir)                 # "killed" | "not running"
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from gguf_trainer.base import atomic, locks, project_file
from gguf_trainer.base.errors import NoProjectError, UserError, quote
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import lock, processes, state
from gguf_trainer.runner import status as status_mod

log = logging.getLogger(__name__)

PIPELINE_MODULE = "gguf_trainer.runner.pipeline"
HOME_ENV = "GGUF_TRAINER_HOME"  # relocates ~/.gguf-trainer (tests point it at a tmp dir)
DEFAULT_HOME = "~/.gguf-trainer"
SETTINGS_JSON = "settings.json"
START_WAIT_S = 30.0
STOP_TIMEOUT_S = 30.0
KILL_WAIT_S = 10.0
EXIT_RECORDS_KEPT = 8


class StopTimeout(UserError):
    """stop() waited `timeout_s` and the pipeline is still finishing (CLI exit code 3)."""


def project_paths(project_dir: str | os.PathLike) -> ProjectPaths:
    """ProjectPaths of an existing project; NoProjectError (CLI exit 2) otherwise."""
    paths = ProjectPaths(project_dir)
    try:
        return _existing(paths)
    except OSError as e:  # a 300-character name, a loop, no permission: not a project here
        raise NoProjectError(f"{quote(str(paths.root))} cannot be opened as a project "
                             f"({e.strerror}); check the --project path") from None


def _existing(paths: ProjectPaths) -> ProjectPaths:
    if paths.root.is_file():  # a non-project like any other (CLI exit 2)
        raise NoProjectError(
            f"{paths.root} is a file, not a project folder; check the --project path"
        )
    if paths.project_json.is_dir():
        raise UserError(
            f"{paths.project_json} is a folder, not a file; move it away and "
            "recreate the project (gguf-trainer new --pack ID DIR)"
        )
    if not paths.exists():
        raise NoProjectError(
            f"{paths.root} is not a gguf-trainer project (no project.json); "
            "check the --project path"
        )
    return paths


# ---- start / stop / kill / status -----------------------------------------------------
def start(
    project_dir: str | os.PathLike,
    only: list[str] | None = None,
    force: bool = False,
    module: str = PIPELINE_MODULE,
    wait_s: float = START_WAIT_S,
    launch=None,
) -> int:
    """Launch the pipeline detached; returns the pid of the lock holder once it is up.

    Refuses with LockHeld ("already running (pid N)") if a pipeline holds the project, also
    when another start or a foreground run won a race for the lock. A broken project.json
    is refused here, with its sentence, rather than in the log of a pipeline that dies.
    """
    paths = project_paths(project_dir)
    if module == PIPELINE_MODULE:  # test pipelines (other modules) run on dummy projects
        from gguf_trainer.store.project import load_project  # lazy: pydantic, no torch

        load_project(paths.root)
    unknown = [s for s in only or [] if s not in state.STAGES]
    if unknown:
        raise UserError(f"unknown stage {unknown[0]!r}; choose from {', '.join(state.STAGES)}")
    holder = lock.probe(paths)
    if holder is not None:
        raise locks.LockHeld(holder)
    clear_stale_stop(paths)
    argv = [sys.executable, "-m", module, "--project", str(paths.root)]
    argv += ["--only", *only] if only else []
    argv += ["--force"] if force else []
    extra_env = None
    if launch is not None and launch.needed():  # several processes: accelerate's launcher
        extra_env = {k: v for k, v in launch.env().items() if k.startswith("GGUF_TRAINER_")}
        argv = launch.argv(argv[3:])
    proc = processes.spawn_detached(
        argv, paths.pipeline_log, paths.root, state.exit_record_path(paths), extra_env
    )
    pid = _await_lock_holder(paths, proc, wait_s)
    remember_project(paths.root)
    return pid


def clear_stale_stop(paths: ProjectPaths) -> bool:
    """Remove a stop request nobody will answer (left by a `stop` that timed out, or
    `stop --timeout 0`, before a `kill` or a crash), so the next start does not stop at
    once. Only when no pipeline holds the lock. True if one was removed."""
    if lock.probe(paths) is not None:
        return False
    try:
        paths.stop_request.unlink()
        return True
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        raise UserError(
            f"{paths.stop_request} is a folder; remove it (the tool writes a "
            "stop request file there)."
        ) from None


def _parent_of(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.NoSuchProcess:
        return None


def _ancestors(pid: int, depth: int = 3) -> list[int]:
    """The parent, grandparent... of `pid`: rank 0 of a launched run is the grandchild of
    the monitor (monitor -> accelerate's launcher -> ranks)."""
    out = []
    for _ in range(depth):
        pid = _parent_of(pid)
        if not pid:
            break
        out.append(pid)
    return out


def _await_lock_holder(paths: ProjectPaths, proc: subprocess.Popen, wait_s: float) -> int:
    deadline = time.monotonic() + wait_s
    while True:
        found = lock.holder(paths, settle_s=0.05)
        if found and proc.pid in _ancestors(found[0]):
            return found[0]
        if proc.returncode is not None:
            return _launch_outcome(paths, proc, found)
        if time.monotonic() > deadline:
            raise UserError(
                f"the pipeline did not start within {wait_s:.0f} s; see {paths.pipeline_log}"
            )
        time.sleep(0.05)


def _launch_outcome(
    paths: ProjectPaths, proc: subprocess.Popen, found: tuple[int, float] | None
) -> int:
    """Our monitor ended before we saw its pipeline hold the lock: why?"""
    ours = [r for r in status_mod.read_exit_records(paths) if r.get("monitor_pid") == proc.pid]
    child = ours[-1]["pid"] if ours else None
    st = status_mod.read_state(paths) or {}
    if child is not None and st.get("pid") == child:  # it ran (quickly) and recorded its end
        if st.get("status") in ("done", "stopped"):
            return child
        raise UserError(
            st.get("error") or f"the pipeline ended {st.get('status')}; see {paths.pipeline_log}"
        )
    if found is None:
        found = lock.holder(paths)
    if found is not None:
        raise locks.LockHeld(found[0])
    raise UserError(
        f"the pipeline exited at once (code {proc.returncode}); see {paths.pipeline_log}"
    )


def status(project_dir: str | os.PathLike) -> dict:
    """The derived status (see runner.state): status, message, pid, stage, stages, step,
    steps, val_cos, best_val_cos, error, mock, heartbeat_age_s, ..."""
    return status_mod.derive_status(project_paths(project_dir), files=render_files())


def render_files() -> dict[str, str]:
    """The user's file for each placeholder of a pack's ggk command (`render --file`, kept in
    settings.json; render_job owns the key): the printed ggk command carries them."""
    got = read_settings().get("render")
    files = got.get("files") if isinstance(got, dict) else None
    return {k: v for k, v in files.items() if isinstance(k, str) and isinstance(v, str) and v} \
        if isinstance(files, dict) else {}


def is_active(info: dict) -> bool:
    return info["status"] in ("running", "stalled")


def wait(
    project_dir: str | os.PathLike, timeout_s: float | None = None, poll_s: float = 0.5
) -> dict:
    """Block until the pipeline is no longer running/stalled (or timeout); the last status."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        info = status(project_dir)
        if not is_active(info) or (deadline is not None and time.monotonic() > deadline):
            return info
        time.sleep(poll_s)


def _holder_gone(paths: ProjectPaths, pid: int) -> bool:
    found = lock.holder(paths, settle_s=0.05)
    return found is None or found[0] != pid


def stop(
    project_dir: str | os.PathLike, timeout_s: float = STOP_TIMEOUT_S, grace_s: float | None = None
) -> str:
    """Graceful stop: stop.request, then (after `grace_s`) SIGTERM to the verified holder.

    The pipeline finishes its current step / teacher batch, saves and exits 0. Returns
    "stopped", "not running", or "stopping" when `timeout_s` is 0 (do not wait: the GUI).
    Raises StopTimeout when it is still finishing after `timeout_s`. Never SIGKILL (kill).
    """
    paths = project_paths(project_dir)
    found = lock.holder(paths)
    if found is None:
        return "not running"
    pid, start_time = found
    atomic.write_json(paths.stop_request, {"time": time.time(), "by_pid": os.getpid()})
    if timeout_s <= 0:
        return "stopping"
    if grace_s is None:
        slowest = (status_mod.read_state(paths) or {}).get("slowest_unit_s") or 0.0
        grace_s = min(timeout_s / 2, max(5.0, 2 * slowest))
    begun = time.monotonic()
    sent_term = False
    while time.monotonic() - begun < timeout_s:
        if _holder_gone(paths, pid):
            return "stopped"
        if not sent_term and time.monotonic() - begun >= grace_s:
            sent_term = True
            if processes.signal_verified(pid, start_time, signal.SIGTERM):
                log.info("stop: sent SIGTERM to pid %d", pid)
        time.sleep(0.1)
    if _holder_gone(paths, pid):
        return "stopped"
    raise StopTimeout(
        f"stop requested, but pid {pid} is still finishing its step after "
        f"{timeout_s:.0f} s; check `gguf-trainer status`, or end it now with "
        "`gguf-trainer kill`"
    )


def kill(project_dir: str | os.PathLike, wait_s: float = KILL_WAIT_S) -> str:
    """SIGKILL the verified lock holder and its descendants. "killed" | "not running".

    Before the signal it writes killed.json {pid, pid_start_time, time}: state.json stays
    "running" (only the pipeline writes it, and it gets no chance), so the marker is how
    derive_status tells "killed on request" (shown as stopped) from a crash or OOM kill.
    """
    paths = project_paths(project_dir)
    found = lock.holder(paths)
    if found is None:
        return "not running"
    pid, start_time = found
    try:
        kids = [
            (p.pid, locks.process_start_time(p.pid))
            for p in psutil.Process(pid).children(recursive=True)
        ]
    except psutil.NoSuchProcess:
        return "not running"
    from gguf_trainer.runner import ranks  # torch-free

    kids += ranks.local_rank_processes(paths.root)  # a launched run's other ranks here
    marker = state.killed_marker_path(paths)
    atomic.write_json(
        marker,
        {"pid": pid, "pid_start_time": start_time, "time": time.time(), "by_pid": os.getpid()},
    )
    if not processes.signal_verified(pid, start_time, signal.SIGKILL):
        with contextlib.suppress(FileNotFoundError):
            marker.unlink()
        return "not running"
    for kid, kid_start in kids:
        processes.signal_verified(kid, kid_start, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while not _holder_gone(paths, pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return "killed"


def run_launched(
    paths, launch, pipeline_args: list[str], on_change=None, poll_s: float = 0.5
) -> int:
    """`gguf-trainer run` with several processes: the launcher runs as a child of the CLI in
    its own session, its output appended to pipeline.log (the launcher's own messages are not
    the user's to read). Progress is read back from state.json and handed to
    `on_change(stage, stage_dict)` like the in-process run does. The first Ctrl-C asks every
    rank to stop after its unit (the stop request); a second one ends the ranks (SIGTERM)."""
    with project_file.open_append(paths.root, paths.pipeline_log) as out:  # never via a link
        proc = subprocess.Popen(
            launch.argv(pipeline_args),
            env={**processes.child_env(), **launch.env()},
            cwd=paths.root,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    seen: dict = {}
    interrupts = 0

    def interrupt(_signum, _frame):  # the terminal closing, or a plain kill: as Ctrl-C
        raise KeyboardInterrupt

    old = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    while proc.poll() is None:
        try:
            if on_change is not None and launch.is_main_machine:
                _forward_progress(status_mod.read_state(paths) or {}, seen, on_change)
            time.sleep(poll_s)
        except KeyboardInterrupt:
            interrupts += 1
            if interrupts == 1 and launch.is_main_machine:
                os.write(2, b"\nstopping after the current step (Ctrl-C again to abort)\n")
                stop(paths.root, timeout_s=0)
            else:
                os.killpg(proc.pid, signal.SIGTERM)
    for sig, handler in old.items():
        signal.signal(sig, handler)
    if on_change is not None and launch.is_main_machine:
        _forward_progress(status_mod.read_state(paths) or {}, seen, on_change)
    return proc.returncode


def _forward_progress(state: dict, seen: dict, on_change) -> None:
    for name, stage in (state.get("stages") or {}).items():
        if isinstance(stage, dict) and stage.get("status") != "pending" and seen.get(name) != stage:
            seen[name] = dict(stage)
            on_change(name, stage)


# ---- settings and auto-resume ---------------------------------------------------------
def home_dir() -> Path:
    return Path(os.environ.get(HOME_ENV) or DEFAULT_HOME).expanduser()


def settings_path() -> Path:
    return home_dir() / SETTINGS_JSON


def read_settings() -> dict:
    try:
        data = atomic.read_json(settings_path(), {})
    except (ValueError, OSError):  # garbage, a folder, unreadable: behave as if empty, say so
        log.warning("%s is not valid JSON; ignoring it", settings_path())
        return {}
    return data if isinstance(data, dict) else {}


def remember_project(project_dir: str | os.PathLike) -> None:
    """Record the project for --auto-resume. Best effort: a settings file that cannot be
    written (a folder in its place, a read-only home) never stops a run; it is logged."""
    settings = read_settings()
    settings["last_project"] = str(Path(project_dir).expanduser().resolve())
    try:
        atomic.write_json(settings_path(), settings)
    except (OSError, UserError) as e:
        log.warning("cannot remember the project for --auto-resume: %s", e)


def auto_resume(module: str = PIPELINE_MODULE) -> str:
    """Relaunch the last project only if its run was interrupted; returns a sentence.

    Finished, stopped and failed runs are left alone. Raises UserError if the relaunch fails.
    """
    last = read_settings().get("last_project")
    if not isinstance(last, str) or not last.strip():  # any other content: no last project
        return "auto-resume: no project was started yet"
    paths = ProjectPaths(last)
    if not paths.exists():
        return f"auto-resume: the last project {paths.root} no longer exists"
    info = status_mod.derive_status(paths)
    if info["status"] != "interrupted":
        return f"auto-resume: {paths.root} is {info['status']}; nothing to resume"
    if module == PIPELINE_MODULE:  # the project's own switch (test pipelines have none)
        from gguf_trainer.store.project import load_project  # lazy: pydantic, no torch

        settings = load_project(paths.root).settings
        if not settings.auto_resume:
            return f"auto-resume: {paths.root} was interrupted, but its auto_resume is off"
    launch = None
    if module == PIPELINE_MODULE:  # as many processes as the settings ask (one machine)
        from gguf_trainer.runner.launch import Launch

        launch = Launch().resolved(settings)
    pid = start(paths.root, module=module, launch=launch)
    return f"auto-resume: relaunched {paths.root} (pid {pid}); it was interrupted: {info['error']}"


# ---- the launch monitor (runs as its own small process) -------------------------------
def _append_exit_record(exit_path: Path, record: dict) -> None:
    try:
        data = atomic.read_json(exit_path, {}) or {}
    except ValueError:  # damaged by hand: start a fresh list rather than lose this record
        data = {}
    records = [r for r in data.get("exits", []) if isinstance(r, dict)]
    atomic.write_json(exit_path, {"exits": (records + [record])[-EXIT_RECORDS_KEPT:]})


def monitor_main(argv: list[str]) -> int:
    """Run the job as a child, wait, record how it ended. Exit with its code (128+sig)."""
    parser = argparse.ArgumentParser(prog=f"python -m {processes.MONITOR_MODULE} monitor")
    parser.add_argument("--exit-file", required=True, type=Path)
    parser.add_argument("job", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    children: list[subprocess.Popen] = []

    def forward(signum, _frame):  # a handler, not SIG_IGN: exec resets it in the child
        for child in children:
            child.send_signal(signum)  # no-op once reaped, so never a recycled pid

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    proc = subprocess.Popen(job, close_fds=True)
    children.append(proc)
    start_time = locks.process_start_time(proc.pid)  # None if it died at once
    rc = proc.wait()
    sig_name = signal.Signals(-rc).name if rc < 0 else None
    _append_exit_record(
        args.exit_file,
        {
            "pid": proc.pid,
            "pid_start_time": start_time,
            "returncode": rc,
            "signal": sig_name,
            "time": time.time(),
            "argv": job,
            "monitor_pid": os.getpid(),
        },
    )
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    how = f"killed by {sig_name}" if sig_name else f"exited with code {rc}"
    print(f"===== exit {stamp}: pid {proc.pid} {how}", flush=True)
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    if sys.argv[1:2] != ["monitor"]:
        sys.exit(f"usage: python -m {processes.MONITOR_MODULE} monitor --exit-file F -- CMD...")
    sys.exit(monitor_main(sys.argv[2:]))
