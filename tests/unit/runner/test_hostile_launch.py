"""`run --processes N` beyond what the machine holds is refused before any rank starts.

The bound: one rank per visible GPU, or per CPU core on the CPU backend, and (CPU backend)
N times the student's and teacher's bytes within the available RAM. Refusals come from
control.resolve_launch, which `run` and `start` call before launching anything, so these
tests never spawn a rank.
"""

from __future__ import annotations

import pytest

from gguf_trainer import cli
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.exit_codes import EXIT_USER
from gguf_trainer.runner import capacity, control
from gguf_trainer.runner.launch import Launch

PACK = "t5xxl_pixart"


@pytest.fixture
def proj(tmp_path):
    root = tmp_path / "p"
    control.new_project(root, PACK, overrides={"precompute.mock_teacher": True})
    return root


def test_a_thousand_processes_on_this_machine_are_refused_with_the_numbers(proj, monkeypatch):
    monkeypatch.setattr(capacity, "visible_gpus", lambda: 0)
    cores = capacity.cpu_cores()
    with pytest.raises(UserError) as e:
        control.resolve_launch(proj, Launch(1000))
    assert f"--processes 1000 is more than this machine's {cores} CPU core" in str(e.value)
    assert f"use --processes {cores} or fewer" in str(e.value)


def test_the_cli_refuses_before_spawning(proj, monkeypatch, capsys):
    monkeypatch.setattr(capacity, "visible_gpus", lambda: 0)
    spawned = []
    monkeypatch.setattr("gguf_trainer.runner.supervisor.run_launched",
                        lambda *a, **k: spawned.append(a) or 0)
    code = cli.main(["run", "--project", str(proj), "--processes", "1000"])
    assert code == EXIT_USER and not spawned
    assert "--processes 1000 is more than" in capsys.readouterr().err


def test_the_settings_count_is_bounded_too(proj, monkeypatch):
    monkeypatch.setattr(capacity, "visible_gpus", lambda: 0)
    control.update_settings(proj, {"train.processes": 512}, None)
    with pytest.raises(UserError, match="precompute.processes / train.processes 512"):
        control.resolve_launch(proj)


def test_gpus_bound_the_count_when_there_are_gpus(proj, monkeypatch):
    monkeypatch.setattr(capacity, "visible_gpus", lambda: 2)
    assert control.resolve_launch(proj, Launch(2)).processes == 2
    with pytest.raises(UserError, match="more than this machine's 2 GPUs"):
        control.resolve_launch(proj, Launch(3))


def test_memory_bounds_the_cpu_backend():
    cap = capacity.Capacity("cpu", devices=64, ram_gib=10.0, per_rank_gib=3.0)
    capacity.check_processes(3, cap)
    with pytest.raises(UserError) as e:
        capacity.check_processes(4, cap)
    assert "(at least 3.0 GiB), so 4 ranks need 12.0 GiB but 10.0 GiB is available; " \
           "use --processes 3 or fewer" in str(e.value)


def test_cuda_visible_devices_narrows_the_gpus(monkeypatch):
    monkeypatch.setattr(capacity, "_nvml_count", lambda: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    assert capacity.visible_gpus() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert capacity.visible_gpus() == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,-1,3")
    assert capacity.visible_gpus() == 1


def test_one_process_is_never_refused(proj, monkeypatch):
    monkeypatch.setattr(capacity, "read_capacity",
                        lambda *a, **k: capacity.Capacity("cpu", 1, 0.0, 100.0))
    assert not control.resolve_launch(proj, Launch(1)).needed()
