"""Pipeline efficiency: four ratios, each measured side by side in one run.

1. padding      real ÷ processed tokens when precompute batches a heavy-tailed prompt-length
                distribution (lognormal, clipped to 5..512 tokens) the way it does: per shard,
                `budget_batches` sorted by length, with the auto budgets `choose_budgets` gives
                a CPU, a small (12 GB) and a big (80 GB) card; teacher and student. Target >= 0.9.
                For contrast, the naive figure: fixed-size batches in corpus order.
2. loading      train-step time with batches from `ShardStream` over real shard files
                (`write_shard`, laid out by `precompute_shard.build_shard` with the pack's mock
                teacher) ÷ the same steps with the same batches pre-collated in memory.
                Target <= 1.05. Files are in the page cache (a cold read adds file size ÷ disk
                bandwidth per shard); shards are small (few steps per shard load), so the load
                cost is over-weighted compared with precompute's 1024-sample shards.
3. mfu          achieved train FLOP/s ÷ this machine's matmul FLOP/s, both measured here
                (fp32 on CPU; on CUDA the bf16 that train.py autocasts to). Train FLOPs are
                counted analytically: 2·m·n·k for every Linear and both attention matmuls at
                the padded batch shapes, ×3 for forward + backward (backward = 2× forward),
                less the input-gradient of the Linears that read the student states (in_proj,
                skip), which have no gradient. LayerNorm, GELU, softmax, the loss and the
                optimizer are not counted (all O(elements), not O(elements × width)).
4. shard_bytes  shard file bytes ÷ bf16 bytes of the rows training needs (student rows +
                teacher rows), per pack at its real dims (in_dim 1024). Target <= 1.05.

Times are never asserted. Usage: python benchmarks/bench_pipeline.py [--quick] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import zlib
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import numpy as np
import torch

from gguf_trainer.data.samples import Sample
from gguf_trainer.data.scoring import forward
from gguf_trainer.data.shards import ShardStream, load_stats, shard_name, write_shard
from gguf_trainer.machine.hardware import Budgets, budget_batches, choose_budgets
from gguf_trainer.model.adapters import build_adapter, trainable_parameters
from gguf_trainer.packs import get_pack
from gguf_trainer.stages.precompute_shard import _Sample, build_shard
from gguf_trainer.stages.train import compute_loss
from gguf_trainer.store.project_schema import PrecomputeSettings, TrainSettings

# ---- settings
FULL = {
    "n_prompts": 8192, "shard_size": 1024,  # padding: precompute's default shard size
    "load_pack": "llada_image", "load_shards": 2, "load_shard_size": 64, "batch": 8,
    "width": 128, "depth": 2, "burn_in": 3, "rounds": 3,
    "matmul_n": 1024, "matmul_iters": 10,
    "bytes_samples": {"llada_image": 32, "t5xxl_pixart": 128, "qwen3vl_mageflow": 128},
}
QUICK = {
    "n_prompts": 1024, "shard_size": 512,
    "load_pack": "llada_image", "load_shards": 2, "load_shard_size": 8, "batch": 4,
    "width": 64, "depth": 1, "burn_in": 1, "rounds": 1,
    "matmul_n": 256, "matmul_iters": 3,
    "bytes_samples": {"llada_image": 2, "t5xxl_pixart": 8, "qwen3vl_mageflow": 8},
}
# On a GPU: the reference recipe's adapter and batch, and 8 steps per shard load.
CUDA_TRAINING = {"width": 1024, "depth": 6, "batch": 32, "load_shard_size": 256}
LENGTH_LOG_MEAN, LENGTH_LOG_SIGMA, MIN_LEN, MAX_LEN = 3.6, 0.9, 5, 512  # ~37 tokens median
STUDENT_TEMPLATE_TOKENS = 20  # LLaDA's template around the prompt (student side)
STUDENT_DIM = 1024  # pig_clip hidden size
SMALL_CARD_BYTES, BIG_CARD_BYTES = 12e9, 80e9  # either side of choose_budgets' 24 GB line
WORDS = ["red", "fox", "lake", "castle", "neon", "rain", "photo", "sketch", "cat", "moon", "old",
         "portrait", "golden", "hour", "studio", "lighting", "detailed", "river", "forest", "glass"]
SEED = 0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- 1. padding


def prompt_lengths(n: int, seed: int = SEED) -> list[int]:
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(LENGTH_LOG_MEAN, LENGTH_LOG_SIGMA, n)
    return np.clip(np.rint(raw), MIN_LEN, MAX_LEN).astype(int).tolist()


def budget_efficiency(
    lengths: list[int], shard_size: int, max_batch: int, max_tokens: int
) -> float:
    """real ÷ processed tokens of precompute's batching (per shard, count × longest)."""
    real = processed = 0
    for start in range(0, len(lengths), shard_size):
        part = lengths[start : start + shard_size]
        for batch in budget_batches(part, max_batch, max_tokens):
            real += sum(part[i] for i in batch)
            processed += len(batch) * max(part[i] for i in batch)
    return real / processed


def naive_efficiency(lengths: list[int], batch: int) -> float:
    real = processed = 0
    for start in range(0, len(lengths), batch):
        part = lengths[start : start + batch]
        real += sum(part)
        processed += len(part) * max(part)
    return real / processed


def card_budgets(total_memory: float) -> Budgets:
    """choose_budgets' own numbers for a CUDA card of this size, without needing one."""
    props = SimpleNamespace(total_memory=total_memory)
    with mock.patch("torch.cuda.get_device_properties", return_value=props):
        return choose_budgets(PrecomputeSettings(), torch.device("cuda"))


def bench_padding(s: dict) -> dict:
    teacher = prompt_lengths(s["n_prompts"])
    student = [n + STUDENT_TEMPLATE_TOKENS for n in teacher]
    out = {}
    for name, b in (
        ("cpu", choose_budgets(PrecomputeSettings(), torch.device("cpu"))),
        ("small_card", card_budgets(SMALL_CARD_BYTES)),
        ("big_card", card_budgets(BIG_CARD_BYTES)),
    ):
        out[f"teacher_{name}"] = budget_efficiency(
            teacher, s["shard_size"], b.teacher_batch, b.tok_budget
        )
        out[f"student_{name}"] = budget_efficiency(
            student, s["shard_size"], b.student_batch, b.student_tok_budget
        )
        out[f"naive_teacher_{name}"] = naive_efficiency(teacher, b.teacher_batch)
    return {k: round(v, 4) for k, v in out.items()}


# ---------------------------------------------------------------- shards like precompute writes
# them


class _FakeStudent:
    """Stands in for pig_clip: deterministic random final-norm states of the student's width."""

    def __init__(self, seed: int):
        self.gen = torch.Generator().manual_seed(seed)

    def hidden(
        self, ids: torch.Tensor, keep: torch.Tensor, splices=None, position_ids=None
    ) -> torch.Tensor:
        # text-only, unpadded: no splices, the default positions
        return torch.randn(*ids.shape, STUDENT_DIM, generator=self.gen)


def make_samples(pack, n: int, start: int, seed: int) -> list[_Sample]:
    """Prompts of heavy-tailed word counts; one id per word of the formatted prompt (a
    tokenizer-free stand-in, so the shard rows have realistic counts)."""
    rng = np.random.default_rng(seed)
    counts = np.clip(rng.lognormal(LENGTH_LOG_MEAN - 0.3, LENGTH_LOG_SIGMA, n), 1, 300).astype(int)
    out = []
    for k, c in enumerate(counts):
        text = " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), c))
        ids = [zlib.crc32(w.encode()) % 151000 for w in pack.format_prompt(text).split()]
        out.append(_Sample(start + k, Sample(text), ids))
    return out


def write_pack_shards(pack, folder: Path, n_shards: int, shard_size: int) -> tuple[list[Path], int]:
    """Shard files of `pack` via build_shard + write_shard; also the bf16 bytes of the rows."""
    ctx = SimpleNamespace(
        teacher=pack.build_mock_teacher(None),
        student=_FakeStudent(SEED),
        # text-only samples
        device=torch.device("cpu"),
        pack=pack,
        vision_proj=None,
        budgets=choose_budgets(PrecomputeSettings(), torch.device("cpu")),
    )
    report = SimpleNamespace(stop_requested=lambda: False)
    files, row_bytes = [], 0
    for k in range(n_shards):
        samples = make_samples(pack, shard_size, k * shard_size, SEED + k)
        tensors = build_shard(ctx, samples, report, lambda frac: None)
        row_bytes += (tensors["student_rows"].numel() + tensors["target_rows"].numel()) * 2
        path = folder / shard_name("train", k)
        write_shard(path, tensors, {"fingerprint": "bench", "pack": pack.id})
        files.append(path)
    return files, row_bytes


# ---------------------------------------------------------------- 4. shard bytes


def bench_shard_bytes(s: dict, tmp: Path) -> dict:
    out = {}
    for pack_id, n in s["bytes_samples"].items():
        folder = tmp / f"bytes_{pack_id}"
        files, row_bytes = write_pack_shards(get_pack(pack_id), folder, 1, n)
        size = files[0].stat().st_size
        out[pack_id] = {
            "ratio": round(size / row_bytes, 4),
            "bytes_per_sample": round(size / n),
            "pack_estimate": get_pack(pack_id).bytes_per_sample,
        }
    return out


# ---------------------------------------------------------------- 2 + 3. loading and MFU


def train_flops(cfg, batch) -> float:
    """Forward + backward FLOPs of one step at this batch's padded shapes (see the docstring)."""
    b, length = batch.hidden.shape[:2]
    w, h, i, o = cfg.width, cfg.hidden_dim, cfg.in_dim, cfg.out_dim
    reads = 2 * b * length * i * w  # in_proj: the Linears that read the student states
    if cfg.kind == "token_aligned_vision":
        rows = length
        per_block = (
            4 * 2 * b * rows * w * w + 2 * 2 * b * rows * rows * w + 2 * 2 * b * rows * w * h
        )
        reads += 2 * b * length * i * o  # skip
    else:
        q = cfg.num_queries
        self_attn = 4 * 2 * b * q * w * w + 2 * 2 * b * q * q * w
        cross = 2 * 2 * b * q * w * w + 2 * 2 * b * length * w * w + 2 * 2 * b * q * length * w
        per_block = self_attn + cross + 2 * 2 * b * q * w * h
        rows = q
    forward_flops = reads + cfg.depth * per_block + 2 * b * rows * w * o
    return 3.0 * forward_flops - reads  # the states need no gradient: no input-grad matmul there


def matmul_flops_per_s(n: int, iters: int, device: torch.device, dtype: torch.dtype) -> float:
    g = torch.Generator().manual_seed(SEED)
    a = torch.randn(n, n, generator=g).to(device, dtype)
    b = torch.randn(n, n, generator=g).to(device, dtype)
    for _ in range(2):
        a @ b
    spent = []
    for _ in range(iters):
        _sync(device)
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        spent.append(time.perf_counter() - t0)
    return 2.0 * n**3 / statistics.median(spent)


class _Trainer:
    """The body of train.py's loop (LR and logging aside): forward, loss, backward, clip, step."""

    def __init__(self, pack, cfg, stats, device):
        torch.manual_seed(SEED)
        self.model = build_adapter(cfg).to(device)
        self.opt = torch.optim.AdamW(
            trainable_parameters(self.model), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.01
        )
        self.pack, self.stats, self.device = pack, stats, device
        self.autocast = (
            torch.autocast("cuda", torch.bfloat16)
            if device.type == "cuda"
            else torch.autocast("cpu", enabled=False)
        )

    def step(self, batch) -> None:
        batch = batch.to(self.device)
        with self.autocast:
            pred = forward(self.model, batch)
        loss, _ = compute_loss(pred.float(), batch, self.stats, self.pack.standardized, 0.5)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable_parameters(self.model), 1.0)
        self.opt.step()


def time_rounds(
    trainer, files, in_memory, batch_size: int, fixed: int, rounds: int, device: torch.device
) -> tuple[list[float], list[float]]:
    """Seconds per round of len(in_memory) steps: from a fresh ShardStream (every shard loaded
    and every batch collated again) and from the in-memory batches. The order alternates per
    round so drift on a shared machine hits both."""

    def run(batches) -> float:
        _sync(device)
        t0 = time.perf_counter()
        for batch in batches:
            trainer.step(batch)
        _sync(device)
        return time.perf_counter() - t0

    def from_stream():
        stream = ShardStream(files, SEED, batch_size, fixed)
        return (stream.next_batch() for _ in range(len(in_memory)))

    stream_s, memory_s = [], []
    for r in range(rounds):
        if r % 2 == 0:
            stream_s.append(run(from_stream()))
            memory_s.append(run(in_memory))
        else:
            memory_s.append(run(in_memory))
            stream_s.append(run(from_stream()))
    return stream_s, memory_s


def bench_training(s: dict, tmp: Path, device: torch.device) -> dict:
    s = {**s, **CUDA_TRAINING} if device.type == "cuda" else s
    pack = get_pack(s["load_pack"])
    files, _ = write_pack_shards(pack, tmp / "load", s["load_shards"], s["load_shard_size"])
    fixed = pack.num_queries if pack.seed_vocab else 0
    stats = load_stats(files, 0.03)
    stats = type(stats)(
        stats.mu.to(device), stats.sigma.to(device), stats.sigma_f.to(device), stats.n
    )
    cfg = pack.adapter_config(TrainSettings(width=s["width"], depth=s["depth"]), STUDENT_DIM)
    trainer = _Trainer(pack, cfg, stats, device)
    # one epoch: every shard loaded once
    steps = -(-s["load_shard_size"] // s["batch"]) * len(files)
    pre = ShardStream(files, SEED, s["batch"], fixed)
    # the same batches, pre-collated and already on the device: the no-loading ideal
    in_memory = [pre.next_batch().to(device) for _ in range(steps)]
    for batch in in_memory[: s["burn_in"]]:
        trainer.step(batch)
    stream_s, memory_s = time_rounds(
        trainer, files, in_memory, s["batch"], fixed, s["rounds"], device
    )
    step_s = statistics.median(memory_s) / steps
    flops = sum(train_flops(cfg, batch) for batch in in_memory) / steps
    peak_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    peak = matmul_flops_per_s(s["matmul_n"], s["matmul_iters"], device, peak_dtype)
    return {
        "loading_ratio": round(statistics.median(a / b for a, b in zip(stream_s, memory_s)), 4),
        "mfu": round(flops / step_s / peak, 4),
        "pack": pack.id,
        "adapter": {"width": cfg.width, "depth": cfg.depth, "batch": s["batch"]},
        "steps_per_round": steps,
        "step_ms": round(1e3 * step_s, 2),
        "train_gflop_per_s": round(flops / step_s / 1e9, 2),
        "matmul_gflop_per_s": round(peak / 1e9, 2),
        "matmul_dtype": str(peak_dtype),
        "shard_mb": round(files[0].stat().st_size / 2**20, 1),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a few seconds")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    s = QUICK if args.quick else FULL
    device = torch.device(args.device)
    padding = bench_padding(s)
    with tempfile.TemporaryDirectory() as tmp:
        training = bench_training(s, Path(tmp), device)
        shard_bytes = bench_shard_bytes(s, Path(tmp))
    result = {
        "bench": "pipeline",
        "device": str(device),
        "quick": args.quick,
        "padding": padding,
        "loading_ratio": training.pop("loading_ratio"),
        "mfu": training.pop("mfu"),
        "training": training,
        "shard_bytes": shard_bytes,
    }
    p = padding
    print("padding (real/processed, target >= 0.9), cpu / small card / big card budgets:")
    for side in ("teacher", "student", "naive_teacher"):
        print(
            f"  {side:14s}"
            + " / ".join(f"{p[f'{side}_{c}']:.3f}" for c in ("cpu", "small_card", "big_card"))
        )
    print(
        f"loading (shards / in-memory step time, target <= 1.05): {result['loading_ratio']:.3f} "
        f"({training['pack']}, {training['step_ms']} ms/step, {training['shard_mb']} MB shards)"
    )
    print(
        f"mfu (train FLOP/s / matmul FLOP/s): {result['mfu']:.3f} ({training['train_gflop_per_s']} "
        "/ "
        f"{training['matmul_gflop_per_s']} GFLOP/s)"
    )
    print(
        "shard bytes / bf16 row bytes (target <= 1.05): "
        + ", ".join(f"{k} {v['ratio']:.4f}" for k, v in shard_bytes.items())
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
