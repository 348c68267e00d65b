"""Client side of the run state: what `status` shows, derived from files, never stored.

Reads state.json (written by the pipeline, see runner.state for its schema), the lock
(runner.lock) and the monitor's exit records, and turns them into one of
idle | running | stalled | interrupted | stopped | failed | done. Must not write anything.
"""

from __future__ import annotations

import logging
import socket
import time

import psutil

from gguf_trainer import atomic
from gguf_trainer.paths import ProjectPaths
from gguf_trainer.runner import lock
from gguf_trainer.runner.state import (
    HEARTBEAT_STALE_S, STALL_MIN_S, STALL_UNITS, empty_state, exit_record_path, killed_marker_path,
)

log = logging.getLogger(__name__)

_CRASH_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGABRT", "SIGILL", "SIGFPE")


def read_state(paths: ProjectPaths) -> dict | None:
    """state.json as written, or None when there is none (or it is unreadable)."""
    try:
        state = atomic.read_json(paths.state_json)
    except ValueError:  # not JSON: someone edited it; treat as "no state" and say so in the log
        log.warning("%s is not valid JSON; ignoring it", paths.state_json)
        return None
    return state if isinstance(state, dict) else None


def read_exit_records(paths: ProjectPaths) -> list[dict]:
    """The launcher monitors' records, oldest first: {pid, pid_start_time, returncode,
    signal (name or null), time, argv, monitor_pid}."""
    try:
        data = atomic.read_json(exit_record_path(paths), {}) or {}
    except ValueError:  # torn by hand-editing; the records are advisory
        return []
    records = data.get("exits") if isinstance(data, dict) else None
    return [r for r in records or [] if isinstance(r, dict)]


def find_exit_record(paths: ProjectPaths, state: dict) -> dict | None:
    """The exit record of the process that wrote `state`, if its monitor left one."""
    for record in reversed(read_exit_records(paths)):
        if record.get("pid") == state.get("pid") and (
                record.get("pid_start_time") is None or state.get("pid_start_time") is None
                or _same_process(record["pid"], record["pid_start_time"],
                                 state["pid"], state["pid_start_time"])):
            return record
    return None


def death_sentence(record: dict | None, state: dict) -> str:
    """One sentence on how a pipeline that never recorded its end died."""
    pid = state.get("pid")
    if record:
        sig = record.get("signal")
        if sig == "SIGKILL":
            return "killed by SIGKILL — out of memory?"
        if sig in _CRASH_SIGNALS:
            return f"crashed with {sig} — see pipeline.log"
        if sig:
            return f"killed by {sig}"
        return f"exited with code {record.get('returncode')} without recording a result — see pipeline.log"
    heartbeat = state.get("heartbeat") or 0.0
    if psutil.boot_time() > heartbeat:
        return "the machine restarted while the pipeline was running"
    return f"the pipeline process (pid {pid}) is gone without recording a result — see pipeline.log"


def format_eta(eta_s: float | None) -> str:
    """"1h05m" / "4m10s" / "12s"; "—" when not measured yet."""
    if eta_s is None:
        return "—"
    eta_s = round(eta_s)
    h, rem = divmod(eta_s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _same_process(a_pid, a_start, b_pid, b_start) -> bool:
    if a_pid is None or a_pid != b_pid or a_start is None or b_start is None:
        return False
    return abs(float(a_start) - float(b_start)) <= lock.START_TIME_TOLERANCE_S


def _running_message(out: dict) -> str:
    stage = out["stages"].get(out["stage"] or "", {})
    text = f"{out['status']} (pid {out['pid']})"
    if out["stage"]:
        text += f": {out['stage']}"
        if stage.get("total") is not None:
            text += f" {stage.get('done')}/{stage['total']} {stage.get('unit') or ''}".rstrip()
            text += f", ETA {format_eta(stage.get('eta_s'))}"
    return text


def derive_status(paths: ProjectPaths, now: float | None = None) -> dict:
    """What clients show. state.json's keys plus: status (derived, see the module doc),
    state_status (as recorded), message (one line), pid (the verified lock holder or None:
    the only pid anyone may signal), last_pid, heartbeat_age_s, progress_age_s,
    stall_after_s, exit (the exit record or None), project (the folder).
    """
    now = time.time() if now is None else now
    state = read_state(paths)
    found = lock.holder(paths)
    if found is None and state is not None and state.get("status") == "running":
        state = read_state(paths)  # it may have finished between our two reads
    out = empty_state()
    out.update(state or {})
    holder_pid = found[0] if found else None
    out.update(state_status=(state or {}).get("status"), pid=holder_pid,
               last_pid=(state or {}).get("pid"), project=str(paths.root),
               exit=find_exit_record(paths, state) if state else None,
               heartbeat_age_s=None if out["heartbeat"] is None else now - out["heartbeat"],
               progress_age_s=None if out["progress_time"] is None else now - out["progress_time"],
               stall_after_s=max(STALL_MIN_S, STALL_UNITS * (out["slowest_unit_s"] or 0.0)))
    if state is None:
        out["status"] = "running" if holder_pid else "idle"
        out["message"] = f"starting (pid {holder_pid})" if holder_pid else "idle (never run)"
        return out
    recorded = state.get("status")
    if found and not _same_process(state.get("pid"), state.get("pid_start_time"), *found):
        # The holder has not written its first state yet: what we read is the previous run.
        out.update(status="running", stage=None, stages={}, error=None,
                   message=f"starting (pid {holder_pid})")
        return out
    if recorded in ("stopped", "failed", "done"):
        out["status"] = recorded
        out["message"] = recorded + (f": {state.get('error')}" if state.get("error") else "")
        return out
    if found:
        return _live_status(out)
    return _dead_status(out, paths, state)


def _live_status(out: dict) -> dict:
    if out["heartbeat_age_s"] is not None and out["heartbeat_age_s"] > HEARTBEAT_STALE_S:
        out["status"] = "stalled"
        out["message"] = (f"stalled (pid {out['pid']}): no heartbeat for "
                          f"{format_eta(out['heartbeat_age_s'])} — is the process frozen or suspended?")
    elif out["progress_age_s"] is not None and out["progress_age_s"] > out["stall_after_s"]:
        out["status"] = "stalled"
        out["message"] = (f"stalled (pid {out['pid']}): no progress in {out['stage'] or 'startup'} "
                          f"for {format_eta(out['progress_age_s'])} — see pipeline.log")
    else:
        out["status"] = "running"
        out["message"] = _running_message(out)
    return out


def _dead_status(out: dict, paths: ProjectPaths, state: dict) -> dict:
    host = state.get("host")
    fresh = out["heartbeat_age_s"] is not None and out["heartbeat_age_s"] <= HEARTBEAT_STALE_S
    if lock.is_locked(paths) or (fresh and host and host != socket.gethostname()):
        # Held by a process we cannot name (another host sharing the folder, a container
        # with its own pids): it runs, but nobody here may signal it (pid stays None).
        out["status"] = "running"
        out["message"] = (f"running on host {host} (pid {state.get('pid')} there); control it "
                          "from that machine" if host != socket.gethostname() else
                          "running, but its process cannot be named from here (a container?)")
        return out
    killed = atomic.read_json(killed_marker_path(paths)) or {}
    if _same_process(killed.get("pid"), killed.get("pid_start_time"),
                     state.get("pid"), state.get("pid_start_time")):
        out["status"] = "stopped"
        out["message"] = "stopped (killed on request with gguf-trainer kill)"
    else:
        out["status"] = "interrupted"
        out["error"] = death_sentence(out["exit"], state)
        out["message"] = f"interrupted: {out['error']}"
    for stage in out["stages"].values():  # nobody runs them any more
        if stage.get("status") == "running":
            stage.update(status=out["status"], eta_s=None)
    return out
