"""The commands about what a project made: `snapshot` (a GGUF of the adapter as it is now),
`verify` (re-read shards and checkpoints), `render` (the teacher and the adapter in the
user's ggk), `inspect` (describe an adapter GGUF), `check` (an adapter against the engine's
SD_DUMP_COND dump). Each loads its heavy part lazily, inside the handler."""

from __future__ import annotations

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.exit_codes import EXIT_OK
from gguf_trainer.base.exit_codes import EXIT_USER as EXIT_ERROR
from gguf_trainer.cli.common import Command, out
from gguf_trainer.runner import control, supervisor


def cmd_snapshot(args) -> int:
    from gguf_trainer.runner.snapshot import describe

    paths = supervisor.project_paths(args.project)
    if args.checkpoint == "list":
        for line in kept_lines(control.list_kept_steps(paths.root), paths.root):
            out(line)
        return EXIT_OK
    checkpoint = args.checkpoint if args.step is None else f"step{args.step}"
    job = control.request_snapshot(paths.root, checkpoint, args.eval, not args.no_fresh,
                                   args.device)
    if args.detach:
        out(f"snapshot job started (pid {job.get('pid')}); its state: gguf-trainer status "
            f"--project {paths.root} (jobs.snapshot), its log: {job['log']}")
        return EXIT_OK
    job = control.wait_snapshot(paths.root)
    if job["status"] == "done" and isinstance(job.get("result"), dict):
        out(describe(job["result"]))
        return EXIT_OK
    raise UserError(job.get("error") or f"the snapshot job ended {job['status']}; see {job['log']}")


def kept_lines(kept: dict, project: object = "DIR") -> list[str]:
    """`snapshot --checkpoint list`: one line per kept step (step, val cos, MB, path), then
    the total on disk."""
    items = kept["items"]
    if not items:
        return [f"no kept steps; {kept['schedule']}"]
    lines = [f"{'step':>9}  {'val cos':>8}  {'MB':>9}  path"]
    for it in items:
        cos = it.get("val_cos")
        cos = f"{cos:.4f}" if isinstance(cos, int | float) else "-"
        lines.append(f"{it['step']:>9}  {cos:>8}  {it['size'] / 1e6:>9.1f}  {it['path']}")
    lines.append(f"{len(items)} kept step(s), {kept['total'] / 1e6:.1f} MB on disk; export one "
                 f"with `gguf-trainer snapshot --project {project} --step N`")
    return lines


def cmd_verify(args) -> int:
    from gguf_trainer.runner import verify  # lazy: reads every shard and checkpoint (torch)

    paths = supervisor.project_paths(args.project)
    report = verify.verify_project(paths.root, args.repair)
    for line in verify.describe(report, paths.root):
        out(line)
    return EXIT_OK if report["ok"] else EXIT_ERROR


def cmd_render(args) -> int:
    from gguf_trainer.runner import jobs, render_job  # torch-free; the job process runs ggk

    paths = supervisor.project_paths(args.project)
    if args.ggk is not None or args.models is not None or args.file:
        _remember_render_settings(args.ggk, args.models, args.file)
    seed = _parse_seed(args.seed)
    st = render_job.start_render(paths.root, args.prompt, seed)
    out(f"render started (pid {st['pid']}); each result goes to {paths.root / 'renders'}")
    if not args.wait:
        return EXIT_OK
    st = jobs.wait(paths.root, render_job.JOB_NAME)
    if st["status"] != "done":
        raise UserError(f"the render {st['status']}: {st.get('error') or 'see render.log'}")
    for line in render_job.describe(st["result"]):
        out(line)
    return EXIT_OK


def _remember_render_settings(ggk, models, files) -> None:
    """`render --ggk/--models/--file`: remembered in the user's settings (they serve every
    project, as the GUI's); print what is set now."""
    from gguf_trainer.runner import render_job

    given = render_job.parse_files(files) if files else None
    conf = render_job.save_render_settings(ggk, models, given)
    out(f"ggk: {conf['ggk'] or '(on PATH)'}; model files: {conf['models'] or '(not set)'}")
    for k in given or {}:
        out(f"{k}: {conf['files'].get(k) or '(not set)'}")


def _parse_seed(text) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise UserError(f"--seed must be a whole number, not {text!r}") from None


def cmd_inspect(args) -> int:
    from gguf_trainer.model.adapter_report import inspect_main  # lazy: reads GGUF

    return inspect_main(args.file, args.json)


def cmd_check(args) -> int:
    from gguf_trainer.check import check_main  # lazy: runs the student and the adapter

    return check_main(args.adapter, args.student, args.dump, args.prompt, args.tokenizer, args.json,
                      t5_model=args.t5_model, project=args.project)


# ---- the subcommands --------------------------------------------------------------------
def _snapshot_args(p) -> None:
    p.add_argument("--checkpoint", default="last", metavar="C",
                   help="last, best, a kept step step<N>, or list (the kept steps)")
    p.add_argument("--step", type=int, metavar="N",
                   help="export kept step N (train.history); the same as --checkpoint stepN")
    p.add_argument("--eval", action="store_true", help="also evaluate it on the val shards")
    p.add_argument(
        "--no-fresh",
        action="store_true",
        help="use the checkpoint on disk instead of asking the trainer to save",
    )
    p.add_argument(
        "--device", metavar="D", help="device for the eval (default: cpu while training)"
    )
    p.add_argument(
        "--detach",
        action="store_true",
        help="return at once; the job's state shows in `status` (jobs.snapshot)",
    )


def _verify_args(p) -> None:
    p.add_argument("--repair", action="store_true", help="recompute just the damaged shards")


def _render_args(p) -> None:
    p.add_argument("--prompt", required=True, metavar="P", help="the prompt both runs render")
    p.add_argument("--seed", default="42", metavar="S", help="the seed of both runs (default 42)")
    p.add_argument("--ggk", metavar="PATH", help="the ggk command, if not on PATH (remembered)")
    p.add_argument("--models", metavar="DIR", help="the folder with ggk's model files (remembered)")
    p.add_argument("--file", action="append", metavar='"<placeholder>=PATH"', help="your file "
                   "for a <placeholder> of the pack's ggk command (repeatable; remembered)")
    p.add_argument("--wait", action="store_true", help="wait for the images and print the result")


def _inspect_args(p) -> None:
    p.add_argument("file", metavar="FILE")
    p.add_argument("--json", action="store_true")


def _check_args(p) -> None:
    p.add_argument(
        "--adapter", metavar="A", help="the exported adapter GGUF (default: the project's export)"
    )
    p.add_argument(
        "--student", metavar="S",
        help="the pig_clip GGUF the engine ran (default: the project's linked student)",
    )
    p.add_argument(
        "--dump", required=True, metavar="DIR", help="the SD_DUMP_COND folder (or a .bin in it)"
    )
    p.add_argument("--prompt", required=True, metavar="P", help="the exact prompt the engine ran")
    p.add_argument(
        "--tokenizer", metavar="DIR",
        help="the student tokenizer folder (default: the project's linked one, else Qwen BPE)",
    )
    p.add_argument(
        "--t5-model",
        metavar="FILE",
        help="PixArt: the T5 teacher's spiece.model, to check t5_ids.txt is this prompt's",
    )
    p.add_argument(
        "--project",
        metavar="DIR",
        help="the adapter's project: its export, linked student and tokenizer stand in for "
        "--adapter, --student, --tokenizer; its linked teacher's tokenizer checks t5_ids.txt",
    )
    p.add_argument("--json", action="store_true")


COMMANDS = (
    Command("snapshot", cmd_snapshot, "export a GGUF of the adapter as it is now",
            _snapshot_args),
    Command("verify", cmd_verify, "re-read every shard and checkpoint and report damage",
            _verify_args),
    Command("render", cmd_render, "render a prompt with the teacher and the adapter in your ggk",
            _render_args),
    Command("inspect", cmd_inspect, "describe an adapter GGUF file", _inspect_args,
            project=False),
    Command("check", cmd_check, "compare an adapter with the engine's SD_DUMP_COND dump",
            _check_args, project=False),
)
