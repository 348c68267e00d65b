"""Scaling over GPUs (prepared for a lent multi-GPU machine; not run on the CPU-only one):
precompute samples/s and train steps/s at a fixed global batch with 1, 2, ... N processes,
one per card, on the tiny real T5 teacher of the PixArt demo, each ÷ the 1-GPU figure.

The same measurement as bench_scaling.py (times from state.json and metrics.jsonl, so start-up
is not counted), with the devices on cuda (each rank its own card) and a corpus large enough
to keep the cards busy. The tiny teacher measures the machinery (launch, shard split, gradient
sums), not a real teacher's throughput: for that, point --project at a real project.

    python benchmarks/bench_scaling_gpu.py [--max-gpus N] [--n-train 4096] [--project DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scaling import PRE, cli, precompute_rate, train_rate

from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.demo import prepare_demo
from gguf_trainer.store.project import update_settings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-gpus", type=int, default=torch.cuda.device_count())
    ap.add_argument("--n-train", type=int, default=4096)
    ap.add_argument("--project", help="a real project to measure instead of the tiny demo")
    args = ap.parse_args()
    if not torch.cuda.is_available() or args.max_gpus < 1:
        raise SystemExit("no CUDA device: this benchmark is for a multi-GPU machine")
    with tempfile.TemporaryDirectory(prefix="bench_scaling_gpu_") as tmp:
        os.environ.setdefault("GGUF_TRAINER_HOME", str(Path(tmp) / "home"))
        if args.project:
            root = Path(args.project)
        else:
            root = prepare_demo("t5xxl_pixart", dest=Path(tmp) / "proj", steps=200)
            update_settings(
                root,
                {
                    "corpus.n_train": args.n_train,
                    "precompute.shard_size": 128,
                    "precompute.device": "cuda",
                    "train.device": "cuda",
                    "train.batch_size": 64,
                    "train.steps": 200,
                    "train.log_every": 10,
                    "train.val_every": 100000,
                    "train.save_every": 100000,
                },
            )
        paths = ProjectPaths(root)
        cli("run", "--project", str(root), *PRE)  # corpus, val shards, a warm-up pass
        base_pre, base_tr = precompute_rate(paths, 1), train_rate(paths, 1)
        print(
            f"1 GPU: precompute {base_pre:.1f} samples/s, train {base_tr:.2f} steps/s", flush=True
        )
        n = 2
        while n <= args.max_gpus:
            pre, tr = precompute_rate(paths, n), train_rate(paths, n)
            print(
                f"{n} GPUs: precompute {pre:.1f} samples/s (x{pre / base_pre:.2f}), "
                f"train {tr:.2f} steps/s (x{tr / base_tr:.2f})",
                flush=True,
            )
            n *= 2


if __name__ == "__main__":
    main()
