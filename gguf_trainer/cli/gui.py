"""The GUI from the command line: bare `gguf-trainer` serves it (the server's own flags,
--port, --host, --no-browser…, are ui.launch's), and `--auto-resume` first relaunches the
last project's interrupted run, then opens the GUI on it."""

from __future__ import annotations

from gguf_trainer.cli.common import out
from gguf_trainer.runner import supervisor
from gguf_trainer.ui import launch as gui_launch  # light: gradio loads only when served


def add_arguments(parser) -> None:
    """The top-level flags for the GUI (no subcommand)."""
    parser.add_argument("--auto-resume", action="store_true",
                        help="relaunch the last project if its run was "
                             "interrupted, then open the GUI on it")
    gui_launch.add_arguments(parser)


def auto_resume(args) -> None:
    """--auto-resume (with or without a command): the last project's interrupted run again."""
    if args.auto_resume:
        out(supervisor.auto_resume())


def serve(args) -> int:
    """Bare `gguf-trainer` (and --auto-resume): serve the GUI until it is stopped."""
    return gui_launch.run_from_args(args)
