"""The project lock, in-process (flock conflicts between two open() calls of one process
too, so a second `hold` here behaves like a second pipeline). The kill -9 / fork-child
cases need processes: tests/e2e/test_supervisor.py."""

from __future__ import annotations

import fcntl
import os

import psutil
import pytest

from gguf_trainer.base import locks
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import lock


@pytest.fixture
def paths(tmp_path):
    return ProjectPaths(tmp_path)


def test_holder_writes_its_pid_and_start_time(paths):
    with lock.hold(paths) as pid:
        assert pid == os.getpid()
        label = locks.read_label(paths.lock)
        assert label[0] == os.getpid()
        assert abs(label[1] - locks.process_start_time(os.getpid())) < locks.START_TIME_TOLERANCE_S
        assert lock.probe(paths) == os.getpid()
        assert lock.holder(paths) == label


def test_second_acquire_is_refused_with_the_holders_pid(paths):
    with lock.hold(paths):
        pattern = rf"^already running \(pid {os.getpid()}\)$"
        with pytest.raises(locks.LockHeld, match=pattern) as e, lock.hold(paths, retry_s=0.1):
            pass
        assert e.value.pid == os.getpid()
        assert lock.probe(paths) == os.getpid()  # the refused attempt did not disturb it


def test_release_frees_the_lock_and_never_deletes_the_file(paths):
    with lock.hold(paths):
        inode = paths.lock.stat().st_ino
    assert lock.probe(paths) is None
    assert paths.lock.exists() and paths.lock.stat().st_ino == inode
    assert locks.read_label(paths.lock) is None  # label cleared while still held
    with lock.hold(paths):  # re-acquirable, same file
        assert paths.lock.stat().st_ino == inode
    assert paths.lock.exists()


def test_released_even_when_the_body_raises(paths):
    with pytest.raises(RuntimeError), lock.hold(paths):
        raise RuntimeError("boom")
    assert lock.probe(paths) is None
    assert paths.lock.exists()


def test_descriptor_is_close_on_exec(paths):
    with lock.hold(paths):
        fds = list(locks._held_fds)
        assert len(fds) == 1
        assert fcntl.fcntl(fds[0], fcntl.F_GETFD) & fcntl.FD_CLOEXEC


def test_stale_label_without_a_holder_is_not_running(paths):
    # A dead holder's label naming a live process (this one, pid 1): nobody holds the lock.
    paths.lock.write_text(f"{os.getpid()} {locks.process_start_time(os.getpid()):.6f}\n")
    assert lock.probe(paths) is None
    paths.lock.write_text("1 12345.0\n")
    assert lock.probe(paths) is None


def test_held_lock_with_a_label_that_does_not_verify_names_nobody(paths):
    # Someone holds the lock but the label points at pid 1 with a wrong start time (a
    # recycled pid): probe must not name pid 1, or a stop would signal it.
    fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"1 12345.0\n")
        assert lock.probe(paths, settle_s=0.05) is None
        assert lock.holder(paths, settle_s=0.05) is None
    finally:
        os.close(fd)


def test_probe_of_a_folder_never_locked(paths):
    assert lock.probe(paths) is None
    assert not paths.lock.exists()  # probing creates nothing


def test_is_same_process_rejects_a_wrong_start_time():
    me = os.getpid()
    assert locks.is_same_process(me, locks.process_start_time(me))
    assert not locks.is_same_process(me, locks.process_start_time(me) - 5)
    assert not locks.is_same_process(None, 1.0)
    assert not locks.is_same_process(2**22 + 12345, 1.0)


def test_start_time_is_boot_relative_and_matches_psutil():
    me = os.getpid()
    boot_relative = psutil.Process(me).create_time() - psutil.boot_time()
    assert locks.process_start_time(me) == pytest.approx(boot_relative, abs=0.02)


def test_is_locked_sees_an_unnamed_holder(paths):
    assert not lock.is_locked(paths)
    with lock.hold(paths):
        assert lock.is_locked(paths)
    assert not lock.is_locked(paths)


def test_hold_file_for_other_jobs_names_its_holder(paths):
    job_lock = paths.root / "job.lock"
    with locks.hold_file(job_lock, "a snapshot export is already running"):
        assert locks.probe_file(job_lock) == os.getpid()
        assert lock.probe(paths) is None  # a different lock from the pipeline's
        with pytest.raises(locks.LockHeld,
                           match=r"^a snapshot export is already running \(pid \d+\)$"), \
                locks.hold_file(job_lock, "a snapshot export is already running", retry_s=0.05):
            pass
    assert locks.probe_file(job_lock) is None and job_lock.exists()
