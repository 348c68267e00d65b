"""Lock files held with flock, and the identity of a process: (pid, start time).

Every exclusive "one at a time" in the tool is a lock file held here: the project's pipeline
(runner/lock.py), the settings writer (project.py), the snapshot export and the background
jobs (runner/jobs.py). Must not: delete or replace a lock file (a new inode would let a
second process lock "the same" file), signal anything, or write state.json.

How it works
* The holder takes `flock(LOCK_EX | LOCK_NB)` on the file for its whole life. The kernel
  drops the lock when the last descriptor of that open file goes away, i.e. when the
  process dies for any reason, kill -9 included: there is no stale lock to clean up.
* After acquiring, the holder writes "pid start_time" INTO the file (truncate + write in
  place), so clients can name it. The content is only a label: it is trusted only while the
  lock is held AND /proc shows a live process with that pid and that start time.
* Why flock and not fcntl/lockf record locks: POSIX record locks are dropped when ANY
  descriptor of the file is closed by the process (a library opening and closing the file
  would silently unlock it).
* The flock trap: a lock belongs to the open file description, which a child shares. The
  descriptor is opened O_CLOEXEC, so `subprocess` children (fork + exec) do not keep it, and
  an `os.register_at_fork` hook closes it in children forked WITHOUT exec (multiprocessing
  "fork", DataLoader workers). Closing it in the child does not unlock the parent (only
  LOCK_UN or the last close does), so the lock still dies with the holder.
* Races: `holder` takes a shared lock for a microsecond; a holder starting at that moment
  retries for `retry_s` before it refuses, so a status poll never makes a start fail.

Usage:
    with locks.hold_file(paths.snapshot_lock, "a snapshot export is already running"): ...
    locks.probe_file(paths.snapshot_lock)      # -> verified holder pid, or None
    locks.process_start_time(pid)              # -> seconds after boot, or None if gone
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from gguf_trainer.base.errors import UserError, as_user_error

# A process is named by (pid, start time). The start time is read in seconds AFTER BOOT from
# /proc/<pid>/stat (clock ticks): exact, identical in every reader, and immune to wall-clock
# steps (psutil.create_time adds the boot time, which moves when NTP steps the clock, and
# that would make a live pipeline look dead). The tolerance only absorbs float formatting.
START_TIME_TOLERANCE_S = 0.005
_HAS_PROC = os.path.isdir("/proc/self")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if _HAS_PROC else 100
_held_fds: set[int] = set()  # descriptors this process holds, closed in fork children
_held_lock = threading.Lock()


class LockHeld(UserError):
    """Another live process holds the lock. `pid` is None when it cannot be named."""

    def __init__(self, pid: int | None, what: str = "already running"):
        self.pid = pid
        super().__init__(f"{what} (pid {pid if pid is not None else 'unknown'})")


def process_start_time(pid: int) -> float | None:
    """Seconds after boot at which `pid` started; None if no such live (non-zombie) process."""
    if not _HAS_PROC:  # not Linux: psutil's wall-clock value (no /proc ticks to read)
        try:
            proc = psutil.Process(pid)
            return None if proc.status() == psutil.STATUS_ZOMBIE else proc.create_time()
        except psutil.NoSuchProcess:
            return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = data[data.rfind(b")") + 2:].split()  # the command name may contain spaces
    if fields[0] == b"Z":
        return None
    return int(fields[19]) / _CLOCK_TICKS


def is_same_process(pid: int | None, start_time: float | None) -> bool:
    """True only if `pid` is alive now AND started at `start_time` (a reused pid is not)."""
    if not pid or pid <= 0 or start_time is None:
        return False
    actual = process_start_time(pid)
    return actual is not None and abs(actual - float(start_time)) <= START_TIME_TOLERANCE_S


def read_label(lock_file: Path) -> tuple[int, float] | None:
    """The "pid start_time" the last holder wrote, or None if absent/unparsable."""
    try:
        text = Path(lock_file).read_text(encoding="ascii", errors="replace")
    except OSError:  # absent, a folder in its place, unreadable: no label
        return None
    parts = text.split()
    if len(parts) != 2:
        return None
    try:
        return int(parts[0]), float(parts[1])
    except ValueError:  # a torn or foreign file content: no label
        return None


def _close_in_fork_child() -> None:
    # A child forked without exec must not keep the lock alive after the holder dies.
    for fd in list(_held_fds):
        with contextlib.suppress(OSError):  # already closed by the child: nothing to do
            os.close(fd)
    _held_fds.clear()


os.register_at_fork(after_in_child=_close_in_fork_child)


def _try_flock(fd: int, how: int) -> bool:
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise


def _write_label(fd: int) -> None:
    me = os.getpid()
    label = f"{me} {process_start_time(me):.6f}\n".encode("ascii")
    os.ftruncate(fd, 0)
    os.pwrite(fd, label, 0)
    os.fsync(fd)


@contextlib.contextmanager
def hold_file(lock_file: Path, what: str, retry_s: float = 1.0,
              retry_interval_s: float = 0.05) -> Iterator[int]:
    """Hold `lock_file` for the body; yields our pid. Refusal: LockHeld("<what> (pid N)").

    Retries for `retry_s` first, because a client's probe may own the lock for an instant.
    """
    # O_CREAT without O_TRUNC: the file is created once and its inode never changes.
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:  # a folder in its place, read-only, full ...: one sentence
        user = as_user_error(e, lock_file)
        if user is None:
            raise
        raise user from None
    acquired = False
    try:
        deadline = time.monotonic() + retry_s
        while not _try_flock(fd, fcntl.LOCK_EX):
            if time.monotonic() >= deadline:
                raise LockHeld(probe_file(lock_file), what)
            time.sleep(retry_interval_s)
        acquired = True
        with _held_lock:
            _held_fds.add(fd)
        _write_label(fd)
        yield os.getpid()
    finally:
        if acquired:
            # Clear the label while we still hold the lock (after unlocking, the next
            # holder's label could be erased). A crash skips this; a stale label then
            # fails verification because its pid is gone or has another start time.
            os.ftruncate(fd, 0)
        with _held_lock:
            _held_fds.discard(fd)
        os.close(fd)  # last close of the open file description: the kernel unlocks


def holder(lock_file: Path, settle_s: float = 0.3) -> tuple[int, float] | None:
    """(pid, start_time) of the verified lock holder, or None when nobody verifiable holds it.

    Takes a SHARED lock for an instant on its own descriptor (shared, so concurrent probes
    never trip each other; it still conflicts with the holder's exclusive lock) and releases
    it at once. If the lock is held but the label does not verify yet (a holder that has
    just acquired and not written its label), it looks again for up to `settle_s`.
    """
    lock_file = Path(lock_file)
    try:
        fd = os.open(lock_file, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # never locked (the first holder creates it), or unreadable: nobody
        return None
    try:
        deadline = time.monotonic() + settle_s
        while True:
            if _try_flock(fd, fcntl.LOCK_SH):
                fcntl.flock(fd, fcntl.LOCK_UN)
                return None
            label = read_label(lock_file)
            if label is not None and is_same_process(*label):
                return label
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)
    finally:
        os.close(fd)


def is_locked(lock_file: Path) -> bool:
    """True while anyone holds the lock, named or not (e.g. a process in another container)."""
    try:
        fd = os.open(lock_file, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if _try_flock(fd, fcntl.LOCK_SH):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        return True
    finally:
        os.close(fd)


def probe_file(lock_file: Path, settle_s: float = 0.3) -> int | None:
    """The verified pid holding `lock_file`, or None (see `holder`)."""
    found = holder(Path(lock_file), settle_s)
    return found[0] if found else None
