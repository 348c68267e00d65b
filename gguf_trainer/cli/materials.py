"""The materials' commands: `download` (fetch what is missing, here with file bars),
`materials` (each one's status), `login` (the Hugging Face token), `link` (a complete copy
the user already has). The work is runner.downloads'; these print its lines."""

from __future__ import annotations

import json
import sys

from gguf_trainer.base.exit_codes import EXIT_OK
from gguf_trainer.base.exit_codes import EXIT_USER as EXIT_ERROR
from gguf_trainer.cli.common import Command, out, trust_arg, trust_if_asked
from gguf_trainer.runner import control


def cmd_download(args) -> int:
    from gguf_trainer.runner import downloads

    bars = downloads.FileBars()
    try:
        failures = downloads.download_foreground(args.project, args.id, args.required_only,
                                                 on_progress=bars, on_line=out)
    finally:
        bars.close()
    if not failures:
        trust_if_asked(args, args.project)
    return EXIT_ERROR if failures else EXIT_OK


def cmd_materials(args) -> int:
    from gguf_trainer.runner import downloads

    if args.link_found:  # with --online a copy made by hand is checked against the Hub
        for line in downloads.link_found_lines(args.project, args.online):
            out(line)
    rows = downloads.material_statuses(args.project, online=args.online)
    out(json.dumps(rows, indent=2) if args.json else downloads.format_statuses(rows))
    return EXIT_OK


def cmd_login(args) -> int:
    """The Hugging Face token for gated or private repos, stored where the GUI's Store token
    puts it; typed without echo, or one line piped in."""
    if sys.stdin.isatty():
        import getpass

        token = getpass.getpass("Hugging Face token (input hidden): ")
    else:
        token = sys.stdin.readline()
    out(control.store_token(token))
    return EXIT_OK


def cmd_link(args) -> int:
    from gguf_trainer.runner import downloads

    row = downloads.link_material(args.project, args.id, args.path)
    out(f"{row['id']}: {row['state']} at {row['path']}")
    return EXIT_OK


# ---- the subcommands --------------------------------------------------------------------
def _download_args(p) -> None:
    p.add_argument(
        "--id", nargs="+", metavar="ID", help="only these materials (default: all wanted)"
    )
    p.add_argument("--required-only", action="store_true", help="skip optional materials")
    trust_arg(p)


def _materials_args(p) -> None:
    p.add_argument("--online", action="store_true", help="check against the Hub's file listing")
    p.add_argument(
        "--link-found", action="store_true", help="first link complete copies found on disk"
    )
    p.add_argument("--json", action="store_true")


def _link_args(p) -> None:
    p.add_argument("id", metavar="ID")
    p.add_argument("path", metavar="PATH")


COMMANDS = (
    Command("download", cmd_download,
            "fetch missing materials here (Ctrl-C keeps a resumable partial)", _download_args),
    Command("materials", cmd_materials, "show each material's status", _materials_args),
    Command("login", cmd_login, "store a Hugging Face token (gated or private repos)",
            project=False),
    Command("link", cmd_link, "use a complete copy you already have for a material", _link_args),
)
