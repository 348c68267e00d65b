"""benchmarks/bench_train_step.py keeps working (quick mode: tiny shapes, no timing asserts)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).parents[2] / "benchmarks" / "bench_train_step.py"


def test_quick_run_reports_a_ratio_per_shape(capsys):
    spec = importlib.util.spec_from_file_location("bench_train_step", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    results = bench.main(["--quick"])
    assert [r["shape"] for r in results] == ["tiny"]
    r = results[0]
    assert r["ratio"] > 0 and r["ratio_min"] <= r["ratio"] <= r["ratio_max"]
    assert r["step_s_project"] > 0 and r["step_s_plain"] > 0
    assert '"bench": "train_step"' in capsys.readouterr().out


def test_both_variants_train_the_same_model_the_same_way():
    """The comparison is fair: same start, same loss; after a step both moved alike."""
    import torch

    spec = importlib.util.spec_from_file_location("bench_train_step", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    g = bench.SHAPES["tiny"]
    batch = bench.make_batch(g, torch.device("cpu"))
    ours, plain = bench.build_variants(g, torch.device("cpu"))
    for a, b in zip(ours.model.parameters(), plain.model.parameters()):
        assert torch.equal(a, b)
    ours.step(batch)
    plain.step(batch)
    for a, b in zip(ours.model.parameters(), plain.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
