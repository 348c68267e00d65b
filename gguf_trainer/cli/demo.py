"""`gguf-trainer demo`: build an offline demo project (gguf_trainer.demo: tiny materials and a
mock teacher) and train it in this terminal, as `run` would."""

from __future__ import annotations

from pathlib import Path

from gguf_trainer.base.exit_codes import EXIT_OK
from gguf_trainer.cli.common import Command, out, pack_list, parse_steps
from gguf_trainer.cli.run import run_in_foreground
from gguf_trainer.runner import control, supervisor


def cmd_demo(args) -> int:
    from gguf_trainer import demo  # lazy
    from gguf_trainer.runner.pipeline import EXIT_OK as PIPELINE_OK

    steps = parse_steps(args.steps)
    if args.dir:  # before anything is written: never inside a folder that is not a project
        control.check_demo_folder(args.dir)
    root = demo.prepare_demo(args.pack, Path(args.dir) if args.dir else None, steps)
    out(f"demo project ready: {root}")
    if args.no_run:
        out(f"run it with: gguf-trainer run --project {root}")
        return EXIT_OK
    paths = supervisor.project_paths(root)
    supervisor.remember_project(paths.root)
    code = run_in_foreground(paths, None, False)
    if code == PIPELINE_OK and control.status(paths.root)["status"] == "done":
        out(control.results_text(paths.root))
    return code


def _demo_args(p) -> None:
    p.add_argument(
        "--pack", metavar="ID", help=f"trainer pack: {pack_list()} (default: t5xxl_pixart)"
    )
    p.add_argument("--dir", metavar="DIR", help="where to create it")
    p.add_argument("--steps", metavar="N")
    p.add_argument("--no-run", action="store_true", help="only prepare the project")


COMMANDS = (
    Command("demo", cmd_demo, "build an offline demo project and train it", _demo_args,
            project=False),
)
