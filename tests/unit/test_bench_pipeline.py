"""benchmarks/bench_pipeline.py keeps working: --quick in-process, then check its JSON line.
Also checks the bench's analytic FLOP count against torch's FLOP counter. Never asserts times."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from gguf_trainer.data.shards import Batch
from gguf_trainer.model.adapters import build_adapter
from gguf_trainer.packs import get_pack
from gguf_trainer.store.project_schema import TrainSettings

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_pipeline.py"
WIDTH, DEPTH, IN_DIM, B, L = 64, 2, 32, 3, 11
SEED = 0


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_pipeline", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def test_bench_pipeline_quick(bench, capsys):
    result = bench.main(["--quick"])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == result
    for side in ("teacher", "student", "naive_teacher"):
        for card in ("cpu", "small_card", "big_card"):
            value = result["padding"][f"{side}_{card}"]
            assert _positive(value) and value <= 1.0, (side, card)
    assert _positive(result["loading_ratio"]) and _positive(result["mfu"])
    assert set(result["shard_bytes"]) == {"llada_image", "t5xxl_pixart", "qwen3vl_mageflow"}
    for figures in result["shard_bytes"].values():
        # a file holds at least its rows
        assert _positive(figures["ratio"]) and figures["ratio"] >= 1.0
        assert _positive(figures["bytes_per_sample"])
    training = result["training"]
    assert _positive(training["train_gflop_per_s"]) and _positive(training["matmul_gflop_per_s"])


def test_padding_efficiency_definition(bench):
    """real ÷ processed: one batch [3, 5] costs 2 × 5; sorted budget batching beats naive."""
    assert bench.naive_efficiency([3, 5], 2) == pytest.approx(8 / 10)
    assert bench.naive_efficiency([3, 5, 4], 2) == pytest.approx(12 / (10 + 4))
    assert bench.budget_efficiency([5, 3, 5, 3], 4, 2, 100) == pytest.approx(1.0)  # [3,3] [5,5]
    lengths = bench.prompt_lengths(2048)
    assert min(lengths) >= bench.MIN_LEN and max(lengths) <= bench.MAX_LEN
    assert bench.budget_efficiency(lengths, 1024, 16, 4096) > bench.naive_efficiency(lengths, 16)


@pytest.mark.parametrize("pack_id", ["llada_image", "t5xxl_pixart", "qwen3vl_mageflow"])
def test_train_flops_matches_torch_flop_counter(bench, pack_id):
    """The Linears as torch counts them over forward + backward, plus the attention matmuls
    written out here (torch's counter does not see CPU SDPA): 2 matmuls of Lq·Lk·W each, ×3."""
    from torch.utils.flop_counter import FlopCounterMode

    pack = get_pack(pack_id)
    cfg = pack.adapter_config(TrainSettings(width=WIDTH, depth=DEPTH), IN_DIM)
    torch.manual_seed(SEED)
    model = build_adapter(cfg)
    hidden = torch.randn(B, L, IN_DIM)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[1, 6:] = False
    seed_ids = torch.randint(2, 100, (B, cfg.num_queries)) if pack.seed_vocab else None
    batch = Batch(hidden, mask, None, None, seed_ids, None, [])
    with FlopCounterMode(display=False) as counter:
        model(hidden, mask=mask, seed_ids=seed_ids).pow(2).mean().backward()
    linear = counter.get_total_flops()
    counts_sdpa = any("scaled_dot_product" in str(op) for op in counter.get_flop_counts()["Global"])
    if cfg.kind == "token_aligned_vision":
        pairs = [(L, L)] * DEPTH  # self-attention over the tokens
    else:
        pairs = [(cfg.num_queries, cfg.num_queries), (cfg.num_queries, L)] * DEPTH  # self, cross
    attention = 0 if counts_sdpa else sum(3 * 2 * 2 * B * lq * lk * WIDTH for lq, lk in pairs)
    assert bench.train_flops(cfg, batch) == pytest.approx(linear + attention, rel=1e-9)
