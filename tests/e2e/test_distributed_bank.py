"""The Qwen3.5 bridge's FLUX.3 bank head (train.bank_slots) trained by two processes (accelerate's
launcher, gloo on CPU) equals one process at the same global batch: machine/distributed
TrainRanks.share_loss weighs each rank's bank loss by its share of the global batch's bank row
weight (not its slot rows'), so both heads' gradients sum to the one-process step. Mock teacher,
one thread per rank."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from pipeline_helpers import make_project
from test_real_runs import cli, read_state

from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import control
from gguf_trainer.store import project as project_mod

pytestmark = pytest.mark.slow

# A global batch of 5 splits 2 + 3 over two ranks; the prompts' bank rows differ in count, so a
# rank's share of the bank's weight is not its share of the slot rows.
SETTINGS = {"train.bank_slots": 80, "train.seed_rank": 16, "train.steps": 12,
            "train.batch_size": 5, "train.val_every": 6, "train.save_every": 6}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _losses(paths: ProjectPaths) -> list[dict]:
    return [r for r in map(json.loads, paths.metrics_jsonl.read_text().splitlines())
            if "loss" in r]


def _model(paths: ProjectPaths) -> dict:
    return torch.load(paths.checkpoints / "last.pt", map_location="cpu", weights_only=True)["model"]


def test_two_processes_train_the_bank_as_one_does(tmp_path, tiny_materials, home):
    one = tmp_path / "one"
    make_project(one, "qwen35_bridge", tiny_materials, name="one", **SETTINGS)
    res = cli("run", "--project", one, timeout=900)
    assert res.returncode == 0, res.stderr + (one / "pipeline.log").read_text()[-3000:]
    two = tmp_path / "two"  # the same shards, trained again by two processes
    shutil.copytree(one, two)
    project_mod.update_settings(two, {"name": "pig_two",
                                      "export.output_dir": str(tmp_path / "out_two")})
    control.reset(two, "train")
    res = cli("run", "--project", two, "--processes", "2", timeout=900)
    assert res.returncode == 0, res.stderr + (two / "pipeline.log").read_text()[-3000:]
    assert read_state(two)["status"] == "done"
    a, b = _model(ProjectPaths(one)), _model(ProjectPaths(two))
    assert any(k.startswith("out_bank") for k in a)
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    bank_diff = max(float((a[k] - b[k]).abs().max()) for k in a if "bank" in k)
    rows = [_losses(ProjectPaths(p)) for p in (one, two)]
    first = rows[0][0], rows[1][0]
    print(f"bank, 2 processes vs 1 at global batch 5, 12 steps: max |weight difference| "
          f"{diff:.3g} (bank tensors {bank_diff:.3g}); step {first[0]['step']}: loss "
          f"{first[0]['loss']:.6f} vs {first[1]['loss']:.6f}, bank_cos {first[0]['bank_cos']:.6f} "
          f"vs {first[1]['bank_cos']:.6f}")
    # fp32 summation order only (as test_distributed's bar); a bank weighted by the slot rows'
    # share moves the first logged loss and bank_cos at once
    assert abs(first[0]["loss"] - first[1]["loss"]) < 1e-5
    assert abs(first[0]["bank_cos"] - first[1]["bank_cos"]) < 1e-5
    assert diff < 1e-3
    assert [r["step"] for r in rows[1]] == [r["step"] for r in rows[0]]
