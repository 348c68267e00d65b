"""What every command module of `gguf-trainer` shares: the parser class, the one way a line
is printed, the subcommand record and how it is added, and the few arguments and parses
several command groups take (--trust-remote-code, --steps, the pack list).

Light like the rest of the CLI: no torch, no pydantic at import time.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NamedTuple

from gguf_trainer.base.exit_codes import EXIT_USER as EXIT_ERROR
from gguf_trainer.runner import control


class Parser(argparse.ArgumentParser):
    """Usage errors are user errors: exit 1 (2 means "no such project" here)."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def out(text: str) -> None:
    print(text, flush=True)


class Command(NamedTuple):  # not a dataclass: cheaper to define, and `--help` imports it
    """One subcommand as its group module declares it: the name, the handler (it calls one
    control function and prints its answer), the help line (also its description), the
    arguments it adds, and whether it takes the usual `--project DIR`."""

    name: str
    func: Callable[[argparse.Namespace], int]
    help: str
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    project: bool = True


def add_command(sub, command: Command) -> argparse.ArgumentParser:
    """Add `command`'s subparser to the subparsers action `sub`."""
    p = sub.add_parser(command.name, help=command.help, description=command.help)
    if command.project:
        p.add_argument("--project", required=True, metavar="DIR", help="the project folder")
    p.set_defaults(func=command.func)
    if command.arguments is not None:
        command.arguments(p)
    return p


def trust_arg(p) -> None:
    p.add_argument("--trust-remote-code", action="store_true",
                   help="trust the teacher snapshot's own Python code "
                        "(asked once per snapshot)")


def trust_if_asked(args, project_dir) -> None:
    """--trust-remote-code: the user's once-per-snapshot decision (teachers/trust.py)."""
    if getattr(args, "trust_remote_code", False):
        out(control.confirm_trust(project_dir))


def parse_steps(text: str | None) -> int | None:
    if text is None:
        return None
    from gguf_trainer.store.project_schema import parse_steps  # lazy: pydantic

    return parse_steps(text)


def pack_list() -> str:
    from gguf_trainer.packs import pack_ids  # torch-free registry

    return ", ".join(pack_ids())
