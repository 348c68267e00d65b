"""Several processes on one project (accelerate's launcher, torch.distributed): who is who,
whose shards are whose, the rank progress files, and the few collective calls stages make.

One launch = one run. Rank 0 is the pipeline as it runs alone: it holds the project lock and
owns state.json, the manifests, the metrics and the checkpoints. It tells the other ranks
("followers") which stage to join through a broadcast on a gloo group (`lead` / `follow`);
they do their part of precompute (shard k -> rank k mod N) and training (a disjoint slice of
every global batch, gradients summed), and report progress in `ranks/rank-NNNNN.json`, which
rank 0 gathers into state.json (`ranks`). A rank that dies ends the run: rank 0 records a
sentence naming it and leaves without closing state.json, so status reads "interrupted".

Liveness across machines cannot use pids or flock (one host only): a follower on another host
proves it lives by the heartbeat in its rank file. Without a launch (WORLD_SIZE unset or 1)
every function here is a no-op and nothing imports torch.distributed.

Importing this module is torch-free (the supervisor's kill reads the rank files).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import atomic, locks
from .errors import UserError
from .paths import RANK_GLOB, RANKS_DIR, ProjectPaths

log = logging.getLogger(__name__)

OVERRIDE_ENV = "GGUF_TRAINER_PROCESSES_ALL"  # set by the launcher: every stage uses every rank
HEARTBEAT_S = 2.0  # how often a follower rewrites its rank file while it waits or works
RANK_STALE_S = 120.0  # a follower on another host with an older heartbeat is dead
STARTUP_GRACE_S = 300.0  # a follower may take this long to write its first rank file
WATCH_S = 0.5  # rank 0 looks at its followers this often
PG_TIMEOUT_S = 7 * 24 * 3600  # collectives wait across rank 0's single-rank stages (corpus, eval)
DISTRIBUTED_STAGES = ("precompute_val", "precompute_train", "train")


@dataclass(frozen=True)
class World:
    """This process's place in the launch (torchrun's environment, which accelerate sets)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.size > 1


def world() -> World:
    env = os.environ
    try:
        size = int(env.get("WORLD_SIZE", "1"))
        return World(int(env.get("RANK", "0")), size, int(env.get("LOCAL_RANK", "0")),
                     int(env.get("LOCAL_WORLD_SIZE", str(size))))
    except ValueError:
        return World()


def active_ranks(setting: int, w: World | None = None) -> int:
    """How many ranks a stage uses: all of them when the launch said so (--processes, several
    machines), else its own setting (precompute.processes / train.processes), at most the
    launch's size."""
    w = w or world()
    if os.environ.get(OVERRIDE_ENV):
        return w.size
    return max(1, min(int(setting or 1), w.size))


def owns(k: int, n_active: int, w: World | None = None) -> bool:
    """Shard k is computed by rank k mod n_active: fixed by k alone, so any N writes the same
    files and a run stopped with one N continues with another."""
    w = w or world()
    return k % max(1, n_active) == w.rank


def rank_threads(threads: int, w: World | None = None) -> int:
    """The CPU threads of one rank: the project's count shared by the ranks of this machine."""
    w = w or world()
    return max(1, int(threads) // max(1, w.local_size))


def rank_device(device):
    """`cuda` without an index means this rank's own card (local rank), as accelerate places it."""
    import torch

    w = world()
    if w.is_distributed and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", w.local_rank % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    return device


# ---------------------------------------------------------------- process group

_groups: dict = {}


def init(cpu: bool) -> None:
    """Join the launch's process group (accelerate's PartialState: gloo on CPU, nccl on
    CUDA), plus one gloo group for control messages (a broadcast may wait for hours)."""
    import datetime

    import torch.distributed as dist
    from accelerate import PartialState

    if not world().is_distributed or "ctrl" in _groups:
        return
    PartialState(cpu=cpu, timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    _groups["ctrl"] = dist.new_group(backend="gloo",
                                     timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))


def group(n_active: int):
    """The process group of ranks 0..n_active-1 (the whole world when all take part). Every
    rank must call this, in the same order (torch's new_group is collective)."""
    import torch.distributed as dist

    if n_active >= world().size:
        return None  # the default group
    if n_active not in _groups:
        _groups[n_active] = dist.new_group(ranks=list(range(n_active)))
    return _groups[n_active]


def _ctrl():
    return _groups.get("ctrl")


def collective(fn, *args, **kw):
    """A collective call; when it fails because a peer died, rank 0 records which one and
    the run ends as interrupted (never as an internal error)."""
    try:
        return fn(*args, **kw)
    except Exception:
        if world().is_main and _WATCH is not None:
            _WATCH.fail_if_peer_died(wait_s=5.0)
        raise


def broadcast_object(obj, n_active: int | None = None):
    """Rank 0's `obj` on every rank (control group)."""
    import torch.distributed as dist

    box = [obj]
    grp = _ctrl() if n_active is None else group_ctrl(n_active)
    collective(dist.broadcast_object_list, box, src=0, group=grp)
    return box[0]


def group_ctrl(n_active: int):
    import torch.distributed as dist

    if n_active >= world().size:
        return _ctrl()
    key = ("ctrl", n_active)
    if key not in _groups:
        _groups[key] = dist.new_group(ranks=list(range(n_active)), backend="gloo")
    return _groups[key]


def any_true(flag: bool) -> bool:
    """True on every rank when any rank says True (e.g. "I was stopped")."""
    import torch
    import torch.distributed as dist

    if not world().is_distributed:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int64)
    collective(dist.all_reduce, t, op=dist.ReduceOp.MAX, group=_ctrl())
    return bool(t.item())


# ---------------------------------------------------------------- lead / follow

def lead(stage: str, fingerprint: str | None) -> None:
    """Rank 0 tells the followers which stage runs now (every stage, in order)."""
    if world().is_distributed:
        broadcast_object({"stage": stage, "fingerprint": fingerprint})
        if stage in DISTRIBUTED_STAGES:
            _stage_groups(stage)


def lead_end(outcome: str) -> None:
    if world().is_distributed:
        broadcast_object({"end": outcome})


def _stage_groups(stage: str) -> None:
    """Create the stage's groups on every rank at the same point (collective)."""
    from .project import load_project

    n = stage_ranks(load_project(_project_root()), stage)
    group(n)
    group_ctrl(n)


_ROOT: list[Path] = []


def _project_root() -> Path:
    return _ROOT[0]


def stage_ranks(project, stage: str) -> int:
    st = project.settings
    setting = st.train.processes if stage == "train" else st.precompute.processes
    return active_ranks(setting)


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

_WATCH: RankWatch | None = None


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
        global _WATCH
        _WATCH = self
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


# ---------------------------------------------------------------- training ranks

def train_ranks(project):
    """The TrainRanks of this rank for the train stage, or None when it trains alone."""
    if not world().is_distributed:
        return None
    n = stage_ranks(project, "train")
    return TrainRanks(n) if n > 1 else None


class TrainRanks:
    """Data-parallel training over ranks 0..n-1: every rank reads the same deterministic
    global batch order and keeps its own contiguous slice; each rank's loss is weighted by its
    share of the global batch's supervised rows and the gradients are summed, so a step is the
    step one process takes on the whole global batch (up to fp32 summation order). Gradients
    travel as one flat buffer (what DDP's buckets do) with a has-gradient flag per parameter,
    so a parameter no rank used stays untouched, as it does alone."""

    def __init__(self, n: int):
        self.n, self.rank = n, world().rank
        self.grp, self.ctrl = group(n), group_ctrl(n)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def stream(self, files, seed: int, batch_size: int, fixed_rows: int, pos):
        from .shards import ShardStream, collate

        n, rank = self.n, self.rank

        class RankStream(ShardStream):
            def _collate(self, shard, rows, f):
                mine = rows[len(rows) * rank // n: len(rows) * (rank + 1) // n]
                batch = collate(shard, mine or rows[:1], f, self.fixed_rows)
                if not mine:  # a short last batch: this rank's slice is empty (weight 0)
                    batch.row_mask.zero_()
                return batch

        return RankStream(files, seed, batch_size, fixed_rows, pos)

    def share_loss(self, loss, parts: dict, batch, cos_weight: float):
        """(this rank's weighted loss to backpropagate, the global parts, the global loss)."""
        import torch
        import torch.distributed as dist

        n_r = float(batch.row_mask.sum())
        t = torch.tensor([n_r, n_r * parts["mse"], n_r * parts["cos"]], dtype=torch.float64)
        collective(dist.all_reduce, t, group=self.ctrl)
        n = max(float(t[0]), 1.0)
        glob = {"mse": float(t[1]) / n, "cos": float(t[2]) / n}
        shown = torch.tensor(glob["mse"] + cos_weight * (1.0 - glob["cos"]))
        return loss * (n_r / n), glob, shown

    def sum_gradients(self, params: list) -> None:
        import torch
        import torch.distributed as dist

        flags = torch.tensor([0.0 if p.grad is None else 1.0 for p in params])
        flat = torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1).float()
                          for p in params] + [flags.to(params[0].device)])
        collective(dist.all_reduce, flat, group=self.grp)
        has = flat[-len(params):].tolist()
        off = 0
        for i, p in enumerate(params):
            k = p.numel()
            if has[i] > 0:
                p.grad = flat[off: off + k].view_as(p).to(p.dtype).clone()
            off += k

    def agree(self, stop: bool, snapshot: bool, steps: int) -> tuple[bool, bool, int]:
        """Rank 0's decisions for this step (stop, snapshot, planned steps) on every rank (one
        small tensor broadcast: this runs every step)."""
        import torch
        import torch.distributed as dist

        t = torch.tensor([int(stop), int(snapshot), int(steps)], dtype=torch.int64)
        collective(dist.broadcast, t, src=0, group=self.ctrl)
        return bool(t[0]), bool(t[1]), int(t[2])

    def rank_states(self, pos) -> dict:
        """Every rank's stream position and RNG states (CPU, CUDA), gathered for rank 0."""
        import torch
        import torch.distributed as dist

        mine = {"stream": pos.as_dict(), "rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}
        got = [None] * self.n
        collective(dist.all_gather_object, got, mine, group=self.ctrl)
        return {"ranks": {"world": self.n, "stream": [g["stream"] for g in got],
                          "rng": [g["rng"] for g in got],
                          "cuda_rng": [g["cuda_rng"] for g in got if g["cuda_rng"] is not None]}}


def resume_ranks(ck_path: Path, ranks: TrainRanks | None, step: int) -> None:
    """After last.pt was loaded: this rank's own RNG states when the checkpoint was saved by
    as many ranks, else say that the global batches are re-sliced across the new count."""
    import torch

    if not Path(ck_path).exists():
        return
    ck = torch.load(ck_path, map_location="cpu", weights_only=True)
    saved = ck.get("ranks") if isinstance(ck, dict) else None
    n_saved = saved.get("world", 1) if isinstance(saved, dict) else 1
    n_now = ranks.n if ranks is not None else 1
    if n_saved != n_now:
        log.warning("resume at step %d: last.pt was written by %d process(es), this run trains "
                    "with %d; the same global batches continue, re-sliced across %d", step,
                    n_saved, n_now, n_now)
        return
    if ranks is not None and isinstance(saved, dict):
        torch.set_rng_state(saved["rng"][ranks.rank])
        if torch.cuda.is_available() and len(saved.get("cuda_rng") or []) > ranks.rank:
            torch.cuda.set_rng_state(saved["cuda_rng"][ranks.rank])


def wants_cpu(project) -> bool:
    import torch

    st = project.settings
    return not torch.cuda.is_available() or (st.precompute.device == "cpu"
                                             and st.train.device == "cpu")


def start_lead(paths, writer):
    """Rank 0 at the start of a launched run: join the group, greet the followers, watch
    them. None when the pipeline runs alone."""
    if not world().is_distributed:
        return None
    from .project import load_project
    init(cpu=wants_cpu(load_project(paths.root)))
    run_id = f"{os.getpid()}-{locks.process_start_time(os.getpid())}"
    rank_dir(paths.root).mkdir(exist_ok=True)
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
        where = f"{done:g}/{total:g} {r.get('unit') or ''}".strip() if isinstance(done, (int, float)) \
            and isinstance(total, (int, float)) else ""
        rate = f", {r['rate']:.2f}/s" if isinstance(r.get("rate"), (int, float)) else ""
        lines.append(f"  rank {r.get('rank')} (pid {r.get('pid')} on {r.get('host')}): "
                     f"{r.get('status')} {r.get('stage') or ''} {where}{rate}".rstrip())
    return lines
