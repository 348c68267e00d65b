"""The project folder's commands: `new` (create one for a pack), `set` (show or change its
settings, also while it runs), `reset` (delete a stage's outputs so it runs again)."""

from __future__ import annotations

import json

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.exit_codes import EXIT_OK
from gguf_trainer.cli.common import Command, out, pack_list, parse_steps
from gguf_trainer.runner import control, supervisor
from gguf_trainer.runner.reset import TARGETS as RESET_TARGETS


def cmd_new(args) -> int:
    view = control.new_project(args.dir, args.pack, args.name)
    out(f"project created: {view.root} (pack {args.pack}, name {view.settings['name']})")
    out("next: " + ", ".join(_next_steps(view.root)) + f", then: gguf-trainer run --project "
        f"{view.root}")
    return EXIT_OK


def _next_steps(root) -> list[str]:
    """What a new project needs before `run`: `link` for the student and for each wanted
    material no repo holds (its hint names the folder), `download` for the rest."""
    steps = [f"gguf-trainer link --project {root} student /path/to/pig_clip-f16.gguf"]
    rows = [r for r in control.material_statuses(root) if r["wanted"] and r["id"] != "student"]
    for r in rows:
        if r["kind"] == "hf_snapshot" and not r["repo"]:
            steps.append(f"gguf-trainer link --project {root} {r['id']} /path/to/its/folder")
    if any(r["kind"] == "hf_snapshot" and r["repo"] for r in rows):
        steps.append(f"gguf-trainer download --project {root} (the pack's other materials)")
    return steps


def cmd_set(args) -> int:
    paths = supervisor.project_paths(args.project)
    changes = _assignments(args.assign)  # decoded before anything is written
    steps = parse_steps(args.steps)
    if steps is None and not changes:  # no KEY: every setting, as `set` would take it
        for key, value in _dotted(control.read_settings(paths.root).values):
            out(f"{key} = {json.dumps(value)}")
        return EXIT_OK
    if changes:
        res = control.update_settings(paths.root, changes, None)
        if res.errors or res.refused:
            raise UserError(res.message().replace("\n", "; "))
        for key, value in res.applied.items():
            out(f"{key} = {json.dumps(value)}")
        if not res.applied:
            out("nothing changed (the values were already set)")
    if steps is not None:
        out(control.set_steps(paths.root, steps).message)
    return EXIT_OK


def _dotted(values: dict, prefix: str = "") -> list[tuple[str, object]]:
    """Nested settings -> [(dotted key, value)], the keys `set KEY=VALUE` takes."""
    found = []
    for key, value in values.items():
        if isinstance(value, dict) and value:
            found += _dotted(value, f"{prefix}{key}.")
        else:
            found.append((prefix + key, value))
    return found


def _assignments(items: list[str] | None) -> dict:
    """KEY=VALUE words -> {key: value}; a VALUE that is JSON (40, 1e-4, true, ["a.txt"]) is
    that value (integers exactly), anything else is text (a path)."""
    found = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"{item!r} is not KEY=VALUE; write e.g. train.lr=1e-4 or "
                            "materials.student.path=/models/pig_clip-f16.gguf")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        found[key.strip()] = value
    return found


def cmd_reset(args) -> int:
    paths = supervisor.project_paths(args.project)
    if args.dry_run:
        plan = control.reset_plan(paths.root, args.target)
        out(f"reset {args.target} would delete {len(plan.delete)} path(s)"
            + "".join(f"\n  {p}" for p in plan.delete)
            + "".join(f"\n  keep {k['path']}: {k['reason']}" for k in plan.keep)
            + (f"\nnow refused: {plan.blocked}" if plan.blocked else ""))
        return EXIT_OK
    done = control.reset(paths.root, args.target)
    out(f"reset {args.target}: removed {len(done.deleted)} path(s)"
        + "".join(f"\n  {p}" for p in done.deleted)
        + "".join(f"\n  kept {k['path']}: {k['reason']}" for k in done.kept))
    return EXIT_OK


# ---- the subcommands --------------------------------------------------------------------
def _new_args(p) -> None:
    p.add_argument("--pack", required=True, metavar="ID", help=f"trainer pack: {pack_list()}")
    p.add_argument(
        "--name", metavar="N", help="the GGUF's name (default: the pack's, e.g. pig_t5_adapter)"
    )
    p.add_argument("dir", metavar="DIR", help="the new project's folder")


def _set_args(p) -> None:
    p.add_argument("--steps", metavar="N", help="planned training steps (12000, 12_000, 40k)")
    p.add_argument(
        "assign",
        nargs="*",
        metavar="KEY=VALUE",
        help="any setting, e.g. train.lr=1e-4 materials.student.path=/m/pig_clip-f16.gguf"
        " (the README's settings table lists them)",
    )


def _reset_args(p) -> None:
    p.add_argument("target", choices=RESET_TARGETS)
    p.add_argument("--dry-run", action="store_true", help="only list what would be deleted")


COMMANDS = (
    Command("new", cmd_new, "create a project folder for a pack", _new_args, project=False),
    Command("set", cmd_set, "show or change settings, also while running", _set_args),
    Command("reset", cmd_reset, "delete a stage's outputs so it runs again", _reset_args),
)
