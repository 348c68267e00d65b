"""Kept steps (data/kept_steps.py) through the real pipeline, in-process: the schedule, the
export from a kept step against a snapshot from last.pt at that step in every export.dtype,
`snapshot --step` refusals, deletion, pruning, reset, and a full disk while one is written."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
from hostile_fs import full_disk
from pipeline_helpers import make_project, run_pipeline

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.data import kept_steps
from gguf_trainer.data.kept_steps import KeptSteps, Schedule
from gguf_trainer.model.adapter_file import read_adapter
from gguf_trainer.runner import control
from gguf_trainer.runner.snapshot import run_snapshot
from gguf_trainer.store.project import update_settings

PACK = "t5xxl_pixart"  # a seeded resampler: the full seed table must stay exact too
STOP_AT = 6
HISTORY = {"train.history": True, "train.history_every": 3, "train.history_from": 3,
           "export.output_dir": ""}


def tensor_bytes(path) -> dict[str, tuple[str, bytes]]:
    """Every tensor's type and raw bytes, as the engine reads them off the file."""
    import gguf

    r = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type.name, np.asarray(t.data).tobytes()) for t in r.tensors}


def metadata(path) -> dict:
    return dict(read_adapter(path).metadata)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, tiny_materials):
    """disk/proj stopped at step 6 (last.pt at 6) with the schedule every 3 from step 3."""
    disk = tmp_path_factory.mktemp("kept") / "disk"
    root = disk / "proj"
    make_project(root, PACK, tiny_materials, **HISTORY)
    stop = lambda rep: rep.writer.snapshot().get("step") == STOP_AT
    assert run_pipeline(root, stop_when=stop) == "stopped"
    return disk


@pytest.fixture
def disk(stopped, tmp_path):
    copy = tmp_path / "disk"
    shutil.copytree(stopped, copy, symlinks=True)
    return copy


def test_a_kept_step_exports_what_a_snapshot_from_last_pt_at_that_step_exports(disk):
    root = disk / "proj"
    paths = ProjectPaths(root)
    assert kept_steps.kept_steps_on_disk(paths) == [3, STOP_AT]
    side = control.list_kept_steps(root)["items"][-1]
    assert side["reason"] == "stop" and isinstance(side["val_cos"], float)
    assert side["size"] < 0.6 * paths.checkpoint("last").stat().st_size
    for dtype in ("f16", "q8_0", "bf16"):
        update_settings(root, {"export.dtype": dtype})
        from_last = run_snapshot(root, "last", fresh=False)["path"]
        a = tensor_bytes(root.parent / from_last)
        meta_last = metadata(root.parent / from_last)
        from_kept = run_snapshot(root, f"step{STOP_AT}")["path"]
        assert from_kept == from_last and from_kept.endswith(f"-step{STOP_AT}-{dtype}.gguf")
        b = tensor_bytes(root.parent / from_kept)
        assert a == b, dtype  # tensor for tensor, byte for byte
        assert {v[0] for v in b.values()} >= ({"Q8_0"} if dtype == "q8_0" else set())
        meta_kept = metadata(root.parent / from_kept)
        assert meta_kept.pop("adapter.checkpoint") == f"step{STOP_AT}"
        assert meta_last.pop("adapter.checkpoint") == "last"
        assert meta_kept == meta_last
        assert meta_kept["adapter.dtype"] == dtype


def test_snapshot_step_refuses_a_step_not_kept_naming_the_kept_ones(disk):
    root = disk / "proj"
    with pytest.raises(UserError, match=r"step 5 is not kept; the kept steps are 3, 6\."):
        control.request_snapshot(root, "step5")
    with pytest.raises(UserError, match="last, best or a kept step"):
        control.request_snapshot(root, "stepfive")


def test_the_run_keeps_the_final_step_and_prunes_to_history_keep(disk):
    root = disk / "proj"
    update_settings(root, {"train.history_keep": 2})
    assert run_pipeline(root, only=["train"]) == "done"
    steps = kept_steps.kept_steps_on_disk(ProjectPaths(root))
    assert steps == [9, 12]  # 12 is the final step (also on the grid); 3 and 6 were pruned
    assert control.list_kept_steps(root)["items"][-1]["reason"] == "final"


def test_delete_and_reset_remove_kept_steps(disk):
    root = disk / "proj"
    paths = ProjectPaths(root)
    control.delete_kept_step(root, 3)
    assert kept_steps.kept_steps_on_disk(paths) == [STOP_AT]
    assert not paths.kept_side(3).exists()
    with pytest.raises(UserError, match="step 3 is not kept"):
        control.delete_kept_step(root, 3)
    plan = control.reset_plan(root, "train")
    assert str(paths.checkpoints) in plan.delete
    control.reset(root, "train")
    assert not paths.history.exists()


def test_a_full_disk_while_a_step_is_kept_is_a_sentence_and_loses_only_that_step(
        disk, caplog):
    import torch

    from gguf_trainer.data.checkpoints import load_checkpoint, model_from_checkpoint

    paths = ProjectPaths(disk / "proj")
    ck = load_checkpoint(paths.checkpoint("last"))
    model = model_from_checkpoint(ck)
    extra = {k: ck.get(k) for k in ("config", "mu", "sigma_f", "planned_steps", "train_fp",
                                     "pack", "mock", "standardized", "recipe", "val_cos", "val")}
    kept = KeptSteps(paths, Schedule(True, 3, 0, 0, 0, 6))
    before = {p.name: p.read_bytes() for p in paths.history.iterdir()}
    with full_disk(paths.history, spare_bytes=4096), caplog.at_level(logging.WARNING):
        assert kept.keep(7, 12, model, extra, 0.5, "stop") is None
    assert "kept step 7 was not written" in caplog.text and "training goes on" in caplog.text
    assert {p.name: p.read_bytes() for p in paths.history.iterdir()} == before  # no tmp left
    assert kept.keep(7, 12, model, extra, 0.5, "stop") == paths.kept_step(7)
    assert torch.equal(kept_steps.load_kept(paths, 7)["model"]["out_proj.weight"],
                       kept_steps.load_kept(paths, 7)["model"]["out_proj.weight"])


def test_the_schedule_and_its_plan():
    s = Schedule(enabled=True, every=0, start=1000, end=3000, keep=0, val_every=500)
    assert s.planned(20000) == [1000, 1500, 2000, 2500, 3000]
    assert s.is_due(3000, 20000, forced=False) and not s.is_due(3500, 20000, forced=True)
    assert s.is_due(1234, 20000, forced=True) and not s.is_due(1234, 20000, forced=False)
    assert Schedule(True, 700, 0, 0, 2, 500).planned(2000) == [700, 1400, 2000]
    assert Schedule(True, 700, 0, 0, 2, 500).files_on_disk(2000) == 2
    assert Schedule(False).planned(2000) == []
    assert kept_steps.parse_spec("step_500") == 500 and kept_steps.parse_spec("best") is None


def test_the_plan_estimates_the_size_a_kept_step_has(disk):
    """The Setup tab's estimate (torch-free, from the engine's tensor inventory) against the
    file the run wrote: within the pickle's overhead."""
    root = disk / "proj"
    plan = control.kept_plan(root)
    assert plan["planned"] == 4 and plan["files"] == 4  # 3, 6, 9, 12
    assert "4 kept step(s) every 3 steps from step 3 to 12" in plan["text"]
    real = ProjectPaths(root).kept_step(3).stat().st_size
    assert plan["kept_bytes"] <= real <= plan["kept_bytes"] * 1.05 + 64_000


def test_a_kept_step_evaluates_as_the_snapshot_from_last_pt(disk):
    """`snapshot --step N --eval`: the kept step's weights are folded, so the eval reads it as
    a raw-space checkpoint; the GGUF's figures equal those of the snapshot from last.pt."""
    root = disk / "proj"
    from_last = run_snapshot(root, "last", evaluate=True, fresh=False, device="cpu")["eval"]
    from_kept = run_snapshot(root, f"step{STOP_AT}", evaluate=True, device="cpu")["eval"]
    assert from_kept == from_last


def test_a_run_whose_kept_steps_find_the_disk_full_trains_on(disk, caplog):
    """checkpoints/history/ on a full disk (a tmpfs: root only; the unit test above covers a
    full disk in any mode): the resumed run reaches its end, each kept step is a warning
    sentence, last.pt and the steps kept before stay."""
    from hostile_fs import can_mount

    if not can_mount():
        pytest.skip("a full disk under one folder needs a tmpfs mount (root)")
    root = disk / "proj"
    paths = ProjectPaths(root)
    before = {p.name: p.read_bytes() for p in paths.history.iterdir()}
    with full_disk(paths.history, spare_bytes=0), caplog.at_level(logging.WARNING):
        assert run_pipeline(root, only=["train"]) == "done"
    assert "kept step 9 was not written" in caplog.text
    assert "kept step 12 was not written" in caplog.text
    assert {p.name: p.read_bytes() for p in paths.history.iterdir()} == before
    assert json.loads(paths.root.joinpath("checkpoints", "last.json").read_text())["step"] == 12


def test_verify_reads_each_kept_step_and_names_a_damaged_one(disk):
    from gguf_trainer.runner import verify

    root = disk / "proj"
    paths = ProjectPaths(root)
    data = paths.kept_step(3).read_bytes()
    paths.kept_step(3).write_bytes(data[: len(data) // 2])  # bit rot / a torn copy
    report = verify.verify_project(root)
    assert report["checkpoints"][f"history/step{STOP_AT}"] == "ok"
    assert "is damaged or not a kept step" in report["checkpoints"]["history/step3"]
    assert not report["ok"]
    assert any(line.startswith("checkpoints/history/step3.pt: ")
               for line in verify.describe(report, root))
