"""Run state: the pipeline's `state.json` and `metrics.jsonl`, and the status clients derive.

Owns: `StateWriter` (the ONLY writer of state.json; a heartbeat thread), `Report` (the one
object stage code gets), metrics.jsonl writing/reading, and `derive_status` (client side).
Must not: spawn or signal processes, import torch, or be written to by clients.

state.json (schema 1; stable: `gguf-trainer status --json` exposes it). Times are Unix
epoch seconds (float); non-finite numbers are written as null.
    schema          1
    status          running | stopped | failed | done     (what the pipeline last recorded)
    pid             the pipeline process (the lock holder)
    pid_start_time  seconds after boot at which it started (locks.process_start_time): with
                    the pid it names the process (a pid alone is reused); not a date
    host            socket.gethostname()
    argv            the pipeline's command line
    started / finished
    heartbeat       refreshed every HEARTBEAT_S by a daemon thread, and on every write
    progress_time   last time any Report call moved something
    slowest_unit_s  longest wait between two advancing progress reports of a stage (one unit:
                    a step, a shard, a teacher batch, or N units when a stage reports every
                    N): the stall limit is STALL_UNITS times it
    stage           the stage running now (or the last one)
    stages          {name: {status: pending|running|done|skipped|stopped|failed,
                            started, finished, skipped (done earlier, not rerun),
                            done, total, unit, rate (units/s, recent), eta_s, detail,
                            ...free fields: step, steps, loss, val_cos, prompts_per_s, ...}}
    step, steps, val_cos, best_val_cos   copies of the latest stage fields of those names
    error           one sentence when failed, else null
    mock            true when the teacher is the mock teacher
    exit_code       the pipeline's exit code once it has one

Derived status (runner.status.derive_status, what clients show; never stored):
    idle        no state.json (never ran)
    running     the lock is held by a verified pid and the heartbeat is fresh
    stalled     the lock is held, but no progress for max(STALL_MIN_S, STALL_UNITS x
                slowest_unit_s), or no heartbeat for HEARTBEAT_STALE_S (frozen process)
    interrupted state.json says running but nobody holds the lock (crash, kill -9, OOM,
                reboot); `error` says how it died when the exit record (EXIT_JSON) knows;
                its running stage reads "interrupted" in the derived `stages`
    stopped | failed | done   as recorded (a `gguf-trainer kill` reads as stopped)
"""

from __future__ import annotations

import collections
import copy
import io
import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gguf_trainer.base import atomic, locks, project_file
from gguf_trainer.base.jsonvals import jsonable
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.stages.stage_list import STAGES  # noqa: F401  (display order, re-exported)

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
RUN_STATUSES = ("running", "stopped", "failed", "done")
STAGE_STATUSES = ("pending", "running", "done", "skipped", "stopped", "failed")
TOP_LEVEL_FIELDS = ("step", "steps", "val_cos", "best_val_cos", "mock")
_RESERVED = ("status", "started", "finished", "skipped", "done", "total", "unit", "rate", "eta_s")


HEARTBEAT_S = 2.0
HEARTBEAT_STALE_S = 60.0  # generous: a swapping machine can starve the heartbeat thread
STALL_MIN_S = 600.0
STALL_UNITS = 5
WRITE_MIN_INTERVAL_S = 0.5  # progress writes at most 2/s (first/last of a stage always)
ETA_WINDOW_S = 60.0
ETA_MIN_UNITS = 3


def exit_record_path(paths: ProjectPaths) -> Path:
    return paths.exit_json


def killed_marker_path(paths: ProjectPaths) -> Path:
    return paths.killed_json


def _pending_stage() -> dict:
    return {"status": "pending", "started": None, "finished": None, "skipped": False,
            "done": None, "total": None, "unit": None, "rate": None, "eta_s": None,
            "detail": None}


def empty_state() -> dict:
    """Every state.json key with its 'nothing known' value (clients fill gaps from this)."""
    return {"schema": SCHEMA_VERSION, "status": None, "pid": None, "pid_start_time": None,
            "host": None, "argv": None, "started": None, "finished": None, "heartbeat": None,
            "progress_time": None, "slowest_unit_s": None, "stage": None, "stages": {},
            "step": None, "steps": None, "val_cos": None, "best_val_cos": None,
            "error": None, "mock": False, "exit_code": None}


class StateWriter:
    """Sole writer of state.json. Thread-safe; `start()` runs the heartbeat thread.

    Writes are atomic (tmp + fsync + replace). `update()` changes the in-memory state;
    `flush()` writes now; `mark_dirty()` leaves the write to the thread (<= WRITE_MIN_INTERVAL_S).
    A failed write (disk full) is logged and retried by the thread; it never raises into
    the stage code.
    """

    def __init__(self, paths: ProjectPaths, argv: list[str], *, stages=(), mock: bool = False,
                 heartbeat_s: float = HEARTBEAT_S, clock: Callable[[], float] = time.time):
        self.paths = paths
        self.clock = clock
        self.heartbeat_s = heartbeat_s
        self._lock = threading.RLock()
        self._write_lock = threading.Lock()
        self._dirty = False
        self._last_write = -math.inf  # time.monotonic() of the last write
        self._write_failed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        me = os.getpid()
        now = clock()
        self._state = empty_state()
        self._state.update(status="running", pid=me, pid_start_time=locks.process_start_time(me),
                           host=socket.gethostname(), argv=list(argv), started=now,
                           heartbeat=now, progress_time=now, mock=bool(mock),
                           stages={name: _pending_stage() for name in stages})
        self.flush()

    def start(self) -> StateWriter:
        self._thread = threading.Thread(target=self._beat, name="state-heartbeat", daemon=True)
        self._thread.start()
        return self

    def snapshot(self) -> dict:
        with self._lock:
            return copy.deepcopy(self._state)

    def update(self, fn: Callable[[dict], Any]) -> Any:
        """Run fn(state) under the lock (the one way to change the state)."""
        with self._lock:
            return fn(self._state)

    def mark_dirty(self) -> None:
        with self._lock:
            self._dirty = True

    def write_due(self) -> bool:
        return time.monotonic() - self._last_write >= WRITE_MIN_INTERVAL_S

    def flush(self) -> bool:
        """Write state.json now (refreshing the heartbeat). False if the write failed."""
        with self._write_lock:
            with self._lock:
                self._state["heartbeat"] = self.clock()
                snap = jsonable(self._state)
                self._dirty = False
                self._last_write = time.monotonic()
            try:
                atomic.write_json(self.paths.state_json, snap)
            except OSError as e:  # disk full / read-only: keep running, retry from the thread
                with self._lock:
                    self._dirty = True
                if not self._write_failed:
                    log.warning("cannot write %s: %s (will retry)", self.paths.state_json, e)
                self._write_failed = True
                return False
            self._write_failed = False
            return True

    def close(self, status: str, error: str | None = None, exit_code: int | None = None) -> None:
        """Final record: run status, error, exit code; a still-running stage gets `status`."""
        assert status in RUN_STATUSES[1:], status
        now = self.clock()

        def finish(st: dict) -> None:
            for stage in st["stages"].values():
                if stage["status"] == "running":
                    stage.update(status=status, finished=now, eta_s=None)
            st.update(status=status, error=error, exit_code=exit_code, finished=now)

        self.update(finish)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.flush()

    def _beat(self) -> None:
        tick = min(self.heartbeat_s, WRITE_MIN_INTERVAL_S)
        while not self._stop.wait(tick):
            with self._lock:
                dirty = self._dirty
            since = time.monotonic() - self._last_write
            if (dirty and since >= WRITE_MIN_INTERVAL_S) or since >= self.heartbeat_s:
                self.flush()


class _StageClock:
    """Recent (time, done) samples of one stage: throughput, ETA and unit durations."""

    def __init__(self):
        self.samples: collections.deque = collections.deque(maxlen=512)

    def add(self, now: float, done: float) -> float | None:
        """Record a sample; returns the seconds since the previous advance (None if none).

        That gap, not a per-unit average, is what stall detection needs: a stage that
        reports every 25 steps is silent for 25 steps at a time.
        """
        gap_s = None
        if self.samples:
            t0, d0 = self.samples[-1]
            if done < d0:  # the count went back (a sub-phase restarted): forget the history
                self.samples.clear()
            elif done > d0:
                gap_s = now - t0
            else:
                return None
        self.samples.append((now, done))
        return gap_s

    def rate(self, total: float | None) -> float | None:
        """Units/s over the last ETA_WINDOW_S, widened back to cover ETA_MIN_UNITS units."""
        if len(self.samples) < 2:
            return None
        need = max(1, min(ETA_MIN_UNITS, int(total or 0) // 4))
        t_new, d_new = self.samples[-1]
        t_old, d_old = t_new, d_new
        for t, d in reversed(self.samples):
            t_old, d_old = t, d
            if t_new - t >= ETA_WINDOW_S and d_new - d >= need:
                break
        if d_new - d_old < need or t_new <= t_old:
            return None
        return (d_new - d_old) / (t_new - t_old)


class Report:
    """What stage code gets. Everything it tells the outside world goes through here.

    Stage protocol (the runner.stages module drives it):
        report.begin_stage("train")
        report.progress(done, total, "step", loss=0.12)   # any time; cheap; throttled
        report.fields(val_cos=0.95, best_val_cos=0.95)    # free per-stage fields
        report.metrics(step, {"loss": 0.12, "lr": 2e-4})  # one metrics.jsonl line
        if report.stop_requested(): ...save, then end the stage "stopped"
        report.end_stage("train", "done")                 # done|skipped|stopped|failed

    * progress(done, total, unit, **fields): sets the current stage's done/total/unit, its
      recent throughput `rate` and `eta_s` = remaining / rate, where rate is measured over
      the last minute widened to >= 3 units (None, shown "—", until measured). The wait
      between two advancing calls feeds `slowest_unit_s` (stall detection); the first call
      of a stage is the baseline (setup time is not a unit), so call it once right after
      setup, then after every unit or every few. Anything silent for over STALL_MIN_S
      (10 min; a teacher load, say) should report sub-progress or `fields(detail=...)`, or
      clients will show "stalled". The first and the last (done == total) calls of a stage
      are written at once, others at most twice a second.
    * fields(**kw): free fields on the current (or last) stage, e.g. detail="loading the
      teacher"; step/steps/val_cos/best_val_cos/mock are also copied to the top level (and
      before any stage only those are kept). Names that progress() owns (status, done,
      total, unit, rate, eta_s, ...) are refused.
    * end_stage(name, status, skipped=False, detail=None): status "done" with skipped=True
      means "already done, not rerun"; status "skipped" means "not needed this run".
    * metrics(step, row): appends {"step": step, "time": now, **row}, flushed per line.
    * truncate_metrics(after_step): on resume, drop rows with step > after_step (atomic
      rewrite), so no step appears twice in metrics.jsonl. Returns how many were dropped.
    * stop_requested(): True after SIGTERM/SIGINT or while `stop.request` exists. Check it
      at unit boundaries; finish the unit, save, end the stage "stopped", return "stopped".
    * log: a logger (lines go to pipeline.log); metrics are not log lines.
    Every call except stop_requested() counts as progress for the stall detector.
    """

    def __init__(self, writer: StateWriter, log_: logging.Logger | None = None,
                 on_change: Callable[[str, dict], None] | None = None):
        self.writer = writer
        self.paths = writer.paths
        self.log = log_ or logging.getLogger("gguf_trainer.pipeline")
        self._on_change = on_change
        self._stop_flag = threading.Event()
        self._clocks: dict[str, _StageClock] = {}
        self._metrics_file = None
        self._metrics_lock = threading.Lock()

    # ---- stages -------------------------------------------------------------------------
    def begin_stage(self, name: str) -> None:
        now = self.writer.clock()
        self._clocks[name] = _StageClock()

        def begin(st: dict) -> dict:
            stage = _pending_stage()
            stage.update(status="running", started=now)
            st["stages"][name] = stage
            st.update(stage=name, progress_time=now)
            return copy.deepcopy(stage)

        self._changed(name, self.writer.update(begin), force=True)
        self.log.info("stage %s: started", name)

    def end_stage(self, name: str, status: str = "done", skipped: bool = False,
                  detail: str | None = None) -> None:
        assert status in STAGE_STATUSES[2:], status
        now = self.writer.clock()

        def end(st: dict) -> dict:
            stage = st["stages"].setdefault(name, _pending_stage())
            stage.update(status=status, finished=now, skipped=bool(skipped), eta_s=None)
            if detail is not None:
                stage["detail"] = detail
            st["progress_time"] = now
            return copy.deepcopy(stage)

        self._changed(name, self.writer.update(end), force=True)
        how = "done earlier, not rerun" if skipped else status
        self.log.info("stage %s: %s%s", name, how, f" — {detail}" if detail else "")

    def progress(self, done: float, total: float | None = None, unit: str | None = None,
                 **fields: Any) -> None:
        self._check_fields(fields)
        now = self.writer.clock()
        name = self.writer.update(lambda st: st["stage"])
        assert name is not None, "progress() before begin_stage()"
        clock = self._clocks.setdefault(name, _StageClock())
        first = not clock.samples
        gap_s = clock.add(now, done)
        rate = clock.rate(total)

        def apply(st: dict) -> dict:
            stage = st["stages"][name]
            stage.update(done=done, total=total, unit=unit, rate=rate, **fields)
            if total is not None and done >= total:
                stage["eta_s"] = 0.0
            else:
                stage["eta_s"] = (total - done) / rate if rate and total is not None else None
            if gap_s is not None and gap_s > (st["slowest_unit_s"] or 0.0):
                st["slowest_unit_s"] = gap_s
            st["progress_time"] = now
            self._copy_top(st, fields)
            return copy.deepcopy(stage)

        last = total is not None and done >= total
        self._changed(name, self.writer.update(apply), force=first or last)

    def fields(self, **kw: Any) -> None:
        self._check_fields(kw)
        now = self.writer.clock()

        def apply(st: dict) -> tuple[str | None, dict | None]:
            name = st["stage"]
            stage = st["stages"].get(name) if name else None
            if stage is not None:  # the current (or last) stage
                stage.update(kw)
            self._copy_top(st, kw)  # before any stage only these top-level copies are kept
            st["progress_time"] = now
            return name, copy.deepcopy(stage) if stage is not None else None

        name, stage = self.writer.update(apply)
        self._changed(name, stage, force=False)

    # ---- metrics ------------------------------------------------------------------------
    def metrics(self, step: int, row: dict) -> None:
        line = json.dumps(jsonable({"step": int(step), "time": self.writer.clock(), **row}),
                          allow_nan=False)
        with self._metrics_lock:
            if self._metrics_file is None:
                self._metrics_file = _open_metrics_for_append(self.paths.metrics_jsonl)
            self._metrics_file.write(line + "\n")
            self._metrics_file.flush()
        self.writer.update(lambda st: st.update(progress_time=self.writer.clock()))

    def truncate_metrics(self, after_step: int) -> int:
        with self._metrics_lock:
            self.close_metrics()
            rows, _ = read_metrics(self.paths, 0)
            keep = [r for r in rows if isinstance(r.get("step"), (int, float))
                    and r["step"] <= after_step]
            if not self.paths.metrics_jsonl.exists():
                return 0
            text = "".join(json.dumps(r, allow_nan=False) + "\n" for r in keep)
            atomic.write_text(self.paths.metrics_jsonl, text)
        if len(keep) < len(rows):
            self.log.info("metrics: dropped %d rows after step %d (resume)",
                          len(rows) - len(keep), after_step)
        return len(rows) - len(keep)

    def close_metrics(self) -> None:
        if self._metrics_file is not None:
            self._metrics_file.close()
            self._metrics_file = None

    # ---- control ------------------------------------------------------------------------
    def stop_requested(self) -> bool:
        return self._stop_flag.is_set() or self.paths.stop_request.exists()

    def request_stop(self) -> None:
        """Called by the signal handlers (sets a flag, nothing else)."""
        self._stop_flag.set()

    def stop_signalled(self) -> bool:
        """True once a signal asked for the stop (the file alone does not count)."""
        return self._stop_flag.is_set()

    # ---- internals ----------------------------------------------------------------------
    @staticmethod
    def _check_fields(kw: dict) -> None:
        bad = [k for k in kw if k in _RESERVED]
        assert not bad, f"field names {bad} are reserved for progress()/end_stage()"

    @staticmethod
    def _copy_top(st: dict, kw: dict) -> None:
        for key in TOP_LEVEL_FIELDS:
            if key in kw:
                st[key] = bool(kw[key]) if key == "mock" else kw[key]

    def _changed(self, name: str | None, stage: dict | None, force: bool) -> None:
        if force or self.writer.write_due():
            self.writer.flush()
        else:
            self.writer.mark_dirty()
        if self._on_change is not None and name is not None and stage is not None:
            self._on_change(name, stage)


def _open_metrics_for_append(path: Path):
    """Append handle; a torn last line (power loss mid-write) is cut off first. A link in the
    file's place is refused before anything is cut or written (project_file.open_append)."""
    handle = io.TextIOWrapper(project_file.open_append(path.parent, path), encoding="utf-8")
    if path.stat().st_size:
        with open(path, "rb+") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)
    return handle


def read_metrics(paths: ProjectPaths, offset: int = 0) -> tuple[list[dict], int]:
    """Rows appended since byte `offset`, and the offset to pass next time.

    Only complete lines are returned (a line being written is left for the next call). If
    the file shrank or was rewritten (offset past the end, or not at a line boundary),
    reading restarts at 0: a client that gets a row whose step is <= one it already has
    should drop its rows from that step on (a resume truncated them).
    """
    try:
        # The charts show these rows: only the project's own file (a link out reads as none).
        with project_file.open_file(paths.root, paths.metrics_jsonl) as f:
            size = os.fstat(f.fileno()).st_size
            if offset > size or (offset > 0 and os.pread(f.fileno(), 1, offset - 1) != b"\n"):
                offset = 0
            f.seek(offset)
            data = f.read(size - offset)
    except (FileNotFoundError, NotADirectoryError, PermissionError,
            project_file.UnsafeProjectFile):
        return [], 0  # absent, a folder or a link out in its place, unreadable: no rows
    end = data.rfind(b"\n") + 1
    rows = []
    for line in data[:end].splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:  # a foreign or damaged line: skip it, keep following
            log.debug("metrics: skipping unreadable line %r", line[:80])
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows, offset + end
