"""Detached jobs: one-off work (a snapshot export, a download) in its own process.

The caller (CLI, GUI) never runs the work itself: it spawns
`python -m gguf_trainer.runner.jobs run ...`, which holds the job's lock for its whole
life, records its state in a small JSON file and writes its output to a log. Any client
reads the state back with `job_status`; nothing is kept in the caller's memory.

Files of job NAME in FOLDER (a project folder, or any folder a job works on):
    NAME-job.json   the state (schema below), written atomically by the job only
    NAME.log        the job's output (appended; a banner per launch)
    NAME.lock       flock held by the running job (locks.py): one job per name+folder

State (NAME-job.json):
    name, job_id (unique per launch), target ("module:function"), kwargs,
    status   running | done | failed | stopped     (as recorded)
    pid, pid_start_time, started, finished, error (one sentence), result (the function's
    return value, JSON), progress (free fields the job reports with `job.update(...)`)
Derived by job_status (never stored): idle (never ran) and interrupted (state says running,
nobody holds the lock: killed, crashed, machine restarted).

A job function has the signature `fn(folder: Path, job: JobHandle, **kwargs) -> dict|None`.
It raises UserError for anything the user can fix (recorded as `error`, status failed);
other exceptions are recorded as "internal error ... see NAME.log" with the traceback in
the log.

    jobs.start_job(root, "snapshot", "gguf_trainer.runner.snapshot:job_main",
                   {"checkpoint": "last"})
    jobs.job_status(root, "snapshot")["status"]
    jobs.wait(root, "snapshot", timeout_s=60)
    jobs.stop_job(root, "snapshot")
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import re
import signal
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from gguf_trainer.base import atomic, locks
from gguf_trainer.base.errors import UserError, as_user_error
from gguf_trainer.base.exit_codes import EXIT_INTERNAL, EXIT_OK, EXIT_USER
from gguf_trainer.base.jsonvals import jsonable, number
from gguf_trainer.runner import processes

log = logging.getLogger(__name__)

JOBS_MODULE = "gguf_trainer.runner.jobs"
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
START_WAIT_S = 30.0
JOB_STATUSES = ("running", "done", "failed", "stopped")


def state_path(folder: Path, name: str) -> Path:
    return Path(folder) / f"{name}-job.json"


def log_path(folder: Path, name: str) -> Path:
    return Path(folder) / f"{name}.log"


def lock_path(folder: Path, name: str) -> Path:
    return Path(folder) / f"{name}.lock"


def _check_name(name: str) -> None:
    if not NAME_RE.match(name or ""):
        raise ValueError(f"job name {name!r} must match {NAME_RE.pattern}")


# ---- client side ----------------------------------------------------------------------
def start_job(folder: str | os.PathLike, name: str, target: str, kwargs: dict | None = None,
              wait_s: float = START_WAIT_S) -> dict:
    """Spawn job `name` running `target` ("module:function") with JSON `kwargs`, detached
    (new session, survives the caller). Returns its state once it runs (or has already
    ended). Raises LockHeld ("a NAME job is already running (pid N)") if one runs."""

    _check_name(name)
    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder; cannot run a {name} job there.")
    json.dumps(kwargs or {})  # refuse unserialisable arguments before spawning
    holder = locks.probe_file(lock_path(folder, name))
    if holder is not None:
        raise locks.LockHeld(holder, f"a {name} job is already running")
    job_id = uuid.uuid4().hex
    argv = [sys.executable, "-m", JOBS_MODULE, "run", "--folder", str(folder), "--name", name,
            "--target", target, "--job-id", job_id, "--kwargs", json.dumps(kwargs or {})]
    proc = processes.spawn_detached(argv, log_path(folder, name), folder)
    deadline = time.monotonic() + wait_s
    while True:
        st = job_status(folder, name)
        if st.get("job_id") == job_id:
            return st
        if proc.returncode is not None:
            st = job_status(folder, name)
            if st.get("job_id") == job_id:
                return st
            holder = locks.probe_file(lock_path(folder, name))
            if holder is not None:  # another client won the race
                raise locks.LockHeld(holder, f"a {name} job is already running")
            raise UserError(f"the {name} job exited at once (code {proc.returncode}); "
                            f"see {log_path(folder, name)}")
        if time.monotonic() > deadline:
            raise UserError(f"the {name} job did not start within {wait_s:.0f} s; "
                            f"see {log_path(folder, name)}")
        time.sleep(0.05)


def read_state(folder: str | os.PathLike, name: str) -> dict | None:
    """The recorded state, or None when absent or not a JSON object (any garbage), or when
    the file leads outside the folder (a planted link: its content would be shown)."""
    try:
        data = atomic.read_json(state_path(Path(folder), name), inside=Path(folder))
    except (ValueError, OSError):
        return None
    return data if isinstance(data, dict) else None


def job_status(folder: str | os.PathLike, name: str) -> dict:
    """{name, status: idle|running|done|failed|stopped|interrupted, pid (the verified
    holder, or None), job_id, started, finished, error, result, progress, log, message}.
    Answers for any content of the state file."""
    folder = Path(folder).expanduser().resolve()
    st = read_state(folder, name) or {}
    found = locks.holder(lock_path(folder, name), settle_s=0.1) if folder.is_dir() else None
    recorded = st.get("status") if st.get("status") in JOB_STATUSES else None
    out = {"name": name, "status": "idle", "pid": None, "job_id": _s(st.get("job_id")),
           "started": number(st.get("started")), "finished": number(st.get("finished")),
           "error": _s(st.get("error")), "result": st.get("result"),
           "progress": st.get("progress") if isinstance(st.get("progress"), dict) else {},
           "kwargs": st.get("kwargs") if isinstance(st.get("kwargs"), dict) else {},
           "log": str(log_path(folder, name))}
    if found is not None:
        out.update(status="running", pid=found[0])
        same = st.get("pid") == found[0]
        if not same:  # the holder has not written its state yet: what we read is older
            out.update(job_id=None, started=None, finished=None, error=None, result=None,
                       progress={})
        out["message"] = f"{name} running (pid {found[0]})"
        return out
    if recorded is None:
        out["message"] = f"no {name} job has run" if not st else f"{name}: unreadable state"
        return out
    if recorded == "running":
        out.update(status="interrupted",
                   error=f"the {name} job (pid {st.get('pid')}) ended without recording a "
                         f"result; see {out['log']}")
    else:
        out["status"] = recorded
    out["message"] = f"{name} {out['status']}" + (f": {out['error']}" if out["error"] else "")
    return out


def is_running(folder: str | os.PathLike, name: str) -> bool:
    return locks.probe_file(lock_path(Path(folder).expanduser().resolve(), name),
                           settle_s=0.1) is not None


def wait(folder: str | os.PathLike, name: str, timeout_s: float | None = None,
         poll_s: float = 0.2) -> dict:
    """Block until job `name` is not running (or timeout); its last status."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        st = job_status(folder, name)
        if st["status"] != "running" or (deadline is not None and time.monotonic() > deadline):
            return st
        time.sleep(poll_s)


def stop_job(folder: str | os.PathLike, name: str, timeout_s: float = 10.0) -> str:
    """SIGTERM the verified job process: "stopped" | "not running" | "stopping" (still
    alive after timeout_s). The job records status "stopped"."""

    lf = lock_path(Path(folder).expanduser().resolve(), name)
    found = locks.holder(lf)
    if found is None:
        return "not running"
    if not processes.signal_verified(found[0], found[1], signal.SIGTERM):
        return "not running"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = locks.holder(lf, settle_s=0.05)
        if now is None or now[0] != found[0]:
            return "stopped"
        time.sleep(0.05)
    return "stopping"


# ---- job side -------------------------------------------------------------------------
class JobStopped(Exception):
    """Raised inside the job by SIGTERM/SIGINT at the next `job.check()` or `update()`."""


class JobHandle:
    """What a job function gets: `update(**fields)` reports progress (also a stop check),
    `check()` raises JobStopped after SIGTERM, `log` writes to NAME.log."""

    def __init__(self, folder: Path, name: str, state: dict):
        self.folder = folder
        self.name = name
        self.state = state
        self.stop_requested = False
        self.log = logging.getLogger(f"gguf_trainer.job.{name}")

    def write(self) -> None:
        path = state_path(self.folder, self.name)
        try:
            atomic.write_json(path, _jsonable(self.state))
        except OSError as e:  # disk full: the job goes on; the final write retries
            # No room for a new file: overwrite the old record through its own blocks, so a
            # job that ended is never left "running" (readers tolerate a torn record).
            data = (json.dumps(_jsonable(self.state), indent=2, sort_keys=True) + "\n").encode()
            if not atomic.rewrite_in_place(path, data):
                self.log.warning("cannot write %s: %s", path, e)

    def update(self, **fields: Any) -> None:
        self.state.setdefault("progress", {}).update(fields)
        self.write()
        self.check()

    def check(self) -> None:
        if self.stop_requested:
            raise JobStopped()


def _resolve(target: str):
    module, _, func = target.partition(":")
    return getattr(importlib.import_module(module), func)


def run_job(folder: Path, name: str, target: str, job_id: str, kwargs: dict) -> int:
    """The job process body: hold the lock, record running, call target, record the end.
    Exit code (exit_codes): 0 done/stopped, 1 failed on a user error, 4 internal error."""
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        held = locks.hold_file(lock_path(folder, name), f"a {name} job is already running",
                              retry_s=0.5)
        held.__enter__()
    except locks.LockHeld as e:
        print(f"error: {e}", flush=True)
        return EXIT_USER
    me = os.getpid()
    state = {"schema": 1, "name": name, "job_id": job_id, "target": target, "kwargs": kwargs,
             "status": "running", "pid": me, "pid_start_time": locks.process_start_time(me),
             "started": time.time(), "finished": None, "error": None, "result": None,
             "progress": {}}
    job = JobHandle(folder, name, state)

    def on_signal(signum, _frame):
        job.stop_requested = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    job.write()
    code = EXIT_OK
    try:
        result = _resolve(target)(folder, job, **kwargs)
        state.update(status="done", result=_jsonable(result))
    except JobStopped:
        state.update(status="stopped", error="stopped on request")
    except Exception as e:  # noqa: BLE001 - last resort: the log gets the traceback
        user = as_user_error(e, fallback=folder)  # a UserError, or what the disk refused
        if user is not None:
            state.update(status="failed", error=str(user))
            print(f"error: {user}", flush=True)
            code = EXIT_USER
        else:
            traceback.print_exc(file=sys.stdout)
            state.update(status="failed", error=f"internal error ({type(e).__name__}); "
                                                f"see {log_path(folder, name)}")
            code = EXIT_INTERNAL
    state["finished"] = time.time()
    job.write()
    print(f"{name} job {state['status']}" + (f": {state['error']}" if state["error"] else ""),
          flush=True)
    held.__exit__(None, None, None)
    return code


def _jsonable(value: Any) -> Any:
    try:
        return jsonable(value)
    except TypeError:
        return json.loads(json.dumps(value, default=str))


def _s(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {JOBS_MODULE}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("--folder", required=True, type=Path)
    p.add_argument("--name", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--job-id", required=True)
    p.add_argument("--kwargs", default="{}")
    args = parser.parse_args(argv)
    return run_job(args.folder, args.name, args.target, args.job_id, json.loads(args.kwargs))


if __name__ == "__main__":
    # Run the imported module, not this `__main__` copy of it: job targets import
    # gguf_trainer.runner.jobs, and the JobStopped they raise must be the class run_job catches.
    sys.exit(importlib.import_module(JOBS_MODULE).main())
