"""distributed and runner.launch without a launch: shard ownership, rank counts, the
accelerate command line, per-rank status lines, the rank watch's verdicts (no processes)."""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import pytest

from gguf_trainer.base import locks
from gguf_trainer.base.errors import UserError
from gguf_trainer.machine import distributed
from gguf_trainer.machine.distributed import World
from gguf_trainer.runner import ranks
from gguf_trainer.runner.launch import Launch


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_every_shard_has_exactly_one_owner(n):
    for k in range(23):
        owners = [r for r in range(n) if distributed.owns(k, n, World(r, n))]
        assert owners == [k % n]


def test_a_stage_uses_its_setting_capped_by_the_launch(monkeypatch):
    monkeypatch.delenv(distributed.OVERRIDE_ENV, raising=False)
    assert distributed.active_ranks(4, World(0, 2)) == 2
    assert distributed.active_ranks(1, World(0, 4)) == 1
    monkeypatch.setenv(distributed.OVERRIDE_ENV, "1")  # --processes / machines: every rank
    assert distributed.active_ranks(1, World(0, 4)) == 4


def test_threads_are_shared_by_the_ranks_of_a_machine():
    assert distributed.rank_threads(8, World(0, 4, 0, 4)) == 2
    assert distributed.rank_threads(1, World(0, 2, 0, 2)) == 1


def test_alone_without_the_launchers_environment(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert distributed.world() == World()
    assert distributed.any_true(True) and not distributed.any_true(False)
    ranks.lead("train", "abc", True)  # no-ops alone
    ranks.lead_end("done")


def test_one_process_needs_no_launcher():
    argv = Launch(1).argv(["--project", "P"])
    assert argv == [sys.executable, "-m", "gguf_trainer.runner.pipeline", "--project", "P"]
    assert not Launch(None).needed()


def test_two_processes_go_through_accelerate_launch():
    argv = Launch(2).argv(["--project", "P"])
    assert argv[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert argv[argv.index("--num_processes") + 1] == "2"
    assert argv[argv.index("--num_machines") + 1] == "1"
    assert argv[-4:] == ["-m", "gguf_trainer.runner.pipeline", "--project", "P"]
    assert Launch(2).env()[distributed.OVERRIDE_ENV] == "1"


def test_several_machines_count_all_processes_and_name_the_main_machine():
    argv = Launch(4, num_machines=2, machine_rank=1, main_process_ip="10.0.0.1",
                  main_process_port=29501).argv(["--project", "P"])
    assert argv[argv.index("--num_processes") + 1] == "8"  # accelerate counts every machine
    assert argv[argv.index("--machine_rank") + 1] == "1"
    assert argv[argv.index("--main_process_ip") + 1] == "10.0.0.1"
    assert argv[argv.index("--main_process_port") + 1] == "29501"


def test_an_accelerate_config_file_is_passed_as_it_is(tmp_path):
    cfg = tmp_path / "acc.yaml"
    cfg.write_text("num_processes: 2\n")
    launch = Launch(config_file=str(cfg))
    launch.check()
    argv = launch.argv(["--project", "P"])
    assert argv[3:5] == ["--config_file", str(cfg)] and "--num_processes" not in argv


@pytest.mark.parametrize("launch, words", [
    (Launch(0), "--processes 0"),
    (Launch(2, num_machines=2, machine_rank=2, main_process_ip="h"), "--machine-rank 2"),
    (Launch(2, num_machines=2), "--main-process-ip"),
    (Launch(config_file="/no/such.yaml"), "accelerate config"),
])
def test_bad_launch_flags_are_one_sentence(launch, words):
    with pytest.raises(UserError, match=words.replace("-", "\\-")):
        launch.check()


def test_processes_default_to_the_larger_setting():
    class S:
        class precompute:
            processes = 3

        class train:
            processes = 2

    assert Launch().resolved(S).processes == 3
    assert distributed.OVERRIDE_ENV not in Launch().resolved(S).env()  # each stage its own count
    assert Launch(1).resolved(S).processes == 1  # the flag wins


def test_status_lines_per_rank():
    info = {"status": "running", "ranks": [
        {"rank": 1, "pid": 42, "host": "b", "status": "running", "stage": "precompute_train",
         "done": 3, "total": 8, "unit": "shards", "rate": 0.5}]}
    assert ranks.format_ranks(info) == [
        "  rank 1 (pid 42 on b): running precompute_train 3/8 shards, 0.50/s"]
    assert ranks.format_ranks({**info, "status": "done"}) == []


class _Writer:
    def __init__(self):
        self.state = {}

    def update(self, fn):
        return fn(self.state)

    def mark_dirty(self):
        pass


def _rank_file(root, **rec):
    path = ranks.rank_file(root, rec["rank"])
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"run_id": "R", "host": socket.gethostname(),
                                "heartbeat": time.time(), "status": "running", **rec}))


def test_the_watch_names_a_dead_or_failed_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    paths = type("P", (), {"root": tmp_path})()
    watch = ranks.RankWatch(paths, _Writer(), "R")
    me = os.getpid()
    _rank_file(tmp_path, rank=1, pid=me, pid_start_time=locks.process_start_time(me))
    assert watch.dead_rank() is None  # rank 2 has not reported yet: within the start grace
    _rank_file(tmp_path, rank=2, pid=me, pid_start_time=locks.process_start_time(me),
               status="failed", error="no room on the card")
    assert watch.dead_rank() == (f"rank 2 (pid {me} on {socket.gethostname()}) failed: "
                                 "no room on the card")
    _rank_file(tmp_path, rank=2, pid=2 ** 22 + 7, pid_start_time=1.0)  # no such process
    assert watch.dead_rank().endswith("died")
    _rank_file(tmp_path, rank=2, pid=1, pid_start_time=1.0, host="elsewhere",
               heartbeat=time.time() - ranks.RANK_STALE_S - 5)
    assert "sent no heartbeat" in watch.dead_rank()
    _rank_file(tmp_path, rank=2, pid=1, pid_start_time=1.0, host="elsewhere", run_id="old")
    watch.started -= ranks.STARTUP_GRACE_S + 1  # a file from another run is no report
    assert "rank 2 never reported" in watch.dead_rank()
    watch._publish()
    assert [r["rank"] for r in watch.writer.state["ranks"]] == [1]


def test_the_stages_declare_how_ranks_run_them():
    """The runner reads these declarations (it names no stage): precompute runs on every
    rank (shard k -> rank k mod N), train only on its train.processes ranks, the rest on
    rank 0 alone; eval says when the settings turn it off."""
    from gguf_trainer.runner.stages import stage_objects
    from gguf_trainer.store.schema_errors import validate_settings

    objs = stage_objects()
    assert {s.name: (s.distributed, s.own_ranks_only) for s in objs} == {
        "corpus": (False, False), "precompute_val": (True, False),
        "precompute_train": (True, False), "train": (True, True), "export": (False, False),
        "eval": (False, False)}

    class Proj:
        settings = validate_settings({"pack": "t5xxl_pixart", "export": {"run_eval": False}})

    assert [s.skipped_because(Proj) for s in objs] == [None] * 5 + ["export.run_eval is off"]
    Proj.settings = validate_settings({"pack": "t5xxl_pixart"})
    assert not any(s.skipped_because(Proj) for s in objs)
