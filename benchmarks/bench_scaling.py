"""Scaling over processes on this machine (accelerate's launcher, gloo on CPU) with the tiny
real T5 teacher of the PixArt demo (gguf_trainer/packs/demo_materials/t5xxl_pixart).

    precompute: train-split samples/s, N processes x 1 thread ÷ 1 process x 1 thread
                (target >= 1.7 for N = 2)
    train:      steps/s at a fixed global batch, N processes x 1 thread ÷ 1 x 1

Times come from the run itself (precompute: each rank's shard log lines, its prompts over the
span of its shards, summed over the ranks; training: the median steps_per_s of metrics.jsonl),
so process start-up, the launcher and loading the teacher are not counted. Rounds alternate 1 and N
processes (load from other processes falls on both);
the figure is the median ratio over rounds, with the spread printed.

    python benchmarks/bench_scaling.py [--processes 2] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.demo import prepare_demo
from gguf_trainer.store.project import update_settings
from gguf_trainer.tiny.prompts import demo_prompts

PRE = ["--only", "corpus", "precompute_val", "precompute_train"]
SHARD_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*precompute\[train\] shard "
                        r"\d+: (\d+) prompts in [\d.]+s \(([\d.]+) p/s\)")


def cli(*args: str) -> None:
    res = subprocess.run([sys.executable, "-m", "gguf_trainer.cli", *args], capture_output=True,
                         text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"gguf-trainer {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}")


def stage_seconds(paths: ProjectPaths, stage: str) -> float:
    st = json.loads(paths.state_json.read_text())["stages"][stage]
    return st["finished"] - st["started"]


def _rank_rates(paths: ProjectPaths) -> list[float]:
    """Each rank's train-split prompts/s over its own shards: prompts ÷ (last shard written -
    first shard begun), from pipeline.log (rank 0) and ranks/*.log (emptied before the run).
    A shard line has its end time, prompts and prompts/s, so its start is end - prompts/rate.
    The ranks work side by side, so the run's throughput is the sum; loading the teacher (a
    constant per run, hours apart from the work on a real corpus) and the ranks' different
    start-up times are left out."""
    rates = []
    for log in [paths.pipeline_log, *sorted((paths.root / "ranks").glob("rank-*.log"))]:
        starts, ends, prompts = [], [], 0
        for line in log.read_text(encoding="utf-8").splitlines():
            m = SHARD_LINE.match(line)
            if m:
                end = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                ends.append(end)
                starts.append(end - int(m.group(2)) / float(m.group(3)))
                prompts += int(m.group(2))
        if ends:
            rates.append(prompts / (max(ends) - min(starts)))
    return rates


def precompute_rate(paths: ProjectPaths, processes: int) -> float:
    """Train-split samples per second of one precompute_train stage (shards dropped first)."""
    for p in paths.shard_dir("train").glob("*.safetensors"):
        p.unlink()
    for log in [paths.pipeline_log, *(paths.root / "ranks").glob("rank-*.log")]:
        log.unlink(missing_ok=True)
    cli(
        "run",
        "--project",
        str(paths.root),
        "--processes",
        str(processes),
        "--only",
        "precompute_train",
    )
    return sum(_rank_rates(paths))


def train_rate(paths: ProjectPaths, processes: int) -> float:
    """Median steps/s of a fresh training run (checkpoints and metrics dropped first)."""
    shutil.rmtree(paths.checkpoints, ignore_errors=True)
    paths.metrics_jsonl.unlink(missing_ok=True)
    cli("run", "--project", str(paths.root), "--processes", str(processes), "--only", "train")
    rows = [json.loads(line) for line in paths.metrics_jsonl.read_text().splitlines()]
    rates = [r["steps_per_s"] for r in rows if "steps_per_s" in r][1:]  # the first has the start
    return statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one round, a small corpus (the test)")
    args = ap.parse_args()
    rounds = 1 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(prefix="bench_scaling_") as tmp:
        os.environ.setdefault("GGUF_TRAINER_HOME", str(Path(tmp) / "home"))
        root = prepare_demo("t5xxl_pixart", dest=Path(tmp) / "proj", steps=60)
        # The tiny T5 computes ~1700 prompts/s in batches: one prompt per teacher call and the
        # demo's whole prompt pool keep each rank busy for seconds. The adapter is a mid-size
        # one (width 384, depth 3, batch 32), so a step is compute, not the gradient sum.
        prompts = Path(tmp) / "prompts.txt"
        prompts.write_text("\n".join(demo_prompts(1280)) + "\n", encoding="utf-8")
        update_settings(
            root,
            {
                "corpus.files": [str(prompts)],
                "corpus.n_train": 96 if args.quick else 1100,
                "corpus.n_val": 32,
                "precompute.shard_size": 16 if args.quick else 32,
                "precompute.teacher_batch": 1,
                "precompute.student_batch": 1,
                "train.threads": 1,
                "train.width": 256 if args.quick else 384,
                "train.depth": 2 if args.quick else 3,
                "train.batch_size": 32,
                "train.steps": 20 if args.quick else 30,
                "train.log_every": 5,
                "train.val_every": 1000,
                "train.save_every": 1000,
            },
        )
        paths = ProjectPaths(root)
        cli("run", "--project", str(root), *PRE)  # corpus, val shards, a first (warm-up) pass
        pre, tr = [], []
        for _ in range(rounds):
            one, many = precompute_rate(paths, 1), precompute_rate(paths, args.processes)
            pre.append((one, many))
            t_one, t_many = train_rate(paths, 1), train_rate(paths, args.processes)
            tr.append((t_one, t_many))
        for name, pairs, unit, target in (
            ("precompute", pre, "samples/s", 1.7),
            ("train", tr, "steps/s", None),
        ):
            ratios = [m / o for o, m in pairs]
            line = (
                f"{name}: {args.processes} processes x 1 thread ÷ 1 x 1 = "
                f"{statistics.median(ratios):.2f} "
                f"(spread {min(ratios):.2f}..{max(ratios):.2f}; "
                + ", ".join(f"{o:.1f} -> {m:.1f} {unit}" for o, m in pairs)
                + ")"
            )
            if target:
                line += f"  target >= {target}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
