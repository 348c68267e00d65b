"""The project's training step (train.train_step: fused AdamW, foreach clipping, per-device
choices from hardware.py) ÷ a plain PyTorch step (default AdamW, default clipping) at the
same shapes, same model, same loss, same batch. Target: ≤ 0.9 at the recipe shape. The
project's step runs the adapter on the supervised rows only (scoring.forward_rows); the plain
step runs the full forward and the padded loss, as a plain loop would.

Two shapes: "small" (the demo's adapter) and "recipe" (the PixArt/T5 recipe: width 1024,
depth 6, batch 32, 120 seeded queries over 32128 T5 ids, 4096-wide targets). Each round
times `steps` pairs of steps, one of each variant back to back with the order alternating
pair by pair (so load from other processes and cache warmth fall on both alike). A round's
time of a variant is its fastest step (load from other processes only ever adds time; on a
shared CPU the mean measures the neighbours), its ratio project ÷ plain; the figure is the
median of the per-round ratios, and the spread (min..max) is printed so a reader can see it
is stable.

    python benchmarks/bench_train_step.py [--quick] [--device cpu|cuda] [--shapes small recipe]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gguf_trainer.data.scoring import forward
from gguf_trainer.data.shards import Batch, Stats
from gguf_trainer.machine import hardware
from gguf_trainer.model.adapters import AdapterConfig, build_adapter, trainable_parameters
from gguf_trainer.stages.train import compute_loss, make_optimizer, train_step

# ---- settings
SHAPES = {  # adapter config + batch geometry (student tokens L, supervised rows R)
    "small": {
        "width": 128,
        "depth": 2,
        "batch": 8,
        "in_dim": 1024,
        "out_dim": 4096,
        "queries": 120,
        "seed_vocab": 32128,
        "L": 40,
        "R": 30,
    },
    "recipe": {
        "width": 1024,
        "depth": 6,
        "batch": 32,
        "in_dim": 1024,
        "out_dim": 4096,
        "queries": 120,
        "seed_vocab": 32128,
        "L": 40,
        "R": 30,
    },
    "tiny": {
        "width": 64,
        "depth": 1,
        "batch": 4,
        "in_dim": 64,
        "out_dim": 48,
        "queries": 8,
        "seed_vocab": 100,
        "L": 12,
        "R": 8,
    },
}
FULL = {
    "shapes": ["small", "recipe"],
    "burn_in": 3,
    "rounds": 7,
    "steps": {"small": 10, "recipe": 4, "tiny": 20},
}
QUICK = {
    "shapes": ["tiny"],
    "burn_in": 1,
    "rounds": 2,
    "steps": {"tiny": 2, "small": 2, "recipe": 1},
}
LR, WEIGHT_DECAY, GRAD_CLIP, COS_WEIGHT = 2e-4, 0.01, 1.0, 0.5
SEED = 0


def make_batch(g: dict, device: torch.device) -> Batch:
    gen = torch.Generator().manual_seed(SEED)
    b, L, R, q = g["batch"], g["L"], g["R"], g["queries"]
    lengths = torch.randint(L // 3, L + 1, (b,), generator=gen)
    mask = torch.arange(L)[None, :] < lengths[:, None]
    rows = torch.randint(R // 3, R + 1, (b,), generator=gen)
    row_mask = torch.arange(q)[None, :] < rows[:, None]
    seed_ids = torch.randint(2, g["seed_vocab"], (b, q), generator=gen) * row_mask
    batch = Batch(
        hidden=torch.randn(b, L, g["in_dim"], generator=gen) * mask[..., None],
        mask=mask,
        target=torch.randn(b, q, g["out_dim"], generator=gen) * row_mask[..., None],
        row_mask=row_mask,
        seed_ids=seed_ids,
        sup_start=None,
        samples=[(0, i) for i in range(b)],
    )
    return batch.to(device)


class Variant:
    """One model + optimizer + step function; both variants start from the same weights."""

    def __init__(self, name: str, model, opt, step):
        self.name, self.model, self.opt, self.step = name, model, opt, step


def build_variants(g: dict, device: torch.device) -> tuple[Variant, Variant]:
    cfg = AdapterConfig(
        kind="seeded_resampler",
        in_dim=g["in_dim"],
        out_dim=g["out_dim"],
        width=g["width"],
        depth=g["depth"],
        num_queries=g["queries"],
        seed_vocab=g["seed_vocab"],
    )
    torch.manual_seed(SEED)
    base = build_adapter(cfg).to(device)
    stats = Stats(
        torch.zeros(g["out_dim"], device=device),
        torch.ones(g["out_dim"], device=device),
        torch.ones(g["out_dim"], device=device),
        1,
    )
    autocast = hardware.autocast(device)

    ours = copy.deepcopy(base)
    ours_params = list(trainable_parameters(ours))
    ours_opt = make_optimizer(ours_params, LR, WEIGHT_DECAY, device)

    def ours_step(batch):
        train_step(ours, ours_opt, ours_params, batch, stats, True, COS_WEIGHT, GRAD_CLIP, autocast)

    plain = copy.deepcopy(base)
    plain_params = list(trainable_parameters(plain))
    plain_opt = torch.optim.AdamW(plain_params, lr=LR, betas=(0.9, 0.95), weight_decay=WEIGHT_DECAY)

    def plain_step(batch):  # what a plain PyTorch loop writes
        with autocast:
            pred = forward(plain, batch)
        loss, _ = compute_loss(pred.float(), batch, stats, True, COS_WEIGHT)
        plain_opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plain_params, GRAD_CLIP)
        plain_opt.step()

    return Variant("project", ours, ours_opt, ours_step), Variant(
        "plain", plain, plain_opt, plain_step
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_pair(
    first: Variant, second: Variant, batch: Batch, device: torch.device
) -> dict[str, float]:
    """One step of each, back to back: load from other processes falls on both alike."""
    out = {}
    for v in (first, second):
        _sync(device)
        t0 = time.perf_counter()
        v.step(batch)
        _sync(device)
        out[v.name] = time.perf_counter() - t0
    return out


def measure(shape: str, cfg: dict, device: torch.device) -> dict:
    g = SHAPES[shape]
    batch = make_batch(g, device)
    ours, plain = build_variants(g, device)
    for v in (ours, plain):
        for _ in range(cfg["burn_in"]):
            v.step(batch)
    ratios, t_ours, t_plain = [], [], []
    steps = cfg["steps"][shape]
    for _ in range(cfg["rounds"]):
        spent: dict[str, list[float]] = {"project": [], "plain": []}
        for k in range(steps):  # the order alternates step by step
            for name, t in time_pair(
                *((ours, plain) if k % 2 == 0 else (plain, ours)), batch, device
            ).items():
                spent[name].append(t)
        # The fastest step of a round: other processes on a shared machine only ever add time.
        t_ours.append(min(spent["project"]))
        t_plain.append(min(spent["plain"]))
        ratios.append(t_ours[-1] / t_plain[-1])
    n_params = sum(p.numel() for p in trainable_parameters(ours.model))
    return {
        "shape": shape,
        "params_m": round(n_params / 1e6, 2),
        "step_s_project": statistics.median(t_ours),
        "step_s_plain": statistics.median(t_plain),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "rounds": cfg["rounds"],
        "steps_per_round": steps,
    }


def _load() -> str:
    """The 1/5/15-minute load averages (a busy machine widens the spread)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny shapes, one short round (the unit test)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--rounds", type=int, help="rounds per shape (default: 7, quick 2)")
    parser.add_argument("--steps", type=int, help="step pairs per round (default: per shape)")
    args = parser.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    if args.shapes:
        cfg["shapes"] = args.shapes
    if args.rounds:
        cfg["rounds"] = args.rounds
    if args.steps:
        cfg["steps"] = dict.fromkeys(SHAPES, args.steps)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(
        f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"AdamW options {hardware.adamw_options(device)}, load {_load()}"
    )
    results = []
    for shape in cfg["shapes"]:
        res = measure(shape, cfg, device)
        results.append(res)
        print(
            f"{shape:>7}: {res['params_m']:7.2f}M params  project "
            f"{res['step_s_project'] * 1e3:8.1f} ms  "
            f"plain {res['step_s_plain'] * 1e3:8.1f} ms  ratio {res['ratio']:.3f} "
            f"(rounds {res['ratio_min']:.3f}..{res['ratio_max']:.3f})"
        )
    print(f"load after: {_load()} (other processes on the machine: the figures assume it is low)")
    print(json.dumps({"bench": "train_step", "device": str(device), "results": results}))
    return results


if __name__ == "__main__":
    main()
