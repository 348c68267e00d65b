"""Kept steps through the real CLI after a real detached run (tiny PixArt project, mock
teacher, train.history every 6 steps of 12): `snapshot --checkpoint list` lists them,
`snapshot --step N` refuses a step not kept naming the kept ones and exports a kept step
after the run tensor for tensor as the snapshot from last.pt at that step, and `reset train`
takes them away."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from pipeline_helpers import cli_at_home, make_project
from waiting import wait_for

from gguf_trainer.base.exit_codes import EXIT_USER
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import control

pytestmark = pytest.mark.slow


def tensors(path) -> dict:
    return {t.name: np.asarray(t.data).tobytes() for t in gguf.GGUFReader(path).tensors}


def test_kept_steps_through_the_cli(tmp_path, tiny_materials):
    root, home = tmp_path / "proj", tmp_path / "home"
    make_project(root, "t5xxl_pixart", tiny_materials, **{
        "train.history": True, "train.history_every": 6, "export.dtype": "q8_0"})
    control.start(root)
    wait_for(lambda: control.status(root).get("status") in ("done", "failed"), timeout_s=600)
    assert control.status(root)["status"] == "done", control.status(root)

    listed = cli_at_home("snapshot", "--project", root, "--checkpoint", "list", home=home)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert [ln.split()[0] for ln in lines[1:3]] == ["6", "12"]
    assert "2 kept step(s)" in lines[-1]

    refused = cli_at_home("snapshot", "--project", root, "--step", "5", home=home)
    assert refused.returncode == EXIT_USER
    assert "step 5 is not kept; the kept steps are 6, 12." in refused.stderr
    assert "Traceback" not in refused.stderr

    from_last = cli_at_home("snapshot", "--project", root, "--no-fresh", home=home)
    assert from_last.returncode == 0, from_last.stderr
    out = ProjectPaths(root).root.parent / "out"
    last_file = out / "pig_t5_adapter-step12-q8_0.gguf"
    assert str(last_file) in from_last.stdout
    want = tensors(last_file)
    kept = cli_at_home("snapshot", "--project", root, "--step", "12", home=home)
    assert kept.returncode == 0, kept.stderr
    assert str(last_file) in kept.stdout and "step12.pt" in kept.stdout
    assert tensors(last_file) == want  # tensor for tensor, Q8_0 blocks included

    reset = cli_at_home("reset", "--project", root, "train", home=home)
    assert reset.returncode == 0, reset.stdout + reset.stderr
    assert not ProjectPaths(root).history.exists()
