"""The pipeline's commands: `run` (in this terminal, with progress bars), `start` (detached),
`stop`, `kill` and `status`. `run` with several processes or machines goes through
accelerate's launcher (runner.launch); `demo` runs its project through run_in_foreground."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from gguf_trainer.base.exit_codes import EXIT_OK
from gguf_trainer.base.exit_codes import EXIT_USER as EXIT_ERROR
from gguf_trainer.cli.common import Command, out, parse_steps, trust_arg, trust_if_asked
from gguf_trainer.runner import control, supervisor
from gguf_trainer.runner.progress import SHOWN_FIELDS, ProgressBars, console_log_handler, short
from gguf_trainer.runner.status import format_eta
from gguf_trainer.stages.stage_list import STAGES


def _launch(args):
    from gguf_trainer.runner.launch import Launch

    return Launch(args.processes, args.num_machines, args.machine_rank, args.main_process_ip,
                  args.main_process_port, args.accelerate_config)


def cmd_run(args) -> int:
    paths = supervisor.project_paths(args.project)
    # every argument and the project are checked before anything is written
    plan = control.preflight_run(paths.root, args.only, args.steps, _launch(args))
    for line in plan.linked:  # materials found and linked
        out(line)
    if plan.launch.is_main_machine:
        trust_if_asked(args, paths.root)
        if plan.steps is not None:
            out(control.set_steps(paths.root, plan.steps).message.split(";")[0])
        supervisor.remember_project(paths.root)
    if plan.launch.needed():
        return _run_launched(paths, args, plan.launch)
    code = run_in_foreground(paths, args.only, args.force)
    if code == EXIT_OK and control.status(paths.root)["status"] == "done":
        out(control.results_text(paths.root))
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
        out(f"machine rank {launch.machine_rank}: the ranks here ended (code {rc}); "
            f"machine rank 0 shows the run: gguf-trainer status --project {paths.root}")
        return EXIT_OK if rc == 0 else EXIT_ERROR
    info = supervisor.status(paths.root)
    if info["status"] == "stopped":
        out(f"stopped; resume with: gguf-trainer run --project {paths.root}")
    elif info["status"] == "done":
        out(control.results_text(paths.root))
    else:
        print(f"{info['status']}: {info.get('error') or 'see ' + str(paths.pipeline_log)}",
              file=sys.stderr)
    return EXIT_OK if info["status"] in ("done", "stopped") else EXIT_ERROR


def run_in_foreground(paths, only, force) -> int:
    """The pipeline in this process with progress bars (`run`, `demo`); its last line."""
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
        out(f"stopped; resume with: gguf-trainer run --project {paths.root}")
    elif code == PIPELINE_OK:
        out(f"{info['status']}: {paths.root}")
    else:
        print(f"failed: {info.get('error') or 'see ' + str(paths.pipeline_log)}", file=sys.stderr)
    return EXIT_OK if code == PIPELINE_OK else EXIT_ERROR


def cmd_start(args) -> int:
    paths = supervisor.project_paths(args.project)
    trust_if_asked(args, paths.root)
    pid = control.start(paths.root, only=args.only, force=args.force,
                        steps=parse_steps(args.steps), launch=_launch(args))
    res = control.results(paths.root)
    out(f"pipeline started (pid {pid}), logging to {paths.pipeline_log}; "
        f"follow it with: gguf-trainer status --project {paths.root}")
    out(f"when it is done: the adapter is {res['planned_gguf']}, the evaluation "
        f"{paths.eval_json}; `gguf-trainer status --project {paths.root}` "
        "then prints the ggk command")
    return EXIT_OK


def cmd_stop(args) -> int:
    outcome = control.stop(args.project, timeout_s=args.timeout)
    if outcome == "not running":
        out("not running; nothing to stop")
    elif outcome == "stopping":
        out("stop requested; the pipeline finishes its current step, then exits")
    else:
        out(f"stopped; resume with: gguf-trainer start --project {Path(args.project)}")
    return EXIT_OK


def cmd_kill(args) -> int:
    outcome = control.kill(args.project)
    if outcome == "not running":
        out("not running; nothing to kill")
    else:
        out("killed; the run resumes from its last checkpoint with: "
            f"gguf-trainer start --project {Path(args.project)}")
    return EXIT_OK


def cmd_status(args) -> int:
    info = control.status(args.project)
    if args.json:
        out(json.dumps(info, indent=2, sort_keys=True, default=str))
    else:
        out(format_status(info))
        from gguf_trainer.runner.ranks import format_ranks  # torch-free

        for line in format_ranks(info):
            out(line)
    return EXIT_ERROR if info.get("settings_error") else EXIT_OK


def format_status(info: dict) -> str:
    """The text `gguf-trainer status` prints: the message, then one line per stage."""
    lines = [f"{info['project']}: {info['message']}"]
    if info["status"] == "interrupted":
        lines[0] += f"; resume with: gguf-trainer start --project {info['project']}"
    stages = info.get("stages") or {}
    order = [s for s in STAGES if s in stages] + [s for s in stages if s not in STAGES]
    for name in order:
        st = stages[name]
        # a stage a resume found done: the GUI's word for it (ui/train_view.py)
        text = f"  {name:<17} {'done earlier' if st.get('skipped') else st.get('status')}"
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
    kept = info.get("kept") or {}
    if kept.get("n"):
        lines.append(f"  kept steps: {kept['n']} ({kept['bytes'] / 1e9:.2f} GB); list them with "
                     f"gguf-trainer snapshot --project {info['project']} --checkpoint list")
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


# ---- the subcommands --------------------------------------------------------------------
def _pipeline_args(p) -> None:
    """`run` and `start`: which stages, and the launcher for several processes or machines."""
    p.add_argument("--only", nargs="+", choices=STAGES, metavar="STAGE",
                   help=f"run only these stages ({', '.join(STAGES)})")
    p.add_argument("--force", action="store_true", help="redo export/eval even if done")
    p.add_argument("--steps", metavar="N", help="set train.steps first (12000, 12_000, 40k)")
    trust_arg(p)
    # several processes or machines: accelerate's launcher (README)
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


def _stop_args(p) -> None:
    p.add_argument(
        "--timeout",
        type=float,
        default=supervisor.STOP_TIMEOUT_S,
        metavar="S",
        help="seconds to wait (0: do not wait); exit 3 if still stopping",
    )


def _status_args(p) -> None:
    p.add_argument("--json", action="store_true", help="the full status as JSON")


COMMANDS = (
    Command("run", cmd_run, "run the pipeline in this terminal, with progress bars",
            _pipeline_args),
    Command("start", cmd_start, "start the pipeline detached (survives logout)", _pipeline_args),
    Command("stop", cmd_stop, "stop after the current step (saves; resumable)", _stop_args),
    Command("kill", cmd_kill, "kill the pipeline now (resumes from its last checkpoint)"),
    Command("status", cmd_status, "show the run status", _status_args),
)
