"""The supervisor with real processes: detached starts, stop/SIGTERM/kill/kill -9, races,
stale pids, auto-resume, and the flock traps. The pipeline is the real shell around fake
stages (tests/e2e/fake_pipeline.py), so no torch work runs here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from waiting import wait_for

from gguf_trainer.base import atomic, locks
from gguf_trainer.base.exit_codes import EXIT_INTERNAL, EXIT_USER
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import lock, processes, state, status, supervisor

E2E_DIR = Path(__file__).resolve().parent
FAKE = "fake_pipeline"


@pytest.fixture(autouse=True)
def env(tmp_path, monkeypatch):
    monkeypatch.setenv(supervisor.HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(E2E_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("FAKE_UNITS", "400")  # long unless a test shortens it
    monkeypatch.setenv("FAKE_UNIT_S", "0.05")
    for knob in ("FAKE_FAIL", "FAKE_CHILD"):
        monkeypatch.delenv(knob, raising=False)


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "project.json").write_text('{"pack": "t5xxl_pixart"}')
    yield root
    _cleanup(ProjectPaths(root))


def _cleanup(paths: ProjectPaths) -> None:
    """Kill whatever pipeline a failed test left behind (verified holder only)."""
    found = lock.holder(paths)
    if found:
        processes.signal_verified(*found, signal.SIGKILL)


def wait_status(root, *wanted, timeout_s=300.0):
    def reached():
        info = supervisor.status(root)
        return info if info["status"] in wanted else None
    return wait_for(reached, timeout_s)


def fake_pipelines(root) -> list[psutil.Process]:
    """Live fake pipeline processes of this project (not their monitors)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if (p.info["status"] != psutil.STATUS_ZOMBIE and str(root) in cmd
                and any("fake_pipeline" in c for c in cmd) and "monitor" not in cmd):
            found.append(p)
    return found


def in_progress(root):
    """Wait until the run has made a few units of progress in some stage."""
    def moving():
        info = supervisor.status(root)
        stage = info["stages"].get(info["stage"] or "", {})
        return info if info["status"] == "running" and (stage.get("done") or 0) >= 2 else None
    return wait_for(moving)


# ---- lock traps (processes needed) ----------------------------------------------------
HOLDER = textwrap.dedent("""
    import os, subprocess, sys, time
    from gguf_trainer.base.paths import ProjectPaths
    from gguf_trainer.runner import lock
    with lock.hold(ProjectPaths(sys.argv[1])):
        child = subprocess.Popen(["sleep", "30"])   # fork + exec: O_CLOEXEC drops the fd
        forked = os.fork()                          # fork without exec: the at-fork hook
        if forked == 0:
            time.sleep(30)
            os._exit(0)
        print(child.pid, forked, flush=True)
        time.sleep(30)
""")


def test_lock_dies_with_the_holder_even_while_its_children_live(project):
    paths = ProjectPaths(project)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(project)],
                              stdout=subprocess.PIPE, text=True)
    kids = [int(x) for x in holder.stdout.readline().split()]
    try:
        assert lock.probe(paths) == holder.pid
        with pytest.raises(locks.LockHeld, match=rf"already running \(pid {holder.pid}\)"), \
                lock.hold(paths, retry_s=0.1):
            pass
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        assert all(locks.process_start_time(k) is not None for k in kids)  # still alive
        assert lock.probe(paths) is None
        with lock.hold(paths, retry_s=0.1):  # and it can be taken again
            pass
        assert paths.lock.exists()
    finally:
        for k in kids:
            os.kill(k, signal.SIGKILL)


# ---- start / stop / signals -----------------------------------------------------------
def test_start_status_stop(project):
    pid = supervisor.start(project, module=FAKE)
    paths = ProjectPaths(project)
    assert lock.probe(paths) == pid
    info = in_progress(project)
    assert info["status"] == "running" and info["pid"] == pid and info["mock"] is True
    assert set(state.empty_state()) <= set(info)
    assert supervisor.settings_path().exists()  # remembered for auto-resume
    assert supervisor.stop(project, timeout_s=300) == "stopped"
    info = supervisor.status(project)
    assert info["status"] == "stopped" and info["exit_code"] == 0 and info["pid"] is None
    assert info["stages"][info["stage"]]["status"] == "stopped"
    assert not paths.stop_request.exists()
    assert wait_for(lambda: status.find_exit_record(paths, status.read_state(paths)))[
        "returncode"] == 0
    log_text = paths.pipeline_log.read_text()
    assert "===== launch " in log_text and "stage corpus: started" in log_text


def test_sigterm_is_a_graceful_stop(project):
    pid = supervisor.start(project, module=FAKE)
    in_progress(project)
    os.kill(pid, signal.SIGTERM)
    info = wait_status(project, "stopped")
    assert info["exit_code"] == 0 and info["error"] is None


def test_kill9_is_interrupted_and_auto_resume_relaunches_only_that(project):
    pid = supervisor.start(project, module=FAKE)
    in_progress(project)
    os.kill(pid, signal.SIGKILL)
    info = wait_status(project, "interrupted")
    assert info["pid"] is None and info["last_pid"] == pid
    # the monitor records the signal shortly after the death
    def with_exit_record():
        info = supervisor.status(project)
        return info if info["exit"] else None
    info = wait_for(with_exit_record)
    assert info["error"] == "killed by SIGKILL — out of memory?"

    sentence = supervisor.auto_resume(module=FAKE)
    assert sentence.startswith("auto-resume: relaunched") and "SIGKILL" in sentence
    new_pid = wait_status(project, "running")["pid"]
    assert new_pid != pid
    assert supervisor.stop(project, timeout_s=300) == "stopped"
    assert "nothing to resume" in supervisor.auto_resume(module=FAKE)  # stopped: left alone
    assert lock.probe(ProjectPaths(project)) is None


def test_auto_resume_leaves_a_done_run_alone(project, monkeypatch):
    monkeypatch.setenv("FAKE_UNITS", "1")
    supervisor.start(project, module=FAKE)
    first = wait_status(project, "done")["last_pid"]
    # The pipeline records "done" a moment before it exits and frees the lock.
    wait_for(lambda: lock.probe(ProjectPaths(project)) is None)
    assert "is done; nothing to resume" in supervisor.auto_resume(module=FAKE)
    assert lock.probe(ProjectPaths(project)) is None  # nothing was relaunched
    assert supervisor.status(project)["last_pid"] == first


def test_supervisor_kill_also_kills_children_and_reads_as_stopped(project, monkeypatch):
    monkeypatch.setenv("FAKE_CHILD", "1")
    supervisor.start(project, module=FAKE)
    child_file = project / "fake-child.pid"
    wait_for(child_file.exists)
    child = int(child_file.read_text())
    assert supervisor.kill(project) == "killed"
    info = supervisor.status(project)
    assert info["status"] == "stopped" and "kill" in info["message"]
    wait_for(lambda: locks.process_start_time(child) is None)


@pytest.mark.parametrize("fail,code,error", [
    ("user", EXIT_USER, "train.steps must be positive; fix it with gguf-trainer set"),
    ("bug", EXIT_INTERNAL, "internal error (RuntimeError: fake bug); the traceback is in {log}")])
def test_failures_are_recorded_as_sentences(project, monkeypatch, fail, code, error):
    monkeypatch.setenv("FAKE_FAIL", fail)
    monkeypatch.setenv("FAKE_UNITS", "1")
    supervisor.start(project, module=FAKE)
    info = wait_status(project, "failed")
    error = error.format(log=ProjectPaths(project).pipeline_log)
    assert (info["error"], info["exit_code"]) == (error, code)
    log_text = ProjectPaths(project).pipeline_log.read_text()
    assert ("Traceback" in log_text) == (fail == "bug")


# ---- races ----------------------------------------------------------------------------
def test_three_concurrent_starts_make_one_pipeline(project):
    results = []

    def go():
        try:
            results.append(supervisor.start(project, module=FAKE))
        except locks.LockHeld as e:
            results.append(e)

    threads = [threading.Thread(target=go) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    winners = [r for r in results if isinstance(r, int)]
    losers = [r for r in results if isinstance(r, locks.LockHeld)]
    assert len(winners) == 1 and len(losers) == 2, results
    assert all(str(e) == f"already running (pid {winners[0]})" for e in losers)
    assert [p.pid for p in fake_pipelines(project)] == winners
    assert supervisor.stop(project, timeout_s=300) == "stopped"


@pytest.mark.parametrize("fg_delay_s", [0.0, 0.4])  # either side may win; both are fine
def test_start_racing_a_foreground_run(project, fg_delay_s):
    results = []

    def go():
        try:
            results.append(supervisor.start(project, module=FAKE))
        except locks.LockHeld as e:
            results.append(e)

    racer = threading.Thread(target=go)
    if fg_delay_s:
        racer.start()
        time.sleep(fg_delay_s)
    fg = subprocess.Popen([sys.executable, str(E2E_DIR / "fake_pipeline.py"), "--foreground",
                           "--project", str(project)], stderr=subprocess.PIPE, text=True)
    if not fg_delay_s:
        racer.start()
    racer.join(60)
    started = results[0]
    if isinstance(started, int):  # the detached one won: the foreground run refused
        assert fg.wait(30) == 1
        assert f"already running (pid {started})" in fg.stderr.read()
    else:  # the foreground run won
        assert str(started) == f"already running (pid {fg.pid})"
        assert fg.poll() is None
    holders = fake_pipelines(project)
    assert len(holders) == 1 and lock.probe(ProjectPaths(project)) == holders[0].pid
    assert supervisor.stop(project, timeout_s=300) == "stopped"
    fg.wait(30)


# ---- stale pids are never signalled ---------------------------------------------------
def test_stale_pid_pointing_at_an_unrelated_process_is_left_alone(project):
    paths = ProjectPaths(project)
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        start = wait_for(lambda: locks.process_start_time(bystander.pid))
        # 1. a dead pipeline's label + state naming the bystander, nobody holds the lock
        paths.lock.write_text(f"{bystander.pid} {start:.6f}\n")
        st = state.empty_state()
        st.update(status="running", pid=bystander.pid, pid_start_time=start)
        atomic.write_json(paths.state_json, st)
        assert supervisor.stop(project, timeout_s=1) == "not running"
        assert supervisor.kill(project) == "not running"
        assert supervisor.status(project)["status"] == "interrupted"
        # 2. the lock IS held (here, by this test), but the label names the bystander with
        #    a wrong start time (a recycled pid), or pid 1
        fd = os.open(paths.lock, os.O_RDWR | os.O_CLOEXEC)
        try:
            import fcntl
            fcntl.flock(fd, fcntl.LOCK_EX)
            for label in (f"{bystander.pid} {start - 3:.6f}\n", "1 0.0\n"):
                os.ftruncate(fd, 0)
                os.pwrite(fd, label.encode(), 0)
                assert supervisor.kill(project) == "not running"
                assert supervisor.stop(project, timeout_s=1) == "not running"
        finally:
            os.close(fd)
        assert not processes.signal_verified(bystander.pid, start - 3, signal.SIGKILL)
        time.sleep(0.1)
        assert bystander.poll() is None  # still alive
    finally:
        bystander.kill()
        bystander.wait()


# ---- CLI in a subprocess --------------------------------------------------------------
def test_cli_stop_timeout_is_exit_3_then_kill(project, monkeypatch):
    # A unit outlasts any stop timeout however slow the machine (kill ends it), and the stop
    # comes once the run is inside its first unit: a busy machine cannot let it finish first.
    monkeypatch.setenv("FAKE_UNIT_S", "600")
    supervisor.start(project, module=FAKE)
    wait_for(lambda: supervisor.status(project)["stage"] == "corpus")
    cli = [sys.executable, "-m", "gguf_trainer.cli"]
    r = subprocess.run([*cli, "stop", "--project", str(project), "--timeout", "1"],
                       capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 3 and "still finishing" in r.stderr
    r = subprocess.run([*cli, "kill", "--project", str(project)], capture_output=True,
                       text=True, timeout=30, check=False)
    assert r.returncode == 0 and r.stdout.startswith("killed")
    r = subprocess.run([*cli, "start", "--project", str(project / "nope")],
                       capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr


@pytest.mark.parametrize("how", ["timed_out_then_kill", "no_wait_then_kill", "hand_written"])
def test_a_leftover_stop_request_does_not_stop_the_next_start(project, how, monkeypatch):
    """Class 10: a stop request nobody answered (stop timed out or did not wait, then kill;
    or a stray file) is cleared at start, so the new run keeps running."""
    paths = ProjectPaths(project)
    if how == "hand_written":
        paths.stop_request.write_text("{}")
    else:
        monkeypatch.setenv("FAKE_UNIT_S", "600")  # a unit outlasts the stop timeout; kill ends it
        supervisor.start(project, module=FAKE)
        monkeypatch.setenv("FAKE_UNIT_S", "0.05")
        wait_for(lambda: supervisor.status(project)["stage"] == "corpus")
        time.sleep(0.3)  # inside its first unit: the request waits for the unit's end
        if how == "timed_out_then_kill":
            with pytest.raises(supervisor.StopTimeout):
                supervisor.stop(project, timeout_s=0.2, grace_s=100)
        else:
            assert supervisor.stop(project, timeout_s=0) == "stopping"
        assert supervisor.kill(project) == "killed"
        assert paths.stop_request.exists()  # what the next start must not obey
    pid = supervisor.start(project, module=FAKE)
    info = in_progress(project)
    time.sleep(1.0)  # a leftover request would be obeyed at the next unit (0.05 s)
    info = supervisor.status(project)
    assert info["status"] == "running" and info["pid"] == pid
    assert supervisor.stop(project, timeout_s=300) == "stopped"
