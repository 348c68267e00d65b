"""The ranks of a launched run (accelerate's launcher): rank 0 leads, followers report.

Rank 0 is the pipeline as it runs alone: it holds the project lock and owns state.json, the
manifests, the metrics and the checkpoints. It tells the other ranks ("followers") which
stage to join through a broadcast on a gloo group (`lead` / `follow`); they report progress
in `ranks/rank-NNNNN.json` (RankReport), which rank 0's watch (RankWatch) gathers into
state.json (`ranks`). A rank that dies ends the run: rank 0 records a sentence naming it and
leaves without closing state.json, so status reads "interrupted".

Liveness across machines cannot use pids or flock (one host only): a follower on another host
proves it lives by the heartbeat in its rank file. The world and the collectives are
gguf_trainer.machine.distributed. Importing this module is torch-free (the supervisor's kill and the
status lines read the rank files).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from pathlib import Path

from gguf_trainer.base import atomic, locks, project_file
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import RANK_GLOB, RANKS_DIR, ProjectPaths
from gguf_trainer.machine.distributed import (
    broadcast_object,
    group,
    group_ctrl,
    init,
    on_failed_collective,
    stage_ranks,
    wants_cpu,
    world,
)
from gguf_trainer.store.project import load_project

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0  # how often a follower rewrites its rank file while it waits or works
RANK_STALE_S = 120.0  # a follower on another host with an older heartbeat is dead
STARTUP_GRACE_S = 300.0  # a follower may take this long to write its first rank file
WATCH_S = 0.5  # rank 0 looks at its followers this often


# ---------------------------------------------------------------- lead / follow

def lead(stage: str, fingerprint: str | None, distributed: bool) -> None:
    """Rank 0 tells the followers which stage runs now (every stage, in order); a
    `distributed` one (Stage.distributed) gets its groups."""
    if world().is_distributed:
        broadcast_object({"stage": stage, "fingerprint": fingerprint})
        if distributed:
            stage_groups(stage)


def lead_end(outcome: str) -> None:
    if world().is_distributed:
        broadcast_object({"end": outcome})


def stage_groups(stage: str) -> None:
    """Create the stage's groups on every rank at the same point (collective)."""
    n = stage_ranks(load_project(_project_root()), stage)
    group(n)
    group_ctrl(n)


_ROOT: list[Path] = []


def _project_root() -> Path:
    return _ROOT[0]


def hello(paths, run_id: str) -> str:
    """The first control message: rank 0's run id, which every rank file carries (a file
    from an earlier run is never taken for a live rank)."""
    _ROOT[:] = [paths.root]
    return broadcast_object(run_id) if world().is_distributed else run_id


# ---------------------------------------------------------------- rank files

def rank_dir(root: Path) -> Path:
    return ProjectPaths(root).ranks


def rank_file(root: Path, rank: int) -> Path:
    return ProjectPaths(root).rank_file(rank)


def read_rank_files(root: Path, run_id: str | None = None) -> list[dict]:
    out = []
    for path in sorted(rank_dir(root).glob(RANK_GLOB)):
        try:
            rec = atomic.read_json(path, None)
        except (ValueError, OSError, UserError):  # a torn or foreign file is no rank
            rec = None
        if isinstance(rec, dict) and (run_id is None or rec.get("run_id") == run_id):
            out.append(rec)
    return out


def local_rank_processes(root: Path) -> list[tuple[int, float]]:
    """(pid, start time) of the follower ranks of the current run on this host (kill)."""
    me = socket.gethostname()
    found = []
    for rec in read_rank_files(root):
        pid, start = rec.get("pid"), rec.get("pid_start_time")
        if rec.get("host") == me and isinstance(pid, int) and start is not None \
                and locks.process_start_time(pid) == start:
            found.append((pid, start))
    return found


class RankReport:
    """What a follower's stages get instead of runner.state.Report: progress goes to the
    rank file (throttled, plus a heartbeat thread); metrics and state.json are rank 0's."""

    def __init__(self, paths, run_id: str):
        self.paths, self.run_id, self.w = paths, run_id, world()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._last_write = 0.0
        self.rec = {"rank": self.w.rank, "world": self.w.size, "run_id": run_id,
                    "host": socket.gethostname(), "pid": os.getpid(),
                    "pid_start_time": locks.process_start_time(os.getpid()),
                    "status": "waiting", "stage": None, "done": None, "total": None,
                    "unit": None, "rate": None, "error": None, "heartbeat": time.time()}
        self._clock: list[tuple[float, float]] = []
        self._beat_stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="rank-heartbeat", daemon=True)
        self.write(force=True)
        self._thread.start()

    # --- the Report interface the stages use
    def begin_stage(self, name: str) -> None:
        self._set(force=True, stage=name, status="running", done=None, total=None, unit=None,
                  rate=None)
        self._clock = []

    def end_stage(self, name: str, status: str = "done", skipped: bool = False, **kw) -> None:
        self._set(force=True, status="waiting" if status == "done" else status)

    def progress(self, done, total=None, unit=None, **kw) -> None:
        now = time.monotonic()
        self._clock = (self._clock + [(now, float(done))])[-20:]
        (t0, d0), (t1, d1) = self._clock[0], self._clock[-1]
        rate = (d1 - d0) / (t1 - t0) if t1 > t0 else None
        self._set(done=done, total=total, unit=unit, rate=rate,
                  **{k: v for k, v in kw.items() if isinstance(v, (int, float, str))})

    def fields(self, **kw) -> None:
        self._set(**{k: v for k, v in kw.items() if isinstance(v, (int, float, str, type(None)))})

    def metrics(self, step, row) -> None:  # rank 0 writes metrics.jsonl
        pass

    def truncate_metrics(self, after_step: int) -> int:
        return 0

    def close_metrics(self) -> None:
        pass

    def stop_requested(self) -> bool:
        return self._stop.is_set() or self.paths.stop_request.exists()

    def request_stop(self) -> None:
        self._stop.set()

    def stop_signalled(self) -> bool:
        return self._stop.is_set()

    # --- the file
    def fail(self, sentence: str) -> None:
        self._set(force=True, status="failed", error=sentence)

    def close(self, status: str) -> None:
        self._beat_stop.set()
        self._set(force=True, status=status)

    def _set(self, force: bool = False, **kw) -> None:
        with self._lock:
            self.rec.update(kw)
        self.write(force)

    def write(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._last_write < 0.5:
            return
        with self._lock:
            self.rec["heartbeat"] = now
            rec = dict(self.rec)
            self._last_write = now
        with contextlib.suppress(OSError):  # a full disk must not kill the rank's work
            atomic.write_json(rank_file(self.paths.root, self.w.rank), rec)

    def _beat(self) -> None:
        while not self._beat_stop.wait(HEARTBEAT_S):
            self.write(force=True)


# ---------------------------------------------------------------- rank 0 watch

class RankWatch:
    """Rank 0's thread: copies the followers' progress into state.json (`ranks`) and ends
    the run as interrupted, with a sentence naming the rank, when one dies or fails."""

    def __init__(self, paths, writer, run_id: str):
        self.paths, self.writer, self.run_id, self.w = paths, writer, run_id, world()
        self.started = time.time()
        self._stop = threading.Event()
        self._failed = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name="rank-watch", daemon=True)

    def start(self) -> RankWatch:
        on_failed_collective(lambda: self.fail_if_peer_died(wait_s=5.0))
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(WATCH_S):
            try:
                self.fail_if_peer_died()
                self._publish()
            except Exception:  # the watch must never take the run down by itself
                log.debug("rank watch", exc_info=True)

    def _records(self) -> dict[int, dict]:
        return {r["rank"]: r for r in read_rank_files(self.paths.root, self.run_id)
                if isinstance(r.get("rank"), int)}

    def _publish(self) -> None:
        recs = self._records()
        now = time.time()
        ranks = [{k: rec.get(k) for k in ("rank", "host", "pid", "status", "stage", "done",
                                           "total", "unit", "rate", "error")}
                 | {"heartbeat_age_s": round(now - rec.get("heartbeat", now), 1)}
                 for _, rec in sorted(recs.items())]
        self.writer.update(lambda st: st.__setitem__("ranks", ranks))
        self.writer.mark_dirty()

    def dead_rank(self) -> str | None:
        """The sentence for the first follower that is gone or failed, else None."""
        recs, me, now = self._records(), socket.gethostname(), time.time()
        for r in range(1, self.w.size):
            rec = recs.get(r)
            if rec is None:
                if now - self.started > STARTUP_GRACE_S:
                    return f"rank {r} never reported (no {rank_file(self.paths.root, r).name})"
                continue
            where = f"rank {r} (pid {rec.get('pid')} on {rec.get('host')})"
            if rec.get("status") == "failed":
                return f"{where} failed: {rec.get('error')}"
            if rec.get("host") == me:
                if locks.process_start_time(rec.get("pid")) != rec.get("pid_start_time") and \
                        rec.get("status") not in ("done", "stopped"):
                    return f"{where} died"
            elif now - float(rec.get("heartbeat") or 0) > RANK_STALE_S:
                return f"{where} sent no heartbeat for {RANK_STALE_S:.0f} s"
        return None

    def fail_if_peer_died(self, wait_s: float = 0.0) -> None:
        deadline = time.monotonic() + wait_s
        while True:
            why = self.dead_rank()
            if why is not None:
                self._end(why)
            if time.monotonic() >= deadline:
                return
            time.sleep(0.2)

    def _end(self, why: str) -> None:
        """Record the sentence and leave now: the other ranks may sit in a collective that
        will never complete. state.json stays "running"; with the lock gone status derives
        "interrupted" and shows this sentence (rank_failure)."""
        if not self._failed.acquire(blocking=False):
            return
        sentence = (f"{why}; the run ended. Resume with the same command "
                    "(any number of processes); see pipeline.log and ranks/.")
        log.error("%s", sentence)
        self.writer.update(lambda st: st.update(rank_failure=sentence, error=sentence))
        with contextlib.suppress(Exception):
            self.writer.flush()
        for h in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                h.flush()
        os._exit(130)


def watch(paths, writer, run_id: str) -> RankWatch | None:
    if not world().is_distributed:
        return None
    return RankWatch(paths, writer, run_id).start()


def start_lead(paths, writer):
    """Rank 0 at the start of a launched run: join the group, greet the followers, watch
    them. None when the pipeline runs alone."""
    if not world().is_distributed:
        return None
    init(cpu=wants_cpu(load_project(paths.root)))
    run_id = f"{os.getpid()}-{locks.process_start_time(os.getpid())}"
    project_file.make_dir(paths.root, rank_dir(paths.root))
    hello(paths, run_id)
    log.info("launched run: rank 0 of %d (%d on this machine); followers report in %s/",
             world().size, world().local_size, RANKS_DIR)
    return watch(paths, writer, run_id)


def format_ranks(info: dict) -> list[str]:
    """One status line per follower rank of a launched run (rank 0 is the run itself)."""
    ranks = info.get("ranks") if info.get("status") in ("running", "stalled") else None
    lines = []
    for r in ranks or []:
        if not isinstance(r, dict):
            continue
        done, total = r.get("done"), r.get("total")
        counted = isinstance(done, (int, float)) and isinstance(total, (int, float))
        where = f"{done:g}/{total:g} {r.get('unit') or ''}".strip() if counted else ""
        rate = f", {r['rate']:.2f}/s" if isinstance(r.get("rate"), (int, float)) else ""
        lines.append(f"  rank {r.get('rank')} (pid {r.get('pid')} on {r.get('host')}): "
                     f"{r.get('status')} {r.get('stage') or ''} {where}{rate}".rstrip())
    return lines
