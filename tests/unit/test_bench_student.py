"""benchmarks/bench_student.py keeps working: --quick in-process, then check its JSON line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_student.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_student", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_student_quick(capsys):
    result = _load_bench().main(["--quick"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    printed = json.loads(last)
    assert printed == result
    assert printed["ratio"] > 0 and printed["student_tokens_per_s"] > 0  # never assert times
