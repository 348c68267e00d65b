"""The per-project exclusive lock: exactly one pipeline (detached or foreground) per project.

Owns `<project>/pipeline.lock` (ProjectPaths.lock), a lock file held with flock (see
locks.py for how, and why it needs no cleanup after kill -9). Must not: delete or replace
that file, signal anything, or write state.json.

Usage:
    with lock.hold(paths) as pid:   # raises locks.LockHeld("already running (pid N)")
        ...                          # the whole pipeline run
    lock.probe(paths)               # -> verified holder pid, or None
"""

from __future__ import annotations

import contextlib

from gguf_trainer.base import locks
from gguf_trainer.base.paths import ProjectPaths


def hold(paths: ProjectPaths, retry_s: float = 1.0,
         retry_interval_s: float = 0.05) -> contextlib.AbstractContextManager[int]:
    """Hold the project (pipeline) lock for the body; yields our pid.

    Raises LockHeld("already running (pid N)") if another process has it. Retries for
    `retry_s` first, because a client's probe may own the lock for an instant.
    """
    return locks.hold_file(paths.lock, "already running", retry_s, retry_interval_s)


def holder(paths: ProjectPaths, settle_s: float = 0.3) -> tuple[int, float] | None:
    """(pid, start_time) of the verified pipeline, or None (see locks.holder)."""
    return locks.holder(paths.lock, settle_s)


def probe(paths: ProjectPaths, settle_s: float = 0.3) -> int | None:
    """The verified pid of the pipeline holding the project lock, or None."""
    found = holder(paths, settle_s)
    return found[0] if found else None


def is_locked(paths: ProjectPaths) -> bool:
    """True while anyone holds the pipeline lock, named or not (e.g. a process in another
    container)."""
    return locks.is_locked(paths.lock)
