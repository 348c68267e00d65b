"""Test-only pipeline: the REAL shell (lock, state.json, signals, exit codes, logging)
around fake stages that sleep instead of training.

    python -m fake_pipeline --project DIR [--only ...] [--force]     (PYTHONPATH=tests/e2e)
    python fake_pipeline.py --foreground --project DIR               (like `gguf-trainer run`)

Environment knobs: FAKE_UNITS (units per stage, 20), FAKE_UNIT_S (seconds per unit, 0.05),
FAKE_FAIL ("user" -> UserError, "bug" -> RuntimeError in the train stage),
FAKE_CHILD=1 (spawn a `sleep` child first and write its pid to <project>/fake-child.pid).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from gguf_trainer.base import locks
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import pipeline
from gguf_trainer.runner.state import STAGES

CHILD_PID_FILE = "fake-child.pid"


def fake_run(paths, report, only, force):
    units = int(os.environ.get("FAKE_UNITS", "20"))
    unit_s = float(os.environ.get("FAKE_UNIT_S", "0.05"))
    report.fields(mock=True)
    if os.environ.get("FAKE_CHILD"):
        child = subprocess.Popen(["sleep", "60"])
        (paths.root / CHILD_PID_FILE).write_text(str(child.pid))
    for name in [s for s in STAGES if not only or s in only]:
        report.begin_stage(name)
        report.progress(0, units, "step")
        for i in range(units):
            if report.stop_requested():
                report.end_stage(name, "stopped")
                return "stopped"
            time.sleep(unit_s)
            if name == "train" and os.environ.get("FAKE_FAIL") == "user":
                raise UserError("train.steps must be positive; fix it with gguf-trainer set")
            if name == "train" and os.environ.get("FAKE_FAIL") == "bug":
                raise RuntimeError("fake bug")
            report.progress(i + 1, units, "step", loss=1.0 / (i + 1))
            if name == "train":
                report.fields(step=i + 1, steps=units)
                report.metrics(i + 1, {"loss": 1.0 / (i + 1)})
        report.end_stage(name, "done")
    return "done"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--foreground"]:
        args = pipeline.parse_args(argv[1:])
        try:
            return pipeline.run_foreground(ProjectPaths(args.project), args.only, args.force,
                                           run=fake_run)
        except locks.LockHeld as e:
            print(str(e), file=sys.stderr)
            return 1
    return pipeline.main(argv, run=fake_run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
