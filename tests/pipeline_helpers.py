"""Build tiny projects and run the real pipeline in-process (tests only).

`run_pipeline` drives runner.stages with the real StateWriter/Report; hooks let a test
stop, crash or change settings at exact points to check resume and invalidation.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.model.adapter_file import read_adapter_arrays
from gguf_trainer.runner.stages import run_stages
from gguf_trainer.runner.state import Report, StateWriter
from gguf_trainer.store import project as project_mod

TINY = {
    "corpus.n_train": 40,
    "corpus.n_val": 12,
    "corpus.min_chars": 1,
    "corpus.empty_frac": 0.05,
    "precompute.shard_size": 16,
    "precompute.val_shard_size": 8,
    "precompute.mock_teacher": True,
    "precompute.device": "cpu",
    "precompute.teacher_batch": 6,
    "precompute.student_batch": 5,
    "train.device": "cpu",
    "train.width": 64,
    "train.depth": 1,
    "train.steps": 12,
    "train.batch_size": 4,
    "train.lr": 2e-3,
    "train.warmup": 2,
    "train.log_every": 2,
    "train.val_every": 6,
    "train.save_every": 3,
    "train.threads": 1,
}


def make_project(root: Path, pack_id: str, materials: dict, name: str | None = None, **overrides):
    settings = {
        **TINY,
        **overrides,
        "corpus.files": [str(materials["prompts"])],
        "materials": {
            "student": {"path": str(materials["student"])},
            "student_tokenizer": {"path": str(materials["tokenizer"])},
        },
    }
    settings.setdefault("export.output_dir", str(root.parent / "out"))
    return project_mod.create_project(root, pack_id, name=name, overrides=settings)


class HookedReport(Report):
    """A Report whose stop/metrics calls can trigger test actions."""

    def __init__(self, writer, on_metrics=None, stop_when=None):
        super().__init__(writer)
        self.on_metrics, self.stop_when = on_metrics, stop_when
        self.stop_checks = 0

    def stop_requested(self) -> bool:
        self.stop_checks += 1
        if self.stop_when is not None and self.stop_when(self):
            return True
        return super().stop_requested()

    def metrics(self, step, row):
        super().metrics(step, row)
        if self.on_metrics:
            self.on_metrics(step, row, self)


def run_pipeline(root: Path, only=None, force=False, on_metrics=None, stop_when=None) -> str:
    paths = ProjectPaths(root)
    writer = StateWriter(paths, ["test"])
    report = HookedReport(writer, on_metrics, stop_when)
    try:
        outcome = run_stages(paths, report, only=only, force=force)
        writer.close("done" if outcome == "done" else "stopped")
        return outcome
    except BaseException:
        writer.close("failed", error="test crash")
        raise
    finally:
        report.close_metrics()


def adapter_tensors(gguf: Path) -> dict:
    return read_adapter_arrays(gguf)


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k, value in a.items():
        assert (value == b[k]).all(), f"tensor {k} differs"


def cli_at_home(*args, home: Path, timeout=600) -> subprocess.CompletedProcess:
    """`python -m gguf_trainer.cli ARGS` with HOME and the tool's home in `home` (never the real
    ~)."""
    env = {**os.environ, "GGUF_TRAINER_HOME": str(home), "HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "gguf_trainer.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def run_demo(base: Path, pack_id: str, steps: int = 40, timeout=600) -> dict:
    """`gguf-trainer demo --pack PACK` in `base/demo`; what the demo tests read."""
    root, home = base / "demo", base / "home"
    out = cli_at_home(
        "demo", "--pack", pack_id, "--steps", steps, "--dir", root, home=home, timeout=timeout
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {
        "root": root,
        "stdout": out.stdout,
        "home": home,
        "project": project_mod.load_project(root),
    }
