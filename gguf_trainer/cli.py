"""`gguf-trainer`: every subcommand; each handler only wraps a control function
(runner.control, the same functions the GUI calls) and prints its answer.

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
    gguf-trainer demo   [--pack ID] [--dir DIR] [--steps N] [--no-run]
    gguf-trainer --auto-resume | --version | --help

Exit codes: gguf_trainer.exit_codes (0 ok, 1 user error, 2 no such project, 3 stop still
finishing, 4 internal error, 130 interrupted). `status` exits 1 when project.json is broken.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from gguf_trainer import __version__
from gguf_trainer.errors import NoProjectError, UserError, as_user_error
from gguf_trainer.exit_codes import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_NO_PROJECT,
    EXIT_OK,
    EXIT_STILL_STOPPING,
)
from gguf_trainer.exit_codes import EXIT_USER as EXIT_ERROR
from gguf_trainer.runner import control, supervisor
from gguf_trainer.runner.progress import SHOWN_FIELDS, ProgressBars, console_log_handler, short
from gguf_trainer.runner.reset import TARGETS as RESET_TARGETS
from gguf_trainer.runner.status import format_eta
from gguf_trainer.stage_list import STAGES
from gguf_trainer.ui import launch as gui_launch  # light: gradio loads only when served


class _Parser(argparse.ArgumentParser):
    """Usage errors are user errors: exit 1 (2 means "no such project" here)."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def _out(text: str) -> None:
    print(text, flush=True)


# ---- commands -------------------------------------------------------------------------
# Each handler parses nothing and decides nothing: it calls one control function
# (runner.control, shared with the GUI) and prints its answer.
def cmd_new(args) -> int:
    view = control.new_project(args.dir, args.pack, args.name)
    _out(f"project created: {view.root} (pack {args.pack}, name {view.settings['name']})")
    _out(f"next: gguf-trainer link --project {view.root} student /path/to/pig_clip-f16.gguf, "
         f"gguf-trainer download --project {view.root} (the pack's other materials), then: "
         f"gguf-trainer run --project {view.root}")
    return EXIT_OK


def _launch(args):
    from gguf_trainer.runner.launch import Launch

    return Launch(args.processes, args.num_machines, args.machine_rank, args.main_process_ip,
                  args.main_process_port, args.accelerate_config)


def cmd_run(args) -> int:
    paths = supervisor.project_paths(args.project)
    # every argument and the project are checked before anything is written
    plan = control.preflight_run(paths.root, args.only, args.steps, _launch(args))
    for line in plan.linked:  # materials found and linked
        _out(line)
    if plan.launch.is_main_machine:
        _trust_if_asked(args, paths.root)
        if plan.steps is not None:
            _out(control.set_steps(paths.root, plan.steps).message.split(";")[0])
        supervisor.remember_project(paths.root)
    if plan.launch.needed():
        return _run_launched(paths, args, plan.launch)
    code = _run_in_foreground(paths, args.only, args.force)
    if code == EXIT_OK and control.status(paths.root)["status"] == "done":
        _out(control.results_text(paths.root))
    return code


def _run_launched(paths, args, launch) -> int:
    """`run` with several processes or machines: accelerate's launcher in this terminal.
    Machine rank 0 shows the bars (it owns state.json); the others only wait for the end.
    cmd_run made the pre-flight checks and writes (control.preflight_run) first."""
    pipeline_args = ["--project", str(paths.root)] + (["--only", *args.only] if args.only else []) \
        + (["--force"] if args.force else [])
    bars = ProgressBars() if launch.is_main_machine else None
    try:
        rc = supervisor.run_launched(paths, launch, pipeline_args, bars)
    finally:
        if bars is not None:
            bars.close()
    if not launch.is_main_machine:
        _out(f"machine rank {launch.machine_rank}: the ranks here ended (code {rc}); "
             f"machine rank 0 shows the run: gguf-trainer status --project {paths.root}")
        return EXIT_OK if rc == 0 else EXIT_ERROR
    info = supervisor.status(paths.root)
    if info["status"] == "stopped":
        _out(f"stopped; resume with: gguf-trainer run --project {paths.root}")
    elif info["status"] == "done":
        _out(control.results_text(paths.root))
    else:
        print(f"{info['status']}: {info.get('error') or 'see ' + str(paths.pipeline_log)}",
              file=sys.stderr)
    return EXIT_OK if info["status"] in ("done", "stopped") else EXIT_ERROR


def cmd_start(args) -> int:
    paths = supervisor.project_paths(args.project)
    _trust_if_asked(args, paths.root)
    pid = control.start(paths.root, only=args.only, force=args.force,
                        steps=_parse_steps(args.steps), launch=_launch(args))
    res = control.results(paths.root)
    _out(f"pipeline started (pid {pid}), logging to {paths.pipeline_log}; "
         f"follow it with: gguf-trainer status --project {paths.root}")
    _out(f"when it is done: the adapter is {res['planned_gguf']}, the evaluation "
         f"{paths.eval_json}; `gguf-trainer status --project {paths.root}` "
         "then prints the ggk command")
    return EXIT_OK


def cmd_stop(args) -> int:
    outcome = control.stop(args.project, timeout_s=args.timeout)
    if outcome == "not running":
        _out("not running; nothing to stop")
    elif outcome == "stopping":
        _out("stop requested; the pipeline finishes its current step, then exits")
    else:
        _out(f"stopped; resume with: gguf-trainer start --project {Path(args.project)}")
    return EXIT_OK


def cmd_kill(args) -> int:
    outcome = control.kill(args.project)
    if outcome == "not running":
        _out("not running; nothing to kill")
    else:
        _out("killed; the run resumes from its last checkpoint with: "
             f"gguf-trainer start --project {Path(args.project)}")
    return EXIT_OK


def cmd_status(args) -> int:
    info = control.status(args.project)
    if args.json:
        _out(json.dumps(info, indent=2, sort_keys=True, default=str))
    else:
        _out(format_status(info))
        from gguf_trainer.runner.ranks import format_ranks  # torch-free

        for line in format_ranks(info):
            _out(line)
    return EXIT_ERROR if info.get("settings_error") else EXIT_OK


def cmd_set(args) -> int:
    paths = supervisor.project_paths(args.project)
    changes = _assignments(args.assign)  # decoded before anything is written
    steps = _parse_steps(args.steps)
    if steps is None and not changes:  # no KEY: every setting, as `set` would take it
        for key, value in _dotted(control.read_settings(paths.root).values):
            _out(f"{key} = {json.dumps(value)}")
        return EXIT_OK
    if changes:
        res = control.update_settings(paths.root, changes, None)
        if res.errors or res.refused:
            raise UserError(res.message().replace("\n", "; "))
        for key, value in res.applied.items():
            _out(f"{key} = {json.dumps(value)}")
        if not res.applied:
            _out("nothing changed (the values were already set)")
    if steps is not None:
        _out(control.set_steps(paths.root, steps).message)
    return EXIT_OK


def _dotted(values: dict, prefix: str = "") -> list[tuple[str, object]]:
    """Nested settings -> [(dotted key, value)], the keys `set KEY=VALUE` takes."""
    out = []
    for key, value in values.items():
        if isinstance(value, dict) and value:
            out += _dotted(value, f"{prefix}{key}.")
        else:
            out.append((prefix + key, value))
    return out


def _assignments(items: list[str] | None) -> dict:
    """KEY=VALUE words -> {key: value}; a VALUE that is JSON (40, 1e-4, true, ["a.txt"]) is
    that value (integers exactly), anything else is text (a path)."""
    out = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"{item!r} is not KEY=VALUE; write e.g. train.lr=1e-4 or "
                            "materials.student.path=/models/pig_clip-f16.gguf")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        out[key.strip()] = value
    return out


def cmd_snapshot(args) -> int:
    from gguf_trainer.runner.snapshot import describe

    paths = supervisor.project_paths(args.project)
    job = control.request_snapshot(paths.root, args.checkpoint, args.eval, not args.no_fresh,
                                   args.device)
    if args.detach:
        _out(f"snapshot job started (pid {job.get('pid')}); its state: gguf-trainer status "
             f"--project {paths.root} (jobs.snapshot), its log: {job['log']}")
        return EXIT_OK
    job = control.wait_snapshot(paths.root)
    if job["status"] == "done" and isinstance(job.get("result"), dict):
        _out(describe(job["result"]))
        return EXIT_OK
    raise UserError(job.get("error") or f"the snapshot job ended {job['status']}; see {job['log']}")


def cmd_reset(args) -> int:
    paths = supervisor.project_paths(args.project)
    if args.dry_run:
        plan = control.reset_plan(paths.root, args.target)
        _out(f"reset {args.target} would delete {len(plan.delete)} path(s)"
             + "".join(f"\n  {p}" for p in plan.delete)
             + "".join(f"\n  keep {k['path']}: {k['reason']}" for k in plan.keep)
             + (f"\nnow refused: {plan.blocked}" if plan.blocked else ""))
        return EXIT_OK
    done = control.reset(paths.root, args.target)
    _out(f"reset {args.target}: removed {len(done.deleted)} path(s)"
         + "".join(f"\n  {p}" for p in done.deleted)
         + "".join(f"\n  kept {k['path']}: {k['reason']}" for k in done.kept))
    return EXIT_OK


def cmd_download(args) -> int:
    from gguf_trainer.runner import downloads

    bars = downloads.FileBars()
    try:
        failures = downloads.download_foreground(args.project, args.id, args.required_only,
                                                 on_progress=bars, on_line=_out)
    finally:
        bars.close()
    if not failures:
        _trust_if_asked(args, args.project)
    return EXIT_ERROR if failures else EXIT_OK


def _trust_if_asked(args, project_dir) -> None:
    """--trust-remote-code: the user's once-per-snapshot decision (teachers/trust.py)."""
    if getattr(args, "trust_remote_code", False):
        _out(control.confirm_trust(project_dir))


def cmd_materials(args) -> int:
    from gguf_trainer.runner import downloads

    if args.link_found:  # with --online a copy made by hand is checked against the Hub
        for line in downloads.link_found_lines(args.project, args.online):
            _out(line)
    rows = downloads.material_statuses(args.project, online=args.online)
    _out(json.dumps(rows, indent=2) if args.json else downloads.format_statuses(rows))
    return EXIT_OK


def cmd_login(args) -> int:
    """The Hugging Face token for gated or private repos, stored where the GUI's Store token
    puts it; typed without echo, or one line piped in."""
    if sys.stdin.isatty():
        import getpass

        token = getpass.getpass("Hugging Face token (input hidden): ")
    else:
        token = sys.stdin.readline()
    _out(control.store_token(token))
    return EXIT_OK


def cmd_link(args) -> int:
    from gguf_trainer.runner import downloads

    row = downloads.link_material(args.project, args.id, args.path)
    _out(f"{row['id']}: {row['state']} at {row['path']}")
    return EXIT_OK


def cmd_verify(args) -> int:
    from gguf_trainer.runner import verify  # lazy: reads every shard and checkpoint (torch)

    paths = supervisor.project_paths(args.project)
    report = verify.verify_project(paths.root, args.repair)
    for line in verify.describe(report, paths.root):
        _out(line)
    return EXIT_OK if report["ok"] else EXIT_ERROR


def cmd_render(args) -> int:
    from gguf_trainer.runner import jobs, render_job  # torch-free; the job process runs ggk

    paths = supervisor.project_paths(args.project)
    if args.ggk is not None or args.models is not None or args.file:
        for line in render_job.save_cli_settings(args.ggk, args.models, args.file):
            _out(line)
    seed = _parse_seed(args.seed)
    st = render_job.start_render(paths.root, args.prompt, seed)
    _out(f"render started (pid {st['pid']}); each result goes to {paths.root / 'renders'}")
    if not args.wait:
        return EXIT_OK
    st = jobs.wait(paths.root, render_job.JOB_NAME)
    if st["status"] != "done":
        raise UserError(f"the render {st['status']}: {st.get('error') or 'see render.log'}")
    for line in render_job.describe(st["result"]):
        _out(line)
    return EXIT_OK


def _parse_seed(text) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise UserError(f"--seed must be a whole number, not {text!r}") from None


def cmd_inspect(args) -> int:
    from gguf_trainer.adapter_report import inspect_main  # lazy: reads GGUF

    return inspect_main(args.file, args.json)


def cmd_check(args) -> int:
    from gguf_trainer.check import check_main  # lazy: runs the student and the adapter

    return check_main(args.adapter, args.student, args.dump, args.prompt, args.tokenizer, args.json,
                      t5_model=args.t5_model, project=args.project)


def cmd_demo(args) -> int:
    from gguf_trainer import demo  # lazy
    from gguf_trainer.runner.pipeline import EXIT_OK as PIPELINE_OK

    steps = _parse_steps(args.steps)
    if args.dir:  # before anything is written: never inside a folder that is not a project
        control.check_demo_folder(args.dir)
    root = demo.prepare_demo(args.pack, Path(args.dir) if args.dir else None, steps)
    _out(f"demo project ready: {root}")
    if args.no_run:
        _out(f"run it with: gguf-trainer run --project {root}")
        return EXIT_OK
    paths = supervisor.project_paths(root)
    supervisor.remember_project(paths.root)
    code = _run_in_foreground(paths, None, False)
    if code == PIPELINE_OK and control.status(paths.root)["status"] == "done":
        _out(control.results_text(paths.root))
    return code


# ---- helpers --------------------------------------------------------------------------
def _parse_steps(text: str | None) -> int | None:
    if text is None:
        return None
    from gguf_trainer.project_schema import parse_steps  # lazy: pydantic

    return parse_steps(text)


def _run_in_foreground(paths, only, force) -> int:
    from gguf_trainer.runner.pipeline import EXIT_OK as PIPELINE_OK
    from gguf_trainer.runner.pipeline import run_foreground

    bars = ProgressBars()
    console = console_log_handler()
    try:
        code = run_foreground(paths, only, force, bars)
    finally:
        bars.close()
        logging.getLogger().removeHandler(console)
    info = supervisor.status(paths.root)
    if code == PIPELINE_OK and info["status"] == "stopped":
        _out(f"stopped; resume with: gguf-trainer run --project {paths.root}")
    elif code == PIPELINE_OK:
        _out(f"{info['status']}: {paths.root}")
    else:
        print(f"failed: {info.get('error') or 'see ' + str(paths.pipeline_log)}", file=sys.stderr)
    return EXIT_OK if code == PIPELINE_OK else EXIT_ERROR


def format_status(info: dict) -> str:
    """The text `gguf-trainer status` prints: the message, then one line per stage."""
    lines = [f"{info['project']}: {info['message']}"]
    if info["status"] == "interrupted":
        lines[0] += f"; resume with: gguf-trainer start --project {info['project']}"
    stages = info.get("stages") or {}
    order = [s for s in STAGES if s in stages] + [s for s in stages if s not in STAGES]
    for name in order:
        st = stages[name]
        text = f"  {name:<17} {st.get('status')}"
        if st.get("skipped"):
            text += " (already done)"
        if st.get("total") is not None:
            text += f"  {st.get('done')}/{st['total']} {st.get('unit') or ''}".rstrip()
        if st.get("status") == "running":
            text += f"  ETA {format_eta(st.get('eta_s'))}"
        extra = " ".join(f"{k}={short(st[k])}" for k in SHOWN_FIELDS
                         if k != "step" and st.get(k) is not None)
        lines.append(f"{text}  {extra}".rstrip())
    if info.get("mock"):
        lines.append("  (mock teacher: numbers are not meaningful)")
    job = (info.get("jobs") or {}).get("snapshot") or {}
    if job.get("status") in ("running", "failed", "interrupted"):
        lines.append(f"  snapshot job: {job.get('message')}")
    res = info.get("results")
    if isinstance(res, dict):
        lines += [f"  {line}" for line in _results_lines(res)]
    return "\n".join(lines)


def _results_lines(res: dict) -> list[str]:
    lines = []
    if res.get("gguf"):
        lines.append(f"adapter:   {res['gguf']}")
    if res.get("eval_json"):
        lines.append(f"eval:      {res['eval_json']}"
                     + (f"  ({res['eval_line']})" if res.get("eval_line") else ""))
    if res.get("ggk"):
        lines.append(f"ggk:       {res['ggk']}")
    return lines + [f"note:      {n}" for n in res.get("notes") or []]


# ---- parser ---------------------------------------------------------------------------
def _pack_list() -> str:
    from gguf_trainer.packs import pack_ids  # torch-free registry

    return ", ".join(pack_ids())


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gguf-trainer",
                     description="Train pig_clip adapters for the ggk engine.")
    parser.add_argument("--version", action="version", version=f"gguf-trainer {__version__}")
    parser.add_argument("--auto-resume", action="store_true",
                        help="relaunch the last project if its run was "
                             "interrupted, then open the GUI on it")
    gui_launch.add_arguments(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name, func, help_, project=True):
        p = sub.add_parser(name, help=help_, description=help_)
        if project:
            p.add_argument("--project", required=True, metavar="DIR", help="the project folder")
        p.set_defaults(func=func)
        return p

    def stage_args(p):
        p.add_argument("--only", nargs="+", choices=STAGES, metavar="STAGE",
                       help=f"run only these stages ({', '.join(STAGES)})")
        p.add_argument("--force", action="store_true", help="redo export/eval even if done")
        p.add_argument("--steps", metavar="N", help="set train.steps first (12000, 12_000, 40k)")
        trust_arg(p)

    def launch_args(p):  # several processes or machines: accelerate's launcher (README)
        p.add_argument("--processes", type=int, metavar="N",
                       help="processes on this machine (one per GPU); default: the larger of "
                            "precompute.processes and train.processes")
        p.add_argument("--num-machines", type=int, default=1, metavar="M",
                       help="machines sharing the project folder")
        p.add_argument("--machine-rank", type=int, default=0, metavar="R",
                       help="this machine's rank (0 holds the project)")
        p.add_argument("--main-process-ip", metavar="IP", help="address of machine rank 0")
        p.add_argument("--main-process-port", type=int, metavar="PORT",
                       help="rendezvous port on machine rank 0")
        p.add_argument("--accelerate-config", metavar="FILE",
                       help="an `accelerate config` file, passed to accelerate launch as it is")

    def trust_arg(p):
        p.add_argument("--trust-remote-code", action="store_true",
                       help="trust the teacher snapshot's own Python code "
                            "(asked once per snapshot)")

    p = command("new", cmd_new, "create a project folder for a pack", project=False)
    p.add_argument("--pack", required=True, metavar="ID", help=f"trainer pack: {_pack_list()}")
    p.add_argument(
        "--name", metavar="N", help="the GGUF's name (default: the pack's, e.g. pig_t5_adapter)"
    )
    p.add_argument("dir", metavar="DIR", help="the new project's folder")
    for name, func, help_ in (
        ("run", cmd_run, "run the pipeline in this terminal, with progress bars"),
        ("start", cmd_start, "start the pipeline detached (survives logout)"),
    ):
        p = command(name, func, help_)
        stage_args(p)
        launch_args(p)
    p = command("stop", cmd_stop, "stop after the current step (saves; resumable)")
    p.add_argument(
        "--timeout",
        type=float,
        default=supervisor.STOP_TIMEOUT_S,
        metavar="S",
        help="seconds to wait (0: do not wait); exit 3 if still stopping",
    )
    command("kill", cmd_kill, "kill the pipeline now (resumes from its last checkpoint)")
    p = command("status", cmd_status, "show the run status")
    p.add_argument("--json", action="store_true", help="the full status as JSON")
    p = command("set", cmd_set, "show or change settings, also while running")
    p.add_argument("--steps", metavar="N", help="planned training steps (12000, 12_000, 40k)")
    p.add_argument(
        "assign",
        nargs="*",
        metavar="KEY=VALUE",
        help="any setting, e.g. train.lr=1e-4 materials.student.path=/m/pig_clip-f16.gguf"
        " (the README's settings table lists them)",
    )
    p = command("snapshot", cmd_snapshot, "export a GGUF of the adapter as it is now")
    p.add_argument("--checkpoint", choices=("last", "best"), default="last")
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
    p = command("reset", cmd_reset, "delete a stage's outputs so it runs again")
    p.add_argument("target", choices=RESET_TARGETS)
    p.add_argument("--dry-run", action="store_true", help="only list what would be deleted")
    p = command(
        "download", cmd_download, "fetch missing materials here (Ctrl-C keeps a resumable partial)"
    )
    p.add_argument(
        "--id", nargs="+", metavar="ID", help="only these materials (default: all wanted)"
    )
    p.add_argument("--required-only", action="store_true", help="skip optional materials")
    trust_arg(p)
    p = command("materials", cmd_materials, "show each material's status")
    p.add_argument("--online", action="store_true", help="check against the Hub's file listing")
    p.add_argument(
        "--link-found", action="store_true", help="first link complete copies found on disk"
    )
    p.add_argument("--json", action="store_true")
    command(
        "login", cmd_login, "store a Hugging Face token (gated or private repos)", project=False
    )
    p = command("link", cmd_link, "use a complete copy you already have for a material")
    p.add_argument("id", metavar="ID")
    p.add_argument("path", metavar="PATH")
    p = command("verify", cmd_verify, "re-read every shard and checkpoint and report damage")
    p.add_argument("--repair", action="store_true", help="recompute just the damaged shards")
    p = command(
        "render", cmd_render, "render a prompt with the teacher and the adapter in your ggk"
    )
    p.add_argument("--prompt", required=True, metavar="P", help="the prompt both runs render")
    p.add_argument("--seed", default="42", metavar="S", help="the seed of both runs (default 42)")
    p.add_argument("--ggk", metavar="PATH", help="the ggk command, if not on PATH (remembered)")
    p.add_argument("--models", metavar="DIR", help="the folder with ggk's model files (remembered)")
    p.add_argument("--file", action="append", metavar='"<placeholder>=PATH"', help="your file "
                   "for a <placeholder> of the pack's ggk command (repeatable; remembered)")
    p.add_argument("--wait", action="store_true", help="wait for the images and print the result")
    p = command("inspect", cmd_inspect, "describe an adapter GGUF file", project=False)
    p.add_argument("file", metavar="FILE")
    p.add_argument("--json", action="store_true")
    p = command(
        "check", cmd_check, "compare an adapter with the engine's SD_DUMP_COND dump", project=False
    )
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
    p = command("demo", cmd_demo, "build an offline demo project and train it", project=False)
    p.add_argument(
        "--pack", metavar="ID", help=f"trainer pack: {_pack_list()} (default: t5xxl_pixart)"
    )
    p.add_argument("--dir", metavar="DIR", help="where to create it")
    p.add_argument("--steps", metavar="N")
    p.add_argument("--no-run", action="store_true", help="only prepare the project")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # --help/--version (0) or a usage error (1)
        return e.code if isinstance(e.code, int) else EXIT_ERROR
    try:
        if args.auto_resume:
            _out(supervisor.auto_resume())
        if args.command is None:  # bare `gguf-trainer` (and --auto-resume) open the GUI
            return gui_launch.run_from_args(args)
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


if __name__ == "__main__":
    sys.exit(main())
