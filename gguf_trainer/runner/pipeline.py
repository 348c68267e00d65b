"""The pipeline process shell: lock, state, signals, logging and exit codes around the stages.

Owns the life of one pipeline run, detached (`main`, started by supervisor.start) or in
the foreground (`run_foreground`, used by `gguf-trainer run`). The stage logic itself is
`gguf_trainer.runner.stages.run_stages`; this module only frames it. Must not: os.fork
(torch threads; the flock would be shared), print (except the one refusal sentence), or
let a UserError end as a traceback.

Usage:
    python -m gguf_trainer.runner.pipeline --project DIR [--only STAGE ...] [--force]

Exit codes (gguf_trainer.base.exit_codes, the same protocol as the CLI): 0 done or stopped on
request; 1 user error or the project is already locked by another pipeline (the sentence is
in state.json "error" and in the log); 2 no such project; 4 internal error (traceback in
pipeline.log).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator

from gguf_trainer.base import atomic, locks, project_file
from gguf_trainer.base.errors import UserError, as_user_error
from gguf_trainer.base.exit_codes import EXIT_INTERNAL, EXIT_NO_PROJECT, EXIT_OK, EXIT_USER
from gguf_trainer.base.jsonvals import jsonable
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import lock, processes
from gguf_trainer.runner.state import Report, StateWriter
from gguf_trainer.stages.stage_list import SHARD_STAGES, STAGES

log = logging.getLogger("gguf_trainer.pipeline")

MAX_SHARD_REPAIRS = 3  # shards found corrupted while training, recomputed within one run
StageRunner = Callable[[ProjectPaths, Report, "list[str] | None", bool], str]


def _default_run(paths: ProjectPaths, report: Report, only: list[str] | None, force: bool) -> str:
    """The real stages: load + validate the project, record the mock flag, run them."""
    from gguf_trainer.store.project import load_project  # lazy: keeps the shell import-light

    project = load_project(paths.root)
    report.fields(mock=bool(project.settings.precompute.mock_teacher))
    from gguf_trainer.data.shards import ShardCorrupted
    from gguf_trainer.runner.stages import run_stages  # lazy: imports torch

    for _ in range(MAX_SHARD_REPAIRS):
        try:
            return run_stages(paths, report, only, force)
        except ShardCorrupted as e:
            # Without the shard, running the stages again recomputes it (precompute) and
            # resumes training from last.pt.
            log.warning("shard %s is %s: recomputing it, then resuming", e.path.name, e.reason)
            e.discard(paths.root)
            if only:
                only = [s for s in STAGES if s in only or s in SHARD_STAGES]
    return run_stages(paths, report, only, force)  # corrupt again: a failing disk, say so


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gguf_trainer.runner.pipeline",
                                     description="Run the pipeline of one project (detached use).")
    parser.add_argument("--project", required=True, help="the project folder")
    parser.add_argument("--only", nargs="+", choices=STAGES, metavar="STAGE",
                        help=f"run only these stages ({', '.join(STAGES)})")
    parser.add_argument("--force", action="store_true", help="redo export/eval even if done")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, run: StageRunner | None = None) -> int:
    """Entry point of the detached pipeline. `run` replaces the real stages (tests)."""
    args = parse_args(argv)
    paths = ProjectPaths(args.project)
    if not paths.exists():
        print(f"{paths.root} is not a gguf-trainer project (no project.json)", file=sys.stderr)
        return EXIT_NO_PROJECT
    if int(os.environ.get("RANK", "0") or 0) > 0:  # a launched run's other ranks: no lock
        from gguf_trainer.runner import follower

        return follower.main(paths)
    try:
        with _disk_errors_as_sentences(paths), _log_to_file(paths):
            try:
                with lock.hold(paths):
                    return _run_locked(paths, args.only, args.force, run or _default_run)
            except locks.LockHeld as e:
                print(str(e), file=sys.stderr)
                return EXIT_USER
    except UserError as e:  # the project folder refused the log or the lock (read-only, full)
        print(str(e), file=sys.stderr)
        return EXIT_USER


def run_foreground(paths: ProjectPaths, only: list[str] | None = None, force: bool = False,
                   progress_cb: Callable[[str, dict], None] | None = None,
                   run: StageRunner | None = None) -> int:
    """The same run in this process (`gguf-trainer run`): same lock, same state.json.

    `progress_cb(stage_name, stage_dict)` is called in this thread on every stage change.
    Raises LockHeld ("already running (pid N)") if a pipeline holds the project. The first
    Ctrl-C stops gracefully after the current unit; a second one raises KeyboardInterrupt.
    Returns the exit code the detached pipeline would have.
    """
    with _disk_errors_as_sentences(paths), _log_to_file(paths), lock.hold(paths):
        return _run_locked(paths, only, force, run or _default_run, progress_cb, foreground=True)


@contextlib.contextmanager
def _disk_errors_as_sentences(paths: ProjectPaths) -> Iterator[None]:
    """An OSError the file system caused before or around the stages (no room or no write
    access for pipeline.log, the lock, stop.request) leaves as a DiskError sentence."""
    try:
        yield
    except OSError as e:
        user = as_user_error(e, fallback=paths.root)
        if user is None or user is e:
            raise
        raise user from e


def _run_locked(paths: ProjectPaths, only: list[str] | None, force: bool, run: StageRunner,
                progress_cb: Callable[[str, dict], None] | None = None,
                foreground: bool = False) -> int:
    planned = [s for s in STAGES if not only or s in only]
    writer = StateWriter(paths, list(getattr(sys, "orig_argv", sys.argv)), stages=planned)
    report = Report(writer, log, on_change=progress_cb)
    _clear_stale_stop_request(paths, writer.snapshot()["pid_start_time"])
    log.info("pipeline pid %d started on %s (only=%s, force=%s)", os.getpid(), paths.root,
             only or "all", force)
    writer.start()
    from gguf_trainer.runner import ranks

    watch = ranks.start_lead(paths, writer)  # launched (accelerate): greet, watch ranks
    with _signals_set_stop(report, foreground):
        code = _run_stages_recorded(paths, report, writer, only, force, run)
    if watch is not None:
        watch.stop()
    log.info("pipeline exits with code %d (%s)", code, writer.snapshot()["status"])
    return code


def _run_stages_recorded(paths: ProjectPaths, report: Report, writer: StateWriter,
                         only: list[str] | None, force: bool, run: StageRunner) -> int:
    """Run the stages; every way out ends in one final state.json record and an exit code."""
    try:
        outcome = run(paths, report, only, force)
    except KeyboardInterrupt:
        log.warning("aborted by a second Ctrl-C; the run resumes from its last checkpoint")
        _close(paths, writer, "stopped", "aborted by Ctrl-C", 130)
        raise
    except Exception as e:  # the edge of the process: a sentence for the user, or a bug
        # a UserError, or an OSError the disk caused (full, read-only): the user's to fix
        user = as_user_error(e, fallback=paths.root)
        if user is not None:
            log.error("%s", user)
            log.debug("where it was raised", exc_info=True)
            _close(paths, writer, "failed", str(user), EXIT_USER)
            return EXIT_USER
        log.exception("pipeline failed")
        _close(paths, writer, "failed", f"internal error ({type(e).__name__}: {e}); the "
               f"traceback is in {paths.pipeline_log}", EXIT_INTERNAL)
        return EXIT_INTERNAL
    finally:
        report.close_metrics()
        with contextlib.suppress(FileNotFoundError):  # consumed (or never there)
            paths.stop_request.unlink()
    if outcome not in ("done", "stopped"):
        error = (f"internal error (the stages returned {outcome!r}); see {paths.pipeline_log}")
        log.error("%s", error)
        _close(paths, writer, "failed", error, EXIT_INTERNAL)
        return EXIT_INTERNAL
    _close(paths, writer, outcome, None, EXIT_OK)
    return EXIT_OK


def _close(paths: ProjectPaths, writer: StateWriter, status: str, error: str | None,
           code: int) -> None:
    """The final state.json record, even on a full disk: an ended run must never stay
    "running" there. The atomic write needs a new file; when the disk has no room for one,
    the record overwrites the old state.json through its own blocks (atomic.rewrite_in_place)."""
    writer.close(status, error, code)
    try:
        on_disk = atomic.read_json(paths.state_json, {}) or {}
    except (UserError, ValueError):  # torn or unreadable: rewrite it below
        on_disk = {}
    if isinstance(on_disk, dict) and on_disk.get("status") == status:
        return
    data = (json.dumps(jsonable(writer.snapshot()), indent=2, sort_keys=True) + "\n").encode()
    if atomic.rewrite_in_place(paths.state_json, data):
        log.warning("state.json was rewritten in place (no room for a new file)")
    else:
        log.error("could not record the end of the run in %s; status derives it from the lock",
                  paths.state_json)


def _clear_stale_stop_request(paths: ProjectPaths, started: float | None) -> None:
    """Drop a stop.request older than this process; a newer one was meant for this run."""
    try:
        mtime = paths.stop_request.stat().st_mtime
    except FileNotFoundError:
        return
    if started is None or mtime < started:
        with contextlib.suppress(FileNotFoundError):  # a concurrent client removed it
            paths.stop_request.unlink()
        log.info("removed a stale %s", paths.stop_request.name)
    else:
        log.info("a stop was requested while the pipeline was starting")


@contextlib.contextmanager
def _signals_set_stop(report: Report, foreground: bool) -> Iterator[None]:
    """SIGTERM/SIGINT/SIGHUP only set the stop flag (checked at unit boundaries).

    In the foreground a second SIGINT raises KeyboardInterrupt (abort now).
    """
    def handler(signum, _frame):
        if foreground and signum == signal.SIGINT and report.stop_signalled():
            raise KeyboardInterrupt
        report.request_stop()
        if foreground and signum == signal.SIGINT:
            # async-signal-safe write; the CLI owns the terminal
            os.write(2, b"\nstopping after the current step (Ctrl-C again to abort)\n")

    old = {sig: signal.signal(sig, handler)
           for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, prev in old.items():
            signal.signal(sig, prev)
        if report.stop_signalled():
            log.info("stop requested by a signal")


class _QuietFileHandler(logging.FileHandler):
    """A log line that the disk refuses (full, read-only) is dropped: logging's default
    prints a traceback on stderr, which is the user's terminal under `gguf-trainer run`."""

    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handleError(record)


@contextlib.contextmanager
def _log_to_file(paths: ProjectPaths) -> Iterator[None]:
    """Timestamped log lines to pipeline.log for the life of the run (root logger)."""
    project_file.open_append(paths.root, paths.pipeline_log).close()  # a link there: refused
    handler = _QuietFileHandler(paths.pipeline_log, encoding="utf-8")
    handler.setFormatter(logging.Formatter(processes.LOG_FORMAT))
    root = logging.getLogger()
    old_level = root.level
    if root.level == logging.NOTSET or root.level > logging.INFO:
        root.setLevel(logging.INFO)
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        handler.close()


if __name__ == "__main__":
    sys.exit(main())
