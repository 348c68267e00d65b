"""`gguf-trainer publish`: the project's adapter(s) and a model card to a Hugging Face repo, in
one commit (runner/publish.py). Everything it refuses - a mock-teacher or demo-student adapter,
a file the project did not export, no login - it refuses before any request is made; a second
run after an interrupted one sends only what the Hub lacks."""

from __future__ import annotations

from gguf_trainer.base.exit_codes import EXIT_OK
from gguf_trainer.cli.common import Command, out
from gguf_trainer.runner import control, supervisor


def cmd_publish(args) -> int:
    from gguf_trainer.runner.publish import describe

    paths = supervisor.project_paths(args.project)
    result = control.publish(paths.root, args.repo, args.private, args.file or None,
                             args.license)
    for line in describe(result):
        out(line)
    return EXIT_OK


def _publish_args(p) -> None:
    p.add_argument("--repo", required=True, metavar="USER/NAME",
                   help="the Hub model repo (created when missing)")
    p.add_argument("--private", action="store_true",
                   help="create the repo private (an existing repo keeps its visibility)")
    p.add_argument("--file", action="append", metavar="GGUF",
                   help="an exported file to publish, by name or path (repeat for more; "
                        "default: the exported adapter(s) and their companions)")
    p.add_argument("--license", metavar="ID",
                   help="the card's license field (default: the teacher's, else 'other')")


COMMANDS = (
    Command("publish", cmd_publish,
            "upload the exported adapter(s) and a model card to the Hugging Face Hub",
            _publish_args),
)
