"""Train tab: run controls, the stage strip, planned steps, the live charts and readings.

Everything shown is derived from `control.status()` and metrics.jsonl on each tick (see
live.py); the buttons call the API functions the CLI's commands call. A run started from
the CLI, another browser or before a GUI restart shows up on the next tick.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gradio as gr
import pandas as pd

from gguf_trainer.errors import UserError
from gguf_trainer.runner import control
from gguf_trainer.runner.ranks import format_ranks  # torch-free: the status lines per rank
from gguf_trainer.runner.status import format_eta
from gguf_trainer.stage_list import STAGES, stage_title
from gguf_trainer.ui import api, common, form, hardware, live, setup_tab

ACTIVE = ("running", "stalled")
STAGE_CLASSES = ("stage", "stage-box")
# No data is None, never an empty DataFrame: a LinePlot that starts from an empty frame draws
# no lines for the data that arrives later (Gradio 6.31).
EMPTY_CHART = None
CHART_PX = 340
# steps/s is not among them: the one rate shown is the training stage's (step_rate).
METRIC_LABELS = {
    "loss": "loss",
    "cos": "train cos",
    "val_cos": "val cos",
    "best_val_cos": "best val cos",
    "lr": "learning rate",
    "mse": "mse",
    "rel_mse": "rel mse",
    "val_rel_mse": "val rel mse",
}


@dataclass
class TrainParts:
    banner: gr.Markdown
    start: gr.Button
    stop: gr.Button
    kill: gr.Button
    snap_checkpoint: gr.Radio
    snap_eval: gr.Checkbox
    snap_button: gr.Button
    reset_target: gr.Dropdown
    reset_open: gr.Button
    reset_box: gr.Group
    reset_plan: gr.Markdown
    reset_confirm: gr.Button
    reset_cancel: gr.Button
    stages: list
    progress: gr.Markdown
    steps: gr.Textbox
    apply_steps: gr.Button
    steps_note: gr.Markdown
    log_scale: gr.Checkbox
    loss_plot: gr.LinePlot
    cos_plot: gr.LinePlot
    metrics: gr.Markdown
    live_hw: gr.Markdown



def _series_chart(title: str, elem_id: str, what: str, colors: dict[str, str]):
    """A line chart of `series` over `step` whose legend names every series in `colors`."""
    return gr.LinePlot(
        EMPTY_CHART,
        x="step",
        y="value",
        color="series",
        height=CHART_PX,
        title=title,
        elem_id=elem_id,
        label=what,
        x_title="step",
        y_title=what,
        color_title="",
        color_map=colors,
        colors_in_legend=list(colors),
    )

def build() -> TrainParts:
    banner = gr.Markdown(
        "No project open: create or open one on the Setup tab.", elem_id="train-banner"
    )
    with gr.Row():
        start = gr.Button("Start", variant="primary", elem_id="btn-start", interactive=False)
        stop = gr.Button("Stop", elem_id="btn-stop", interactive=False)
        # neutral until a run is stalled: then it is the button to press (render)
        kill = gr.Button(
            "Kill (stalled run)", variant="secondary", elem_id="btn-kill", interactive=False
        )
    with gr.Row(equal_height=True, elem_id="stage-strip"):
        stages = [
            gr.Button(
                stage_title(s),
                elem_id=f"stage-{s}",
                interactive=False,
                elem_classes=[*STAGE_CLASSES, "stage-pending"],
                min_width=110,
            )
            for s in STAGES
        ]
    progress = gr.Markdown("", elem_id="train-progress")
    with gr.Row():
        with gr.Column(scale=3):
            with gr.Row():
                log_scale = gr.Checkbox(False, label="log10 loss", elem_id="log-scale", scale=0)
            # Tall enough for the legend: at 260 px the cosine legend was cut off, and the two
            # lines could not be told apart. The step axis runs to the planned steps (chart()).
            loss_plot = _series_chart("Loss", "loss-plot", "loss", {"loss": "#4f6ef7"})
            cos_plot = _series_chart(
                "Cosine", "cos-plot", "cosine", {"train cos": "#2f9e63", "val cos": "#e0a52a"}
            )
        with gr.Column(scale=2):
            metrics = gr.Markdown("", elem_id="train-metrics")
            with gr.Row(equal_height=True):
                steps = gr.Textbox(
                    label="Planned steps",
                    elem_id="steps-box",
                    scale=2,
                    info="12000, 12_000 or 40k; Apply works while running",
                )
                apply_steps = gr.Button("Apply", elem_id="btn-apply-steps", scale=1)
            steps_note = gr.Markdown("")
            live_hw = gr.Markdown("", elem_id="live-hw")
    with gr.Accordion("Export snapshot", open=False, elem_id="snapshot-box"):
        with gr.Row():
            snap_checkpoint = gr.Radio(
                [("Latest step", "last"), ("Best validation score so far", "best")],
                value="last",
                label="Checkpoint",
            )
            snap_eval = gr.Checkbox(
                False, label="Also evaluate it (on the CPU while training runs)"
            )
        snap_button = gr.Button("Export snapshot", elem_id="btn-snapshot")
    with gr.Accordion("Reset…", open=False):
        with gr.Row():
            reset_target = gr.Dropdown(
                [
                    ("training (checkpoints, eval, snapshots list)", "train"),
                    ("shards + training", "shards"),
                    ("corpus + everything after it", "corpus"),
                    ("exported GGUFs of this project", "output"),
                ],
                value="train",
                label="What to reset",
            )
            reset_open = gr.Button("Reset…", elem_id="btn-reset")
        with gr.Group(visible=False) as reset_box:
            reset_plan = gr.Markdown("", elem_id="reset-plan")
            with gr.Row():
                reset_confirm = gr.Button(
                    "Delete these", variant="stop", elem_id="btn-reset-confirm"
                )
                reset_cancel = gr.Button("Cancel")
    return TrainParts(
        banner,
        start,
        stop,
        kill,
        snap_checkpoint,
        snap_eval,
        snap_button,
        reset_target,
        reset_open,
        reset_box,
        reset_plan,
        reset_confirm,
        reset_cancel,
        stages,
        progress,
        steps,
        apply_steps,
        steps_note,
        log_scale,
        loss_plot,
        cos_plot,
        metrics,
        live_hw,
    )


# ---- rendering ------------------------------------------------------------------------
def run_label(info: dict) -> str:
    return {"idle": "Start", "interrupted": "Resume", "stopped": "Resume"}.get(
        info.get("status"), "Start / Resume"
    )


def is_stopping(info: dict) -> bool:
    """control.status's flag: a stop was requested and the run is still alive."""
    return bool(info.get("stopping")) and info.get("status") in ACTIVE


def step_counts(info: dict, planned: int | None = None) -> tuple:
    """(done, planned) training steps: the one pair the banner, the stage box, the metrics
    table and the Planned steps box all show. done is the training stage's own count (the
    run's state), planned is project.json's train.steps (what Start saved or Apply set; a
    running trainer picks it up within log_every steps), else what the run recorded."""
    train = (info.get("stages") or {}).get("train") or {}
    done = train.get("done") if train.get("done") is not None else info.get("step")
    total = planned if planned is not None else (train.get("total") or info.get("steps"))
    return done, total


def step_rate(info: dict) -> tuple:
    """(steps/s, eta_s) of a live training stage: the stage's recent throughput, the one
    smoothed rate shown (its ETA is remaining / rate); (None, None) when nothing trains."""
    train = (info.get("stages") or {}).get("train") or {}
    if info.get("status") not in ACTIVE or train.get("status") != "running":
        return None, None
    return train.get("rate"), train.get("eta_s")


def _counts_text(info: dict, planned: int | None) -> str:
    done, total = step_counts(info, planned)
    if done is None:
        return ""
    return f"step {common.fmt(done)} / {common.fmt(total)}"


def banner_text(info: dict, planned: int | None = None) -> str:
    """The run's state in words, with the step counts; never the ETA (shown once, in the
    progress line) and never a raw dict."""
    status = info.get("status") or "idle"
    counts = _counts_text(info, planned)
    message = str(info.get("message") or "")
    if status in ACTIVE and status != "stalled":  # its message repeats the counts and the ETA
        stage = info.get("stage")
        message = f"pid {info.get('pid')}" + (
            f" · {stage_title(stage)}" if stage else " · starting"
        )
    text = f"**{status.upper()}** · {message}" + (f" · {counts}" if counts else "")
    if is_stopping(info):
        text = f"**STOPPING…** · finishing the current step, then saving · {message}" + (
            f" · {counts}" if counts else ""
        )
    if status == "stalled":
        text += " — **Kill** it, then **Resume** from the last checkpoint."
    if status == "interrupted":
        text += " — press **Resume** to continue from the last checkpoint."
    if info.get("mock"):
        text = (
            "**MOCK teacher run** (synthetic targets: a smoke test, not a usable adapter) · " + text
        )
    job = (info.get("jobs") or {}).get("snapshot") or {}
    if job.get("status") == "running":
        phase = (
            (job.get("progress") or {}).get("phase")
            if isinstance(job.get("progress"), dict)
            else None
        )
        text += f"\n\nSnapshot export running (pid {job.get('pid')})" + (
            f": {phase}" if phase else ""
        )
    elif job.get("status") == "failed":
        text += f"\n\nLast snapshot export failed: {job.get('error')}"
    if info.get("settings_error"):
        text += f"\n\n⚠ project.json: {info['settings_error']}"
    return text


def stage_text(name: str, st: dict | None, counts: tuple | None = None) -> tuple[str, str]:
    """(button label, status class) of one stage box; `counts` (step_counts) for training.
    No ETA here: it is shown once, in the progress line."""
    st = st or {}
    status = st.get("status") or "pending"
    if st.get("skipped"):
        status = "done"
    lines = [stage_title(name), status + (" (already done)" if st.get("skipped") else "")]
    done, total = counts if counts and counts[0] is not None else (st.get("done"), st.get("total"))
    if total is not None and done is not None:
        lines.append(f"{common.fmt(done)}/{common.fmt(total)} {st.get('unit') or 'steps'}".strip())
    if name == "train" and st.get("best_val_cos") is not None:
        lines.append(f"best val cos {common.fmt(st['best_val_cos'])}")
    if st.get("detail"):
        lines.append(str(st["detail"])[:60])
    return "\n".join(lines), f"stage-{status}"


def ranks_md(info: dict) -> str:
    """A launched run's other ranks, one line each, as `status` prints them (empty when the
    run runs alone or is not running)."""
    lines = format_ranks(info)
    if not lines:
        return ""
    return "\n\nOther ranks (rank 0 is the run above):\n" + "\n".join(
        f"* {line.strip()}" for line in lines
    )


def metrics_md(info: dict, cur: live.Cursor, planned: int | None = None) -> str:
    done, total = step_counts(info, planned)
    rate, _eta = step_rate(info)
    rows = [
        ["step", f"{common.fmt(done)} / {common.fmt(total)}"],
        ["steps/s", common.fmt(rate, 3)],
    ]  # "—" when nothing trains
    for key, label in METRIC_LABELS.items():
        value = info.get(key) if info.get(key) is not None else cur.latest.get(key)
        if value is not None:
            rows.append([label, common.fmt(value)])
    return "#### Current metrics\n" + common.md_table(["metric", "value"], rows)


def hardware_md(info: dict) -> str:
    m = hardware.machine()
    lines = [
        "#### Live hardware",
        (
            f"* CPU {m['cpu_percent']:.0f}% of {m['cpu_count']} threads · "
            f"RAM {m['ram_used_gib']:.1f} / {m['ram_total_gib']:.1f} GiB"
        ),
    ]
    if m["gpus"] is None:
        lines.append(f"* GPU: {hardware.NO_NVIDIA}")
    for g in m["gpus"] or []:
        lines.append(
            f"* GPU {g['index']} {g['name']}: {g['vram_used_gib']:.1f} / "
            f"{g['vram_total_gib']:.1f} GiB, {common.fmt(g.get('util_percent'))}% util"
        )
    proc = hardware.pipeline_process(info.get("pid")) if info.get("status") in ACTIVE else None
    if proc is None:
        lines.append("* Pipeline process: not running")
    else:
        gpu = "no NVIDIA driver" if proc["gpu_mib"] is None else f"{proc['gpu_mib']:.0f} MiB"
        lines.append(
            f"* Pipeline (pid {proc['pid']}): CPU {proc['cpu_percent']:.0f}% · RSS "
            f"{proc['rss_gib']:.2f} GiB incl. {proc['children']} child process(es) · GPU {gpu}"
        )
    return "\n".join(lines)


def chart(cur: live.Cursor, names: dict, log10: bool = False, planned: int | None = None):
    """The series as a LinePlot update whose step axis runs to the planned steps (it moves
    when they change), so the line's length says how far the run is."""
    df = pd.DataFrame(live.chart_rows(cur, names, log10))
    return gr.update(value=df if len(df) else EMPTY_CHART, x_lim=[0, planned] if planned else None)


def tick_outputs(p: TrainParts) -> list:
    return [
        p.banner,
        p.start,
        p.stop,
        p.kill,
        *p.stages,
        p.progress,
        p.metrics,
        p.loss_plot,
        p.cos_plot,
        p.steps,
    ]


def planned_steps(project: str | None) -> int | None:
    """project.json's train.steps, or None (no project, or a broken file the banner names)."""
    value = steps_value(project)
    return int(value) if value.isdigit() else None


def render(cur: live.Cursor, info: dict, plot_changed: bool, log10: bool) -> list:
    """Updates for tick_outputs(); gr.skip() for whatever this tab already shows."""

    def put(key, value):
        return value if cur.changed(key, repr(value)) else gr.skip()

    status = info.get("status")
    active = status in ACTIVE
    stopping = is_stopping(info)
    planned = planned_steps(info.get("project"))
    counts = step_counts(info, planned)
    out = [
        put("banner", banner_text(info, planned)),
        put(
            "start",
            gr.update(
                value=run_label(info), interactive=not active and not info.get("settings_error")
            ),
        ),
        put(
            "stop",
            gr.update(
                value="Stopping…" if stopping else "Stop", interactive=active and not stopping
            ),
        ),
        put(
            "kill",
            gr.update(interactive=active, variant="stop" if status == "stalled" else "secondary"),
        ),
    ]
    for name in STAGES:
        label, cls = stage_text(
            name, (info.get("stages") or {}).get(name), counts if name == "train" else None
        )
        clickable = name in ("export", "eval") and not active
        out.append(
            put(
                f"stage-{name}",
                gr.update(value=label, elem_classes=[*STAGE_CLASSES, cls], interactive=clickable),
            )
        )
    stage = (info.get("stages") or {}).get(info.get("stage") or "") or {}
    prog = ""
    if status in ACTIVE and info.get("stage"):
        prog = f"Now: **{stage_title(info['stage'])}**"
        done, total = (
            counts if info["stage"] == "train" else (stage.get("done"), stage.get("total"))
        )
        if total:
            unit = stage.get("unit") or ""
            prog += f" — {common.fmt(done)}/{common.fmt(total)} {unit}".rstrip()
            if stage.get("rate"):
                prog += f" · {common.fmt(stage['rate'], 3)} {unit or 'units'}/s"
            prog += f" · ETA {format_eta(stage.get('eta_s')) if status == 'running' else '—'}"
    prog += ranks_md(info)
    if info.get("error"):
        prog += f"\n\nLast error: {info['error']}"
    out.append(put("progress", prog))
    out.append(put("metrics", metrics_md(info, cur, planned)))
    if plot_changed or cur.changed("log10", log10) or cur.changed("planned_axis", planned):
        out += [
            chart(cur, live.LOSS_SERIES, log10, planned),
            chart(cur, live.COS_SERIES, False, planned),
        ]
    else:
        out += [gr.skip(), gr.skip()]
    # the box follows project.json (Start saved it, Apply, the CLI) only when that changed,
    # so what the user is typing is not overwritten by every tick
    out.append(put("planned", str(planned)) if planned is not None else gr.skip())
    return out


# ---- starting from the page --------------------------------------------------------------
@dataclass
class StartOutcome:
    """What Start did: `started` (and `pid`), `message` (one or two sentences for a toast),
    `saved` (setup_tab.Saved when the Setup form had changes, else None), `missing` (required
    materials that are not ready, named before starting)."""

    started: bool
    message: str
    saved: setup_tab.Saved | None = None
    missing: list = field(default_factory=list)
    pid: int | None = None
    suggest_steps: int | None = None  # a finished run: the Planned steps value offered


def _changed_names(fm: form.Form, keys) -> str:
    """The fields Start saved, as the Setup tab labels them."""
    return ", ".join(
        f"{(fm.fields[k].meta.get('label') or k) if k in fm.fields else k} ({k})" for k in keys
    )


def _finished(project: str) -> tuple[int, int] | None:
    """(done, planned) when the run is done and training has reached the planned steps."""
    info = control.status(project)
    done, planned = step_counts(info, planned_steps(project))
    if (
        info.get("status") == "done"
        and done is not None
        and planned is not None
        and done >= planned
    ):
        return int(done), int(planned)
    return None


def start_from_page(
    fm: form.Form, project: str | None, read: dict | None, vals: list
) -> StartOutcome:
    """Start as the page shows it: unsaved Setup changes are saved first through the same
    compare-and-set as Save, and a change that was not saved (changed on disk since the page
    read it, or invalid) starts nothing: the fields say why. Required materials that are not
    ready are named before starting; control.start then refuses with the path and the fix
    when the run really needs them (a resume past precompute does not)."""
    project = common.need_project(project)
    saved = setup_tab.save_form(fm, project, read, vals) if read else None
    if saved is not None and saved.result is None:
        saved = None  # nothing had changed: nothing to report
    if saved is not None and not saved.ok:
        return StartOutcome(
            False,
            "Not started: some of your Setup changes were not saved "
            "(see the fields marked ⚠ on the Setup tab); reload or fix them, "
            "then press Start again.",
            saved,
            [],
        )
    finished = _finished(project) if saved is None else None
    if finished:  # starting would redo nothing: say so and offer more steps instead
        done, planned = finished
        more = planned + max(1000, planned // 2)
        return StartOutcome(
            False,
            f"Training is already done ({done} / {planned} steps). To train "
            f"further, raise Planned steps (offered: {more}) and press Apply, then "
            "Start; the export and eval boxes rebuild from best.pt.",
            suggest_steps=more,
        )
    missing = setup_tab.missing_materials(project)
    note = (
        f"Saved your Setup changes: {_changed_names(fm, saved.result['applied'])}. "
        if saved
        else ""
    )
    try:
        pid = api.start(project)["pid"]
    except UserError as e:
        return StartOutcome(False, f"{note}Not started: {e}", saved, missing)
    return StartOutcome(True, f"{note}Pipeline started (pid {pid}).", saved, missing, pid)


def missing_warning(missing: list[str]) -> str:
    return (
        f"Required materials not ready: {', '.join(missing)}. Download or link them on the "
        "Setup tab (a run that still has to precompute stops at once without them)."
    )


# ---- wiring ---------------------------------------------------------------------------
def wire(
    p: TrainParts, project: gr.State, refresh, read: gr.State, fm: form.Form, save_md: gr.Markdown
) -> None:
    """`refresh` is the app's (project, cursor) -> updates chain run after each action;
    `read`, `fm` and `save_md` are the Setup tab's (Start saves the form first)."""

    @common.shown_errors
    def do_start(proj, rd, *vals):
        out = start_from_page(fm, proj, rd, list(vals))
        # one toast per press: the outcome, with the missing materials in the same sentence
        text = common.gui_words(
            out.message + (" " + missing_warning(out.missing) if out.missing else "")
        )
        if out.started and not out.missing:
            gr.Info(text)
        else:
            gr.Warning(
                text,
                title="Started"
                if out.started
                else "Already done"
                if out.suggest_steps
                else "Not started",
            )
        offer = str(out.suggest_steps) if out.suggest_steps else gr.skip()
        if out.saved is None:
            return [gr.skip()] * (2 + len(fm.comps)) + [offer]
        return [out.saved.read, out.saved.message, *out.saved.marks, offer]

    @common.shown_errors
    def do_stop(proj):
        outcome = api.stop(common.need_project(proj))["outcome"]
        gr.Info(
            {"not running": "not running; nothing to stop"}.get(
                outcome, "stopping after the current step…"
            )
        )

    @common.shown_errors
    def do_kill(proj):
        outcome = api.kill(common.need_project(proj))["outcome"]
        gr.Info(
            "killed; Resume continues from the last checkpoint" if outcome == "killed" else outcome
        )

    @common.shown_errors
    def do_snapshot(proj, checkpoint, evaluate):
        job = api.snapshot(common.need_project(proj), checkpoint, evaluate)
        gr.Info(f"snapshot export started (pid {job.get('pid')}); it appears on the Output tab")

    @common.shown_errors
    def do_steps(proj, steps):
        res = api.set_steps(common.need_project(proj), steps)
        return common.gui_words(res["message"])

    @common.shown_errors
    def do_regen(proj, which):
        if which == "export":
            api.export(common.need_project(proj))
        else:
            api.start(common.need_project(proj), only=["eval"], force=True)
        gr.Info(f"{'export + eval' if which == 'export' else 'eval'} started from best.pt")

    @common.shown_errors
    def open_reset(proj, target):
        plan = api.reset_plan(common.need_project(proj), target)
        lines = [f"**Reset {target}** deletes exactly:"]
        lines += [f"* `{d}`" for d in plan["delete"]] or ["* nothing (it is already clean)"]
        if plan.get("keep"):
            lines.append("Left in place:")
            lines += [f"* `{k['path']}` — {k['reason']}" for k in plan["keep"]]
        if plan.get("blocked"):
            lines.append(f"\n⚠ Refused right now: {plan['blocked']}")
        return (
            gr.update(visible=True),
            "\n".join(lines),
            gr.update(interactive=not plan.get("blocked")),
        )

    @common.shown_errors
    def do_reset(proj, target):
        res = api.reset(common.need_project(proj), target)
        gr.Info(f"reset {target}: deleted {len(res['deleted'])} path(s)")
        return gr.update(visible=False)

    p.start.click(do_start, [project, read, *fm.comps], [read, save_md, *fm.comps, p.steps]).then(
        **refresh
    )
    p.stop.click(do_stop, [project], None).then(**refresh)
    p.kill.click(do_kill, [project], None).then(**refresh)
    p.snap_button.click(do_snapshot, [project, p.snap_checkpoint, p.snap_eval], None).then(
        **refresh
    )
    p.apply_steps.click(do_steps, [project, p.steps], [p.steps_note]).then(**refresh)
    p.steps.submit(do_steps, [project, p.steps], [p.steps_note]).then(**refresh)
    for name, box in zip(STAGES, p.stages):
        if name in ("export", "eval"):
            box.click(lambda proj, _n=name: do_regen(proj, _n), [project], None).then(**refresh)
    p.reset_open.click(
        open_reset, [project, p.reset_target], [p.reset_box, p.reset_plan, p.reset_confirm]
    )
    p.reset_cancel.click(lambda: gr.update(visible=False), None, [p.reset_box])
    p.reset_confirm.click(do_reset, [project, p.reset_target], [p.reset_box]).then(**refresh)


def steps_value(project: str | None) -> str:
    if not project:
        return ""
    try:
        return str(control.read_settings(project).values["train"]["steps"])
    except UserError:  # broken project.json or no project: the banner says so
        return ""
