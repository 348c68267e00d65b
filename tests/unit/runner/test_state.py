"""StateWriter, Report, metrics.jsonl and derive_status, in-process with a fake clock."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from gguf_trainer.base import atomic, locks
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import lock, state, status

SCHEMA_KEYS = {"schema", "status", "pid", "pid_start_time", "host", "argv", "started",
               "finished", "heartbeat", "progress_time", "slowest_unit_s", "stage", "stages",
               "step", "steps", "val_cos", "best_val_cos", "error", "mock", "exit_code"}
STAGE_KEYS = {"status", "started", "finished", "skipped", "done", "total", "unit", "rate",
              "eta_s", "detail"}


class FakeClock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def paths(tmp_path):
    p = ProjectPaths(tmp_path)
    p.project_json.write_text('{"pack": "t5xxl_pixart"}')
    return p


def make(paths, clock=None, **kw):
    writer = state.StateWriter(paths, ["prog", "--x"], stages=state.STAGES,
                               clock=clock or time.time, **kw)
    return writer, state.Report(writer)


def on_disk(paths):
    return json.loads(paths.state_json.read_text())


def test_initial_state_has_the_whole_schema(paths):
    make(paths)
    st = on_disk(paths)
    assert set(st) == SCHEMA_KEYS
    assert st["status"] == "running" and st["pid"] == os.getpid()
    assert abs(st["pid_start_time"] - locks.process_start_time(os.getpid())) < 0.01
    assert list(st["stages"]) == sorted(state.STAGES)  # written with sorted keys
    assert all(set(s) == STAGE_KEYS and s["status"] == "pending" for s in st["stages"].values())


def test_heartbeat_thread_refreshes(paths):
    writer, _ = make(paths, heartbeat_s=0.05)
    first = on_disk(paths)["heartbeat"]
    writer.start()
    deadline = time.monotonic() + 0.9
    while on_disk(paths)["heartbeat"] == first and time.monotonic() < deadline:
        time.sleep(0.02)
    writer.close("done", exit_code=0)
    assert on_disk(paths)["heartbeat"] > first
    assert on_disk(paths)["status"] == "done" and on_disk(paths)["exit_code"] == 0


def test_progress_eta_uses_recent_throughput_and_tracks_slowest_unit(paths):
    clock = FakeClock()
    _, report = make(paths, clock)
    report.begin_stage("train")
    report.progress(100, 1000, "step")  # baseline after setup: not a unit
    clock.t += 500  # a slow first minute...
    report.progress(101, 1000, "step")
    assert report.writer.snapshot()["stages"]["train"]["eta_s"] is None  # 1 unit < 3
    for _ in range(200):  # ...then 1 step/s for a while
        clock.t += 1
        report.progress(report.writer.snapshot()["stages"]["train"]["done"] + 1, 1000, "step",
                        loss=0.5, step=5)
    st = report.writer.snapshot()
    train = st["stages"]["train"]
    assert train["rate"] == pytest.approx(1.0)  # the slow start is outside the window
    assert train["eta_s"] == pytest.approx(1000 - 301)
    assert st["slowest_unit_s"] == pytest.approx(500)
    assert st["step"] == 5 and train["loss"] == 0.5


def test_eta_unknown_until_measured_and_zero_when_done(paths):
    clock = FakeClock()
    _, report = make(paths, clock)
    report.begin_stage("corpus")
    report.progress(0, 10, "shard")
    assert report.writer.snapshot()["stages"]["corpus"]["eta_s"] is None
    clock.t += 2
    report.progress(10, 10, "shard")
    assert report.writer.snapshot()["stages"]["corpus"]["eta_s"] == 0.0


def test_progress_writes_are_throttled_except_first_and_last(paths, monkeypatch):
    _, report = make(paths)
    writes = []
    real = atomic.write_json
    monkeypatch.setattr(state.atomic, "write_json", lambda p, o: (writes.append(o), real(p, o)))
    report.begin_stage("train")
    for i in range(1, 101):
        report.progress(i, 100, "step")
    # begin + first progress + last progress (+ nothing in between within 0.5 s)
    assert len(writes) <= 4
    assert on_disk(paths)["stages"]["train"]["done"] == 100


def test_fields_copy_known_keys_to_the_top_level(paths):
    _, report = make(paths)
    report.fields(mock=True)  # before any stage: only the top-level copy
    report.begin_stage("train")
    report.fields(step=7, steps=20, val_cos=0.9, best_val_cos=0.95, prompts_per_s=3.5,
                  loss=float("nan"))
    report.end_stage("train", "stopped", detail="stop requested")
    st = on_disk(paths)
    assert (st["mock"], st["step"], st["steps"], st["val_cos"], st["best_val_cos"]) == (
        True, 7, 20, 0.9, 0.95)
    assert st["stages"]["train"]["prompts_per_s"] == 3.5
    assert st["stages"]["train"]["loss"] is None  # non-finite -> null (strict JSON)
    assert st["stages"]["train"]["status"] == "stopped"
    with pytest.raises(AssertionError):
        report.fields(status="done")  # reserved


def test_close_marks_a_still_running_stage(paths):
    writer, report = make(paths)
    report.begin_stage("precompute_train")
    writer.close("failed", "boom", 1)
    st = on_disk(paths)
    assert st["stages"]["precompute_train"]["status"] == "failed"
    assert (st["status"], st["error"], st["exit_code"]) == ("failed", "boom", 1)


def test_stop_requested_by_flag_or_file(paths):
    _, report = make(paths)
    assert not report.stop_requested()
    paths.stop_request.write_text("{}")
    assert report.stop_requested() and not report.stop_signalled()
    paths.stop_request.unlink()
    report.request_stop()
    assert report.stop_requested() and report.stop_signalled()


# ---- metrics --------------------------------------------------------------------------
def test_truncate_metrics_leaves_no_duplicate_step(paths):
    _, report = make(paths)
    for step in range(1, 11):
        report.metrics(step, {"loss": 1.0 / step})
    report.close_metrics()  # "crash" after step 10; the checkpoint was at step 6
    _, report = make(paths)
    assert report.truncate_metrics(6) == 4
    for step in range(7, 12):
        report.metrics(step, {"loss": 0.1})
    rows, _ = state.read_metrics(paths)
    steps = [r["step"] for r in rows]
    assert steps == list(range(1, 12))
    assert all("time" in r for r in rows)


def test_append_cuts_a_torn_last_line_first(paths):
    paths.metrics_jsonl.write_text('{"step": 1}\n{"step": 2, "lo')
    _, report = make(paths)
    report.metrics(2, {"loss": 0.5})
    assert [r["step"] for r in state.read_metrics(paths)[0]] == [1, 2]


def test_read_metrics_by_offset_never_returns_a_partial_line(paths):
    path = paths.metrics_jsonl
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')
    rows, off = state.read_metrics(paths, 0)
    assert [r["step"] for r in rows] == [1, 2]
    assert off == len('{"step": 1}\n{"step": 2}\n')
    assert state.read_metrics(paths, off) == ([], off)  # the partial line stays unread
    with open(path, "a") as f:
        f.write('ss": 0.1}\n{"step": 4}\n')
    rows, off2 = state.read_metrics(paths, off)
    assert [r["step"] for r in rows] == [3, 4] and rows[0]["loss"] == 0.1
    assert off2 == path.stat().st_size


def test_read_metrics_restarts_when_the_file_was_rewritten(paths):
    paths.metrics_jsonl.write_text('{"step": 1}\n')
    assert state.read_metrics(paths, 999) == ([{"step": 1}], 12)  # offset past the end
    paths.metrics_jsonl.write_text('{"step": 1}\n{"step": 22}\n')
    rows, _ = state.read_metrics(paths, 5)  # not at a line boundary: restart at 0
    assert [r["step"] for r in rows] == [1, 22]
    assert state.read_metrics(ProjectPaths(paths.root / "nope"), 0) == ([], 0)


# ---- derive_status --------------------------------------------------------------------
def write_state(paths, **kw):
    st = state.empty_state()
    me = os.getpid()
    now = time.time()
    st.update(status="running", pid=me, pid_start_time=locks.process_start_time(me),
              host=socket.gethostname(), heartbeat=now, progress_time=now, started=now)
    st.update(kw)
    atomic.write_json(paths.state_json, st)


def test_derive_idle(paths):
    info = status.derive_status(paths)
    assert info["status"] == "idle" and info["pid"] is None
    assert SCHEMA_KEYS <= set(info)


def test_derive_running_and_stalled_need_the_lock(paths):
    with lock.hold(paths):
        write_state(paths, stage="train", stages={"train": {"status": "running", "done": 5,
                                                            "total": 10, "unit": "step"}})
        info = status.derive_status(paths)
        assert info["status"] == "running" and info["pid"] == os.getpid()
        assert "train 5/10 step" in info["message"]
        # heartbeat fresh, but no progress for longer than max(10 min, 5 x slowest unit)
        write_state(paths, progress_time=time.time() - 590)
        assert status.derive_status(paths)["status"] == "running"  # limit: 10 min
        write_state(paths, stage="train", progress_time=time.time() - 610)
        info = status.derive_status(paths)
        assert info["status"] == "stalled" and "no progress in train" in info["message"]
        write_state(paths, progress_time=time.time() - 700, slowest_unit_s=200)
        assert status.derive_status(paths)["status"] == "running"  # limit: 5 x 200 s
        write_state(paths, progress_time=time.time() - 1010, slowest_unit_s=200)
        assert status.derive_status(paths)["status"] == "stalled"
        # heartbeat stale: the process is frozen
        write_state(paths, heartbeat=time.time() - state.HEARTBEAT_STALE_S - 5)
        info = status.derive_status(paths)
        assert info["status"] == "stalled" and "heartbeat" in info["message"]
    # the same "running" state with nobody holding the lock: it died
    write_state(paths)
    info = status.derive_status(paths)
    assert info["status"] == "interrupted" and info["pid"] is None
    assert info["last_pid"] == os.getpid()


def test_derive_interrupted_says_how_it_died(paths):
    write_state(paths, pid=2**22 + 7, pid_start_time=123.0, stage="train",
                stages={"train": {"status": "running", "eta_s": 5.0}})
    atomic.write_json(state.exit_record_path(paths), {"exits": [
        {"pid": 2**22 + 7, "pid_start_time": 123.0, "returncode": -9, "signal": "SIGKILL"}]})
    info = status.derive_status(paths)
    assert info["status"] == "interrupted"
    assert info["error"] == "killed by SIGKILL — out of memory?"
    assert info["exit"]["returncode"] == -9
    assert info["stages"]["train"] == {"status": "interrupted", "eta_s": None, "skipped": False}
    assert on_disk(paths)["stages"]["train"]["status"] == "running"  # clients never write


def test_derive_held_by_a_process_we_cannot_name_is_running_without_pid(paths):
    write_state(paths, pid=2**22 + 7, pid_start_time=123.0)
    fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
    try:
        import fcntl
        fcntl.flock(fd, fcntl.LOCK_EX)  # a holder in another pid namespace, say
        info = status.derive_status(paths)
    finally:
        os.close(fd)
    assert info["status"] == "running" and info["pid"] is None


def test_derive_kill_marker_reads_as_stopped(paths):
    write_state(paths, pid=2**22 + 7, pid_start_time=123.0)
    atomic.write_json(state.killed_marker_path(paths), {"pid": 2**22 + 7,
                                                        "pid_start_time": 123.0})
    assert status.derive_status(paths)["status"] == "stopped"
    atomic.write_json(state.killed_marker_path(paths), {"pid": 2**22 + 7,
                                                        "pid_start_time": 999.0})
    assert status.derive_status(paths)["status"] == "interrupted"  # another process's marker


@pytest.mark.parametrize("recorded", ["done", "stopped", "failed"])
def test_derive_recorded_endings(paths, recorded):
    write_state(paths, status=recorded, error="bad steps" if recorded == "failed" else None)
    info = status.derive_status(paths)
    assert info["status"] == recorded
    if recorded == "failed":
        assert info["error"] == "bad steps" and "bad steps" in info["message"]


def test_derive_previous_state_while_a_new_holder_starts(paths):
    write_state(paths, status="done", pid=2**22 + 7, pid_start_time=123.0)
    with lock.hold(paths):
        info = status.derive_status(paths)
    assert info["status"] == "running" and info["pid"] == os.getpid()


def test_format_eta():
    assert status.format_eta(None) == "—"
    assert status.format_eta(12.4) == "12s"
    assert status.format_eta(250) == "4m10s"
    assert status.format_eta(3900) == "1h05m"
