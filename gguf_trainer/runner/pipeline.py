"""The pipeline process shell: lock, state, signals, logging and exit codes around the stages.

Owns the life of one pipeline run, detached (`main`, started by supervisor.start) or in
the foreground (`run_foreground`, used by `gguf-trainer run`). The stage logic itself is
`gguf_trainer.runner.stages.run_stages`; this module only frames it. Must not: os.fork
(torch threads; the flock would be shared), print (except the one refusal sentence), or
let a UserError end as a traceback.

Usage:
    python -m gguf_trainer.runner.pipeline --project DIR [--only STAGE ...] [--force]

Exit codes: 0 done or stopped on request; 1 internal error (traceback in pipeline.log), or
the project is already locked by another pipeline; 2 user error (the sentence is in
state.json "error" and in the log).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator

from gguf_trainer.errors import UserError
from gguf_trainer.paths import ProjectPaths
from gguf_trainer.runner import lock
from gguf_trainer.runner.state import STAGES, Report, StateWriter

log = logging.getLogger("gguf_trainer.pipeline")

EXIT_OK, EXIT_INTERNAL, EXIT_USER = 0, 1, 2
LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
StageRunner = Callable[[ProjectPaths, Report, "list[str] | None", bool], str]


def _default_run(paths: ProjectPaths, report: Report, only: list[str] | None, force: bool) -> str:
    """The real stages: load + validate the project, record the mock flag, run them."""
    from gguf_trainer.project import load_project  # lazy: keeps the shell import-light

    project = load_project(paths.root)
    report.fields(mock=bool(project.settings.precompute.mock_teacher))
    from gguf_trainer.runner.stages import run_stages  # lazy: imports torch

    return run_stages(paths, report, only, force)


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
        return EXIT_USER
    with _log_to_file(paths):
        try:
            with lock.hold(paths):
                return _run_locked(paths, args.only, args.force, run or _default_run)
        except lock.LockHeld as e:
            print(str(e), file=sys.stderr)
            return EXIT_INTERNAL


def run_foreground(paths: ProjectPaths, only: list[str] | None = None, force: bool = False,
                   progress_cb: Callable[[str, dict], None] | None = None,
                   run: StageRunner | None = None) -> int:
    """The same run in this process (`gguf-trainer run`): same lock, same state.json.

    `progress_cb(stage_name, stage_dict)` is called in this thread on every stage change.
    Raises LockHeld ("already running (pid N)") if a pipeline holds the project. The first
    Ctrl-C stops gracefully after the current unit; a second one raises KeyboardInterrupt.
    Returns the exit code the detached pipeline would have.
    """
    with _log_to_file(paths), lock.hold(paths):
        return _run_locked(paths, only, force, run or _default_run, progress_cb, foreground=True)


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
    with _signals_set_stop(report, foreground):
        code = _run_stages_recorded(paths, report, writer, only, force, run)
    log.info("pipeline exits with code %d (%s)", code, writer.snapshot()["status"])
    return code


def _run_stages_recorded(paths: ProjectPaths, report: Report, writer: StateWriter,
                         only: list[str] | None, force: bool, run: StageRunner) -> int:
    """Run the stages; every way out ends in one final state.json record and an exit code."""
    try:
        outcome = run(paths, report, only, force)
    except UserError as e:
        log.error("%s", e)
        writer.close("failed", str(e), EXIT_USER)
        return EXIT_USER
    except KeyboardInterrupt:
        log.warning("aborted by a second Ctrl-C; the run resumes from its last checkpoint")
        writer.close("stopped", "aborted by Ctrl-C", 130)
        raise
    except Exception as e:  # the edge of the process: record it, traceback to the log
        log.exception("pipeline failed")
        writer.close("failed", f"{type(e).__name__}: {e} — see pipeline.log", EXIT_INTERNAL)
        return EXIT_INTERNAL
    finally:
        report.close_metrics()
        with contextlib.suppress(FileNotFoundError):  # consumed (or never there)
            paths.stop_request.unlink()
    if outcome not in ("done", "stopped"):
        error = f"the stages returned {outcome!r} instead of 'done' or 'stopped' — see pipeline.log"
        log.error("%s", error)
        writer.close("failed", error, EXIT_INTERNAL)
        return EXIT_INTERNAL
    writer.close(outcome, None, EXIT_OK)
    return EXIT_OK


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


@contextlib.contextmanager
def _log_to_file(paths: ProjectPaths) -> Iterator[None]:
    """Timestamped log lines to pipeline.log for the life of the run (root logger)."""
    handler = logging.FileHandler(paths.pipeline_log, encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
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
