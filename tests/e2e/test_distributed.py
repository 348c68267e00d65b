"""Several processes on one project (accelerate's launcher, gloo on CPU): precompute shards
byte-identical for any N, a killed rank named in the status, data-parallel training equal to
one process at the same global batch, exact resume with the same N, two "machines" on
localhost. Tiny mock-teacher projects, one thread per rank (bit-exact on CPU).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from pipeline_helpers import adapter_tensors, assert_same_tensors, make_project
from test_real_runs import cli, read_state, wait_for, wait_idle

from gguf_trainer.base import locks
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import lock
from gguf_trainer.runner.launch import free_port

pytestmark = pytest.mark.slow

PACK = "qwen3vl_mageflow"
PRE = ["--only", "corpus", "precompute_val", "precompute_train"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def shard_bytes(paths: ProjectPaths) -> dict[str, bytes]:
    return {
        f"{p.parent.name}/{p.name}": p.read_bytes()
        for split in ("val", "train")
        for p in sorted(paths.shard_dir(split).glob("*.safetensors"))
    }


def drop_shards(paths: ProjectPaths) -> None:
    for split in ("val", "train"):
        for p in paths.shard_dir(split).glob("*.safetensors"):
            p.unlink()


def rank_record(root, rank: int) -> dict:
    try:
        return json.loads((root / "ranks" / f"rank-{rank:05d}.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def status(root) -> dict:
    return json.loads(cli("status", "--project", root, "--json").stdout)


def model_state(paths: ProjectPaths) -> dict[str, torch.Tensor]:
    return torch.load(paths.checkpoints / "last.pt", map_location="cpu", weights_only=True)["model"]


def test_precompute_any_n_same_shards_and_a_killed_rank_is_named(tmp_path, tiny_materials, home):
    root = tmp_path / "proj"
    make_project(
        root,
        PACK,
        tiny_materials,
        **{
            "corpus.n_train": 100,
            "precompute.shard_size": 8,
            "precompute.teacher_batch": 1,
            "precompute.student_batch": 1,
        },
    )
    paths = ProjectPaths(root)
    res = cli("run", "--project", root, *PRE)  # one process: the reference shards
    assert res.returncode == 0, res.stderr
    reference = shard_bytes(paths)
    assert len(reference) >= 10  # several shards per rank

    drop_shards(paths)
    res = cli("run", "--project", root, "--processes", "2", *PRE)
    assert res.returncode == 0, res.stderr + (root / "pipeline.log").read_text()[-3000:]
    assert shard_bytes(paths) == reference  # byte-identical with 2 processes
    assert rank_record(root, 1)["status"] == "done"

    drop_shards(paths)  # 2 processes again, rank 1 killed -9 inside precompute_train
    before = rank_record(root, 1)["pid"]
    assert cli("start", "--project", root, "--processes", "2", *PRE).returncode == 0
    wait_for(
        lambda: (
            (r := rank_record(root, 1)).get("pid") != before
            and r.get("status") == "running"
            and r.get("stage") == "precompute_train"
        ),
        timeout_s=120,
        poll_s=0.005,
    )
    victim = rank_record(root, 1)["pid"]
    os.kill(victim, signal.SIGKILL)
    wait_idle(paths)
    st = status(root)
    print("status after the kill:", st["message"])
    assert st["status"] == "interrupted", st
    assert f"rank 1 (pid {victim}" in st["error"] and "died" in st["error"]

    res = cli("run", "--project", root, *PRE)  # resume with 1 process
    assert res.returncode == 0, res.stderr
    assert shard_bytes(paths) == reference


TRAIN = {"train.steps": 30, "train.save_every": 5, "train.val_every": 15, "train.batch_size": 5}


def test_two_process_training_equals_one_and_resumes_bit_identically(
    tmp_path, tiny_materials, home
):
    one, two, again = (ProjectPaths(tmp_path / n) for n in ("one", "two", "again"))
    for p in (one, two, again):
        make_project(p.root, PACK, tiny_materials, name=p.root.name, **TRAIN)
    assert cli("run", "--project", one.root).returncode == 0
    res = cli("run", "--project", two.root, "--processes", "2")
    assert res.returncode == 0, res.stderr + (two.pipeline_log).read_text()[-3000:]
    a, b = model_state(one), model_state(two)
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    losses = [
        [
            r["loss"]
            for r in map(json.loads, p.metrics_jsonl.read_text().splitlines())
            if "loss" in r
        ]
        for p in (one, two)
    ]
    first = abs(losses[0][0] - losses[1][0])
    print(
        f"2 processes vs 1 at global batch 5, 30 steps: max |weight difference| {diff:.3g}, "
        f"|loss difference| at step 2 {first:.3g}"
    )
    # fp32 summation order only: AdamW divides each step by the gradient's own size, so
    # parameters with near-zero gradients carry that noise further (a parameter can move
    # lr x steps = 0.06 here); a wrong batch split or loss weighting moves the loss at once.
    assert first < 1e-5 and diff < 1e-3
    assert read_state(two.root)["status"] == "done"
    assert [
        json.loads(r)["step"] for r in two.metrics_jsonl.read_text().splitlines() if "loss" in r
    ] == list(range(2, 31, 2))  # rank 0 alone writes the metrics

    assert cli("start", "--project", again.root, "--processes", "2").returncode == 0
    pid = wait_for(lambda: lock.probe(again))
    wait_for(lambda: (read_state(again.root).get("step") or 0) >= 7, timeout_s=180, poll_s=0.005)
    os.kill(pid, signal.SIGKILL)  # rank 0, mid-training (last.pt at step 5 or 10)
    wait_idle(again)
    wait_for(
        lambda: (
            not (
                rank_record(again.root, 1).get("pid")
                and locks.process_start_time(rank_record(again.root, 1)["pid"])
            )
        )
    )
    assert status(again.root)["status"] == "interrupted"
    res = cli("run", "--project", again.root, "--processes", "2")
    assert res.returncode == 0, res.stderr
    c = model_state(again)
    assert all(torch.equal(b[k], c[k]) for k in b), "resumed 2-process run differs"
    out = two.root.parent / "out"
    assert_same_tensors(
        adapter_tensors(out / "pig_two-f16.gguf"), adapter_tensors(out / "pig_again-f16.gguf")
    )


def test_two_machines_on_localhost_run_one_project(tmp_path, tiny_materials, home):
    root = tmp_path / "proj"
    make_project(root, PACK, tiny_materials, **{"train.steps": 8})
    paths = ProjectPaths(root)
    flags = [
        "--processes",
        "1",
        "--num-machines",
        "2",
        "--main-process-ip",
        "127.0.0.1",
        "--main-process-port",
        str(free_port()),
    ]
    second = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gguf_trainer.cli",
            "run",
            "--project",
            str(root),
            *flags,
            "--machine-rank",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    res = cli("start", "--project", root, *flags, "--machine-rank", "0")  # waits for machine 1
    assert res.returncode == 0, res.stderr
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out
    wait_idle(paths)
    st = status(root)
    assert st["status"] == "done", (root / "pipeline.log").read_text()[-3000:]
    rec = rank_record(root, 1)
    assert rec["world"] == 2 and rec["status"] == "done"
    assert "machine rank 1" in out


def test_stop_and_kill_reach_every_rank_and_another_n_resumes(tmp_path, tiny_materials, home):
    root = tmp_path / "proj"
    # far more steps than a run can train while a `stop`/`kill` process starts on a loaded
    # machine (at 400 a busy box once finished the run first and read 'done')
    steps = 1_000_000
    make_project(
        root, PACK, tiny_materials, **{**TRAIN, "train.steps": steps, "train.val_every": steps}
    )
    paths = ProjectPaths(root)
    assert cli("start", "--project", root, "--processes", "2").returncode == 0
    wait_for(lambda: (read_state(root).get("step") or 0) >= 3, timeout_s=180, poll_s=0.01)
    res = cli("stop", "--project", root)
    assert res.returncode == 0, res.stderr
    wait_idle(paths)
    st, last = read_state(root), json.loads((paths.checkpoints / "last.json").read_text())
    assert st["status"] == "stopped" and last["step"] == st["step"] < steps
    assert rank_record(root, 1)["status"] == "stopped"  # rank 1 stopped at the same step and left
    wait_for(lambda: locks.process_start_time(rank_record(root, 1)["pid"]) is None, timeout_s=300)

    assert cli("start", "--project", root, "--processes", "2").returncode == 0
    wait_for(
        lambda: (read_state(root).get("step") or 0) >= last["step"] + 2, timeout_s=180, poll_s=0.01
    )
    rank1 = rank_record(root, 1)["pid"]
    assert cli("kill", "--project", root).returncode == 0
    wait_for(lambda: locks.process_start_time(rank1) is None, timeout_s=300)  # kill reached rank 1
    assert status(root)["status"] == "stopped"  # killed on request

    # the step the resume reads is last.pt's: a kill between writing last.pt and its last.json
    # sidecar leaves the sidecar one save behind
    import torch

    step = torch.load(paths.checkpoints / "last.pt", map_location="cpu", weights_only=True)["step"]
    cli("set", "--project", root, "--steps", str(step + 4))
    res = cli("run", "--project", root)  # one process continues the 2-process run
    assert res.returncode == 0, res.stderr
    log = paths.pipeline_log.read_text()
    assert (
        f"resume at step {step}: last.pt was written by 2 process(es), this run trains with 1"
        in log
    )
    assert "re-sliced" in log
    assert json.loads((paths.checkpoints / "last.json").read_text())["step"] == step + 4
