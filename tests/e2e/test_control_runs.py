"""The control API against a real detached pipeline (tiny PixArt project, mock teacher):
a detached snapshot while training runs, live steps picked up, settings that would
invalidate the live run refused, reset refused while it runs, then reset's dry run equal to
what it deletes and the cleared stages no longer done."""

from __future__ import annotations

import pytest
from pipeline_helpers import make_project
from waiting import wait_for as _wait_for

from gguf_trainer.base.errors import UserError
from gguf_trainer.runner import control

pytestmark = pytest.mark.slow


def wait_for(pred, timeout_s=300.0, every_s=0.2):
    return _wait_for(pred, timeout_s=timeout_s, every_s=every_s)


def test_a_live_run_through_the_control_api(tmp_path, tiny_materials):
    root = tmp_path / "proj"
    make_project(root, "t5xxl_pixart", tiny_materials, **{"train.steps": 100000,
                                                          "train.save_every": 5,
                                                          "train.log_every": 5})
    control.start(root)
    try:
        wait_for(lambda: (control.status(root).get("step") or 0) >= 6)
        # live steps: the trainer re-reads project.json every log_every steps
        r = control.set_steps(root, 90000, wait_s=60)
        assert r.live and r.picked_up and "picked it up" in r.message
        # a setting that feeds the run's outputs is refused while it runs, with the reason
        res = control.update_settings(root, {"train.lr": 1e-4, "export.copy_to": ""},
                                      control.read_settings(root))
        assert "train.lr" in res.refused and "running" in res.refused["train.lr"]
        plan = control.reset_plan(root, "train")
        assert plan.blocked and "running" in plan.blocked
        with pytest.raises(UserError, match="running"):
            control.reset(root, "train")
        # a detached snapshot while training runs; the caller loads no torch
        job = control.request_snapshot(root, "last")
        assert job["status"] in ("running", "done")
        assert control.status(root)["jobs"]["snapshot"]["status"] in ("running", "done")
        end = control.wait_snapshot(root, timeout_s=300)
        assert end["status"] == "done", end
        entry = end["result"]
        assert entry["while_training"] is True and entry["step"] >= 6
        assert [s["path"] for s in control.list_snapshots(root)] == [entry["path"]]
        assert control.status(root)["status"] == "running"  # training went on
    finally:
        control.stop(root, timeout_s=300)
    info = control.status(root)
    assert info["status"] == "stopped"
    plan = control.reset_plan(root, "train")
    done = control.reset(root, "train")
    assert done.deleted == plan.delete and any(p.endswith("checkpoints") for p in done.deleted)
    assert control.status(root)["stages"]["train"]["status"] == "pending"
    # the snapshot GGUF is ours (recorded with its hash): `reset output` removes it
    out = control.reset(root, "output")
    assert entry["path"] in out.deleted and out.kept == []
