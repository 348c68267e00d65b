"""Several processes on one project (accelerate's launcher, torch.distributed): who is who,
whose shards are whose, and the few collective calls stages make.

One launch = one run. Rank 0 is the pipeline as it runs alone; the other ranks
("followers") do their part of precompute (shard k -> rank k mod N) and training (a disjoint
slice of every global batch, gradients summed: TrainRanks). How rank 0 tells them which
stage runs and how they report back (rank files, heartbeats, the watch) is the runner's:
runner/ranks.py. Without a launch (WORLD_SIZE unset or 1) every function here is a no-op
and nothing imports torch.distributed.

Importing this module is torch-free.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

OVERRIDE_ENV = "GGUF_TRAINER_PROCESSES_ALL"  # set by the launcher: every stage uses every rank
PG_TIMEOUT_S = 7 * 24 * 3600  # collectives wait across rank 0's single-rank stages (corpus, eval)


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
_ON_FAILED_COLLECTIVE: list = []  # at most one: rank 0's RankWatch check


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
        if world().is_main and _ON_FAILED_COLLECTIVE:
            _ON_FAILED_COLLECTIVE[0]()  # rank 0's watch (runner/ranks.py) names the dead peer
        raise


def on_failed_collective(check) -> None:
    """Rank 0's watch registers `check` (it records a dead peer and ends the run); a failed
    collective calls it before raising, so the run ends naming the rank, not as a crash."""
    _ON_FAILED_COLLECTIVE[:] = [check]


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


def stage_ranks(project, stage: str) -> int:
    st = project.settings
    setting = st.train.processes if stage == "train" else st.precompute.processes
    return active_ranks(setting)


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
        from gguf_trainer.data.shards import ShardStream, collate

        n, rank = self.n, self.rank

        class RankStream(ShardStream):
            def _collate(self, shard, rows, f):
                mine = rows[len(rows) * rank // n: len(rows) * (rank + 1) // n]
                batch = collate(shard, mine or rows[:1], f, self.fixed_rows)
                if not mine:  # a short last batch: this rank's slice is empty (weight 0)
                    batch.row_mask.zero_()
                    if batch.bank is not None:  # the FLUX.3 bank's rows too
                        batch.bank.weight.zero_()
                return batch

        return RankStream(files, seed, batch_size, fixed_rows, pos)

    def share_loss(self, loss, parts: dict, batch, cos_weight: float, n_rows=None, bank=None):
        """(this rank's weighted loss to backpropagate, the global parts, the global loss).
        `n_rows`: this rank's loss weight (the recipe's row weights' sum; else its rows).
        `bank`: the Qwen3.5 bridge's FLUX.3 bank loss already inside `loss` (data/bank_rows
        bank_loss, its figures in `parts`): it is a mean over the bank's own row weights, so
        it is weighted by this rank's share of the global batch's bank weight instead, and
        the sum over ranks is the one-process loss of the global batch for both heads."""
        import torch
        import torch.distributed as dist

        n_r = float(batch.row_mask.sum()) if n_rows is None else float(n_rows)
        w_r = float(batch.bank.weight.sum()) if bank is not None else 0.0
        sums = [n_r, n_r * parts["mse"], n_r * parts["cos"]]
        if bank is not None:
            sums += [w_r, w_r * parts["bank_mse"], w_r * parts["bank_cos"]]
        t = torch.tensor(sums, dtype=torch.float64)
        collective(dist.all_reduce, t, group=self.ctrl)
        n = max(float(t[0]), 1.0)
        glob = {"mse": float(t[1]) / n, "cos": float(t[2]) / n}
        shown = glob["mse"] + cos_weight * (1.0 - glob["cos"])
        if bank is None:
            return loss * (n_r / n), glob, torch.tensor(shown)
        w = max(float(t[3]), 1e-12)  # bank_loss's own floor on a batch's total weight
        glob.update(bank_mse=float(t[4]) / w, bank_cos=float(t[5]) / w)
        shown += glob["bank_mse"] + cos_weight * (1.0 - glob["bank_cos"])
        return (loss - bank) * (n_r / n) + bank * (w_r / w), glob, torch.tensor(shown)

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


