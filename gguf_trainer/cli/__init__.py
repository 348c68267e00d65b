"""`gguf-trainer`: every subcommand; each handler only wraps a control function
(runner.control, the same functions the GUI calls) and prints its answer.

This package builds the parser and maps errors to exit codes (`main`, the console script);
each command group is a module declaring its own subcommands (common.Command): project (new,
set, reset), run (run, start, stop, kill, status), materials (download, materials, login,
link), outputs (snapshot, verify, render, inspect, check), demo; gui adds the top-level GUI
flags (bare `gguf-trainer`, --auto-resume); common holds what they share.

Owns the terminal: argument parsing, progress bars, the lines each command prints, and the
mapping of errors to exit codes. Must not: decide anything itself (no business rule in
argument parsing), import torch/transformers/datasets/gguf at module level (`--help`,
`status`, `stop`, `set`, `kill`, `snapshot` stay light), run torch work except in the
foreground `run`/`demo`, or show a traceback for anything a user caused.

Usage:
    gguf-trainer new    --pack ID DIR [--name N]
    gguf-trainer run    --project DIR [--only STAGE ...] [--force] [--steps N]
    gguf-trainer start  --project DIR [--only STAGE ...] [--force] [--steps N]
    gguf-trainer stop   --project DIR [--timeout S]
    gguf-trainer kill   --project DIR
    gguf-trainer status --project DIR [--json]
    gguf-trainer set    --project DIR [--steps N] [KEY=VALUE ...]   (no KEY: every setting)
    gguf-trainer snapshot --project DIR [--checkpoint last|best] [--eval] [--no-fresh]
                          [--device D] [--detach]
    gguf-trainer reset  --project DIR corpus|shards|train|output [--dry-run]
    gguf-trainer download --project DIR [--id ID ...] [--required-only]
    gguf-trainer materials --project DIR [--online] [--link-found] [--json]
    gguf-trainer link   --project DIR ID PATH
    gguf-trainer login  (the Hugging Face token, read without echo or from stdin)
    gguf-trainer verify --project DIR [--repair]
    gguf-trainer render --project DIR --prompt P [--seed S] [--ggk PATH] [--models DIR]
                        [--file "<placeholder>=PATH" ...] [--wait]
    gguf-trainer inspect FILE [--json]
    gguf-trainer check  --dump DIR --prompt P [--project DIR] [--adapter A] [--student S]
                        [--tokenizer DIR] [--t5-model F] [--json]   (no --project: A and S)
    gguf-trainer publish --project DIR --repo USER/NAME [--private] [--file GGUF ...]
                         [--license ID]
    gguf-trainer demo   [--pack ID] [--dir DIR] [--steps N] [--no-run]
    gguf-trainer --auto-resume | --version | --help

Exit codes: gguf_trainer.base.exit_codes (0 ok, 1 user error, 2 no such project, 3 stop still
finishing, 4 internal error, 130 interrupted). `status` exits 1 when project.json is broken.
"""
from __future__ import annotations

import argparse
import os
import sys

from gguf_trainer import __version__
from gguf_trainer.base.errors import NoProjectError, UserError, as_user_error
from gguf_trainer.base.exit_codes import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_NO_PROJECT,
    EXIT_OK,
    EXIT_STILL_STOPPING,
)
from gguf_trainer.base.exit_codes import EXIT_USER as EXIT_ERROR
from gguf_trainer.cli import demo, gui, materials, outputs, project, publish, run
from gguf_trainer.cli.common import Parser, add_command
from gguf_trainer.runner import supervisor

GROUPS = (project, run, materials, outputs, publish, demo)
# The order `gguf-trainer --help` lists the commands in (every group's, interleaved).
ORDER = ("new", "run", "start", "stop", "kill", "status", "set", "snapshot", "reset", "download",
         "materials", "login", "link", "verify", "render", "inspect", "check", "publish", "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="gguf-trainer",
                    description="Train pig_clip adapters for the ggk engine.")
    parser.add_argument("--version", action="version", version=f"gguf-trainer {__version__}")
    gui.add_arguments(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands = [c for group in GROUPS for c in group.COMMANDS]
    for command in sorted(commands, key=lambda c: ORDER.index(c.name)):
        add_command(sub, command)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # --help/--version (0) or a usage error (1)
        return e.code if isinstance(e.code, int) else EXIT_ERROR
    try:
        gui.auto_resume(args)
        if args.command is None:  # bare `gguf-trainer` (and --auto-resume) open the GUI
            return gui.serve(args)
        return args.func(args)
    except NoProjectError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_NO_PROJECT
    except supervisor.StopTimeout as e:
        print(str(e), file=sys.stderr)
        return EXIT_STILL_STOPPING
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `gguf-trainer status | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as e:  # the file system said no: one sentence naming the path
        user = as_user_error(e, fallback=getattr(args, "project", None))
        if user is None:
            return _internal_error(e)
        print(f"error: {user}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as e:  # noqa: BLE001 - a bug: one line, the traceback on request
        return _internal_error(e)


def _internal_error(e: BaseException) -> int:
    if os.environ.get("GGUF_TRAINER_DEBUG"):
        raise e
    print(
        f"internal error ({type(e).__name__}: {e}); this is a bug in gguf-trainer; rerun "
        "with GGUF_TRAINER_DEBUG=1 for the traceback",
        file=sys.stderr,
    )
    return EXIT_INTERNAL
