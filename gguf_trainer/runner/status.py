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

from gguf_trainer.base import atomic, locks
from gguf_trainer.base.jsonvals import finite_number as _num
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import lock
from gguf_trainer.runner.state import (
    HEARTBEAT_STALE_S,
    RUN_STATUSES,
    STAGE_STATUSES,
    STALL_MIN_S,
    STALL_UNITS,
    empty_state,
    exit_record_path,
    killed_marker_path,
)

log = logging.getLogger(__name__)

_CRASH_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGABRT", "SIGILL", "SIGFPE")


def read_json_quiet(path, default=None, inside=None):
    """A JSON file the tool wrote, or `default` for ANY problem (absent, a folder in its
    place, unreadable, not UTF-8, not JSON, nested too deep; with `inside`, a link out of
    that project folder): observing never crashes."""
    try:
        return atomic.read_json(path, default, inside=inside)
    except (ValueError, OSError, RecursionError):
        log.warning("%s is unreadable or not valid JSON; ignoring it", path)
        return default


def _int(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _str(v):
    return v if isinstance(v, str) else None


_STATE_TYPES = {"status": _str, "pid": _int, "pid_start_time": _num, "host": _str,
                "started": _num, "finished": _num, "heartbeat": _num, "progress_time": _num,
                "slowest_unit_s": _num, "stage": _str, "step": _num, "steps": _num,
                "val_cos": _num, "best_val_cos": _num, "error": _str, "exit_code": _int}
_STAGE_TYPES = {"status": _str, "started": _num, "finished": _num, "done": _num, "total": _num,
                "unit": _str, "rate": _num, "eta_s": _num, "detail": _str,
                # the lead figures (stages/train.py LEAD_FIELDS): all rows, short, long prompts
                **{f"val_cc_{n}{b}": _num for n in ("tokens", "pads")
                   for b in ("", "_short", "_long")}}


def sanitize_state(raw) -> dict | None:
    """state.json content with every known key of the right type (wrong types become
    "unknown"), stages that are not objects dropped; None if it is not an object."""
    if not isinstance(raw, dict):
        return None
    st = dict(raw)
    for key, check in _STATE_TYPES.items():
        if key in st:
            st[key] = check(st[key])
    if st.get("status") not in RUN_STATUSES:
        st["status"] = None
    st["mock"] = st.get("mock") is True
    st["argv"] = [a for a in st["argv"] if isinstance(a, str)] if isinstance(st.get("argv"),
                                                                            list) else None
    stages = st.get("stages") if isinstance(st.get("stages"), dict) else {}
    clean = {}
    for name, stage in stages.items():
        if not isinstance(stage, dict):
            continue
        stage = dict(stage)
        for key, check in _STAGE_TYPES.items():
            if key in stage:
                stage[key] = check(stage[key])
        if stage.get("status") not in STAGE_STATUSES:
            stage["status"] = "pending"
        stage["skipped"] = stage.get("skipped") is True
        clean[str(name)] = stage
    st["stages"] = clean
    return st


def read_state(paths: ProjectPaths) -> dict | None:
    """state.json as written (sanitized: see sanitize_state), or None when there is none
    or it is unreadable."""
    return sanitize_state(read_json_quiet(paths.state_json, inside=paths.root))


def read_exit_records(paths: ProjectPaths) -> list[dict]:
    """The launcher monitors' records, oldest first: {pid, pid_start_time, returncode,
    signal (name or null), time, argv, monitor_pid}."""
    data = read_json_quiet(exit_record_path(paths), {})  # advisory: garbage reads as none
    records = data.get("exits") if isinstance(data, dict) else None
    records = records if isinstance(records, list) else []
    out = []
    for r in records:
        if isinstance(r, dict):
            out.append(
                {
                    **r,
                    "pid": _int(r.get("pid")),
                    "pid_start_time": _num(r.get("pid_start_time")),
                    "returncode": _int(r.get("returncode")),
                    "signal": _str(r.get("signal")),
                    "monitor_pid": _int(r.get("monitor_pid")),
                }
            )
    return out


def find_exit_record(paths: ProjectPaths, state: dict) -> dict | None:
    """The exit record of the process that wrote `state`, if its monitor left one."""
    for record in reversed(read_exit_records(paths)):
        if record.get("pid") == state.get("pid") and (
            record.get("pid_start_time") is None
            or state.get("pid_start_time") is None
            or _same_process(
                record["pid"], record["pid_start_time"], state["pid"], state["pid_start_time"]
            )
        ):
            return record
    return None


def death_sentence(record: dict | None, state: dict) -> str:
    """One sentence on how a pipeline that never recorded its end died."""
    pid = state.get("pid")
    if state.get("rank_failure"):  # a launched run ended by a dead rank (ranks.RankWatch)
        return str(state["rank_failure"])
    if record:
        sig = record.get("signal")
        if sig == "SIGKILL":
            return "killed by SIGKILL — out of memory?"
        if sig in _CRASH_SIGNALS:
            return f"crashed with {sig} — see pipeline.log"
        if sig:
            return f"killed by {sig}"
        return (f"exited with code {record.get('returncode')} without recording a result — "
                "see pipeline.log")
    heartbeat = _num(state.get("heartbeat")) or 0.0
    if psutil.boot_time() > heartbeat:
        return "the machine restarted while the pipeline was running"
    return f"the pipeline process (pid {pid}) is gone without recording a result — see pipeline.log"


def format_eta(eta_s: float | None) -> str:
    """Reads "1h05m" / "4m10s" / "12s"; "—" when not measured yet."""
    if eta_s is None:
        return "—"
    eta_s = round(eta_s)
    h, rem = divmod(eta_s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _same_process(a_pid, a_start, b_pid, b_start) -> bool:
    if _int(a_pid) is None or a_pid != b_pid or _num(a_start) is None or _num(b_start) is None:
        return False
    return abs(float(a_start) - float(b_start)) <= locks.START_TIME_TOLERANCE_S


def _running_message(out: dict) -> str:
    stage = out["stages"].get(out["stage"] or "", {})
    text = f"{out['status']} (pid {out['pid']})"
    if out["stage"]:
        text += f": {out['stage']}"
        if stage.get("total") is not None:
            text += f" {stage.get('done')}/{stage['total']} {stage.get('unit') or ''}".rstrip()
            text += f", ETA {format_eta(stage.get('eta_s'))}"
    return text


def derive_status(paths: ProjectPaths, now: float | None = None,
                  files: dict[str, str] | None = None) -> dict:
    """What clients show. state.json's keys plus: status (derived, see the module doc),
    state_status (as recorded), message (one line), pid (the verified lock holder or None:
    the only pid anyone may signal), last_pid, heartbeat_age_s, progress_age_s,
    stall_after_s, exit (the exit record or None), project (the folder),
    settings_error (the sentence when project.json is broken, else None: the message then
    starts with it), jobs ({"snapshot": runner.jobs.job_status}), results (when done: where
    the GGUF, eval.json and ggk command are; see control.results).
    Answers for any content of the files the tool writes.
    """
    out = _derive_run(paths, now)
    out["settings_error"] = _settings_error(paths)
    if out["settings_error"]:
        out["message"] = f"project.json is broken: {out['settings_error']} ({out['message']})"
    elif (
        out["status"] == "stopped"
        and isinstance(out.get("reset"), dict)
        and out.get("state_status") == "stopped"
    ):
        stages = out["reset"].get("stages")
        if isinstance(stages, list):
            out["message"] = (
                f"reset: {', '.join(map(str, stages))} cleared; start again to rebuild them"
            )
    from gguf_trainer.runner import jobs  # lazy: jobs imports the supervisor

    out["jobs"] = {"snapshot": jobs.job_status(paths.root, "snapshot")}
    from gguf_trainer.data.kept_steps import kept_summary  # torch-free

    out["kept"] = kept_summary(paths)  # train.history: how many kept steps, bytes on disk
    out["results"] = None
    if out["status"] == "done" and not out["settings_error"]:
        try:
            from gguf_trainer.store.results import describe_results

            out["results"] = describe_results(paths.root, files)
        except Exception as e:  # noqa: BLE001 - observing never crashes; say what failed
            log.warning("cannot describe the results: %s", e)
    return out


def _settings_error(paths: ProjectPaths) -> str | None:
    from gguf_trainer.base.errors import UserError
    from gguf_trainer.store.project import load_project

    try:
        load_project(paths.root)
    except UserError as e:
        return str(e).replace("\n  ", " ").replace("\n", " ")
    return None


def _derive_run(paths: ProjectPaths, now: float | None = None) -> dict:
    now = time.time() if now is None else now
    state = read_state(paths)
    found = lock.holder(paths)
    if found is None and state is not None and state.get("status") == "running":
        state = read_state(paths)  # it may have finished between our two reads
    out = empty_state()
    out.update(state or {})
    holder_pid = found[0] if found else None
    out.update(
        state_status=(state or {}).get("status"),
        pid=holder_pid,
        last_pid=(state or {}).get("pid"),
        project=str(paths.root),
        exit=find_exit_record(paths, state) if state else None,
        heartbeat_age_s=None if out["heartbeat"] is None else now - out["heartbeat"],
        progress_age_s=None if out["progress_time"] is None else now - out["progress_time"],
        stall_after_s=max(STALL_MIN_S, STALL_UNITS * (out["slowest_unit_s"] or 0.0)),
    )
    if state is None:
        out["status"] = "running" if holder_pid else "idle"
        out["message"] = f"starting (pid {holder_pid})" if holder_pid else "idle (never run)"
        return out
    recorded = state.get("status")
    if found and not _same_process(state.get("pid"), state.get("pid_start_time"), *found):
        # The holder has not written its first state yet: what we read is the previous run.
        out.update(
            status="running",
            stage=None,
            stages={},
            error=None,
            message=f"starting (pid {holder_pid})",
        )
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
        out["message"] = (
            f"stalled (pid {out['pid']}): no heartbeat for "
            f"{format_eta(out['heartbeat_age_s'])} — is the process frozen or suspended?"
        )
    elif out["progress_age_s"] is not None and out["progress_age_s"] > out["stall_after_s"]:
        out["status"] = "stalled"
        out["message"] = (
            f"stalled (pid {out['pid']}): no progress in {out['stage'] or 'startup'} "
            f"for {format_eta(out['progress_age_s'])} — see pipeline.log"
        )
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
        out["message"] = (
            f"running on host {host} (pid {state.get('pid')} there); control it from that machine"
            if host != socket.gethostname()
            else "running, but its process cannot be named from here (a container?)"
        )
        return out
    killed = read_json_quiet(killed_marker_path(paths), {})
    killed = killed if isinstance(killed, dict) else {}
    if _same_process(
        killed.get("pid"),
        killed.get("pid_start_time"),
        state.get("pid"),
        state.get("pid_start_time"),
    ):
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
