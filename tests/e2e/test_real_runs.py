"""The real pipeline as users run it: detached via the CLI, killed, stopped, resumed.

Each test drives `python -m gguf_trainer.cli` in subprocesses on a tiny mock-teacher
project (tests/pipeline_helpers.TINY settings, one thread: bit-exact on CPU).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from pipeline_helpers import adapter_tensors, assert_same_tensors, make_project
from waiting import wait_for as _wait_for

from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import lock
from gguf_trainer.stages.stage_list import STAGES

PACK = "qwen3vl_mageflow"  # the cheapest real pack on tiny settings
# Long enough that a kill up to 0.4 s into the train stage lands inside it, however fast a
# step gets (a 12-step run can finish before the kill and the test would miss the stage).
KILL_TEST = {"train.steps": 150}


def cli(*args, env=None, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gguf_trainer.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def read_state(root) -> dict:
    try:
        return json.loads((root / "state.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def wait_for(predicate, timeout_s=300.0, poll_s=0.02):
    return _wait_for(predicate, timeout_s=timeout_s, every_s=poll_s)


def wait_idle(paths, timeout_s=180.0):
    wait_for(lambda: lock.probe(paths) is None and not lock.is_locked(paths), timeout_s)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_materials):
    root = tmp_path_factory.mktemp("ref") / "proj"
    proj = make_project(root, PACK, tiny_materials, **KILL_TEST)
    res = cli("run", "--project", root)
    assert res.returncode == 0, res.stderr
    return adapter_tensors(proj.final_gguf)


def _reached(state: dict, target: str) -> bool:
    stage = state.get("stage")
    return state.get("status") == "done" or (
        stage in STAGES and STAGES.index(stage) >= STAGES.index(target)
    )


@pytest.mark.slow  # real runs in subprocesses; "not slow" keeps the in-process crash tests
def test_kill9_in_every_stage_then_resume_is_bit_identical(
    reference, tmp_path, tiny_materials, home
):
    root = tmp_path / "proj"
    proj = make_project(root, PACK, tiny_materials, **KILL_TEST)
    paths = ProjectPaths(root)
    rng = random.Random(1234)
    killed_in = []
    for target in [
        "precompute_val",
        "precompute_train",
        "precompute_train",
        "train",
        "train",
        "train",
        "export",
        "eval",
        None,
        None,
    ]:
        res = cli("start", "--project", root)
        assert res.returncode == 0, res.stderr
        pid = wait_for(lambda: lock.probe(paths))
        if target:  # wait for that stage (or a later one: a fast stage can pass between two
            # polls), then a random moment inside it
            try:
                wait_for(lambda t=target: _reached(read_state(root), t), poll_s=0.005)
            except AssertionError:
                pass
        time.sleep(rng.uniform(0.0, 0.4))
        stage = read_state(root).get("stage")
        try:
            os.kill(pid, signal.SIGKILL)
            killed_in.append(stage)
        except ProcessLookupError:  # finished before the kill landed
            pass
        wait_idle(paths)
        if read_state(root).get("status") == "done":
            break
    assert {"precompute_train", "train"} <= set(killed_in), killed_in
    status = json.loads(cli("status", "--project", root, "--json").stdout)
    if status["status"] != "done":
        assert status["status"] == "interrupted" and "SIGKILL" in (status["error"] or "")
        assert cli("start", "--project", root).returncode == 0
        wait_for(lambda: read_state(root).get("status") in ("done", "failed"), timeout_s=180)
        wait_idle(paths)
    assert read_state(root)["status"] == "done", (root / "pipeline.log").read_text()[-3000:]
    assert_same_tensors(adapter_tensors(proj.final_gguf), reference)
    steps = [
        r["step"]
        for r in map(json.loads, paths.metrics_jsonl.read_text().splitlines())
        if "loss" in r
    ]
    assert len(steps) == len(set(steps))
    print("killed in", killed_in)


def test_sigterm_saves_last_then_set_steps_while_running(tmp_path, tiny_materials, home):
    root = tmp_path / "proj"
    make_project(root, PACK, tiny_materials, **{"train.steps": 20000, "train.val_every": 10000})
    paths = ProjectPaths(root)
    assert cli("start", "--project", root).returncode == 0
    wait_for(lambda: (read_state(root).get("step") or 0) >= 4, timeout_s=180)
    res = cli("set", "--project", root, "--steps", "15000")  # honoured within log_every steps
    assert res.returncode == 0 and "15000" in res.stdout
    wait_for(lambda: read_state(root).get("steps") == 15000)
    os.kill(lock.probe(paths), signal.SIGTERM)  # far from the end: a graceful stop that saves
    wait_idle(paths)
    st = read_state(root)
    last = json.loads((paths.checkpoints / "last.json").read_text())
    assert st["status"] == "stopped" and st["exit_code"] == 0
    assert last["step"] == st["step"] and last["steps"] == 15000
    assert json.loads(cli("status", "--project", root, "--json").stdout)["status"] == "stopped"


def test_stop_inside_precompute_ends_within_one_teacher_batch(tmp_path, tiny_materials, home):
    """One train shard of ~100 one-prompt teacher batches: a stop requested as the stage
    starts lands mid-shard, so the pipeline ends before the shard is complete (it is
    checked before every teacher batch) and discards the partial shard."""
    root = tmp_path / "proj"
    make_project(
        root,
        PACK,
        tiny_materials,
        **{
            "corpus.n_train": 100,
            "precompute.shard_size": 200,
            "precompute.teacher_batch": 1,
            "precompute.student_batch": 1,
        },
    )
    paths = ProjectPaths(root)
    assert cli("start", "--project", root).returncode == 0
    wait_for(
        lambda: read_state(root).get("stage") == "precompute_train", timeout_s=120, poll_s=0.002
    )
    paths.stop_request.write_text("stop\n")  # what `gguf-trainer stop` does first
    wait_idle(paths)
    st = read_state(root)
    assert st["status"] == "stopped" and st["stages"]["precompute_train"]["status"] == "stopped"
    assert (st["stages"]["precompute_train"]["done"] or 0) < 1  # mid-shard
    # the partial shard was discarded
    assert not list(paths.shard_dir("train").glob("*.safetensors"))
    assert not list(paths.shard_dir("train").glob(".*.tmp"))
    res = cli("stop", "--project", root)
    assert res.returncode == 0 and "not running" in (res.stdout + res.stderr).lower()
