"""Train tab: run controls, the stage strip, planned steps, the live charts and readings.

This module builds the components (`build() -> TrainParts`) and wires them; what a tick
shows is train_view.py (derived from `control.status()` and metrics.jsonl on each tick, see
live.py) and what Start does is train_start.py. The buttons call the API functions the
CLI's commands call, so a run started from the CLI, another browser or before a GUI
restart shows up on the next tick.

    parts = build(); wire(parts, project, refresh, read, setup.form, setup.save_md)
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from gguf_trainer.stages.stage_list import STAGES, stage_title
from gguf_trainer.ui import api, common, form
from gguf_trainer.ui.train_start import missing_warning, start_from_page
from gguf_trainer.ui.train_view import STAGE_CLASSES, series_chart


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
            loss_plot = series_chart("Loss", "loss-plot", "loss", {"loss": "#4f6ef7"})
            cos_plot = series_chart(
                "Cosine", "cos-plot", "cosine",
                {"val centred cos": "#c2410c", "train cos": "#2f9e63", "val cos": "#e0a52a"},
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


def tick_outputs(p: TrainParts) -> list:
    """The components a tick updates, in the order of train_view.render's updates."""
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
            common.info(text)
        else:
            common.warn(
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
        common.info(
            {"not running": "not running; nothing to stop"}.get(
                outcome, "stopping after the current step…"
            )
        )

    @common.shown_errors
    def do_kill(proj):
        outcome = api.kill(common.need_project(proj))["outcome"]
        common.info(
            "killed; Resume continues from the last checkpoint" if outcome == "killed" else outcome
        )

    @common.shown_errors
    def do_snapshot(proj, checkpoint, evaluate):
        job = api.snapshot(common.need_project(proj), checkpoint, evaluate)
        common.info(f"snapshot export started (pid {job.get('pid')}); it appears on the Output tab")

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
        common.info(f"{'export + eval' if which == 'export' else 'eval'} started from best.pt")

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
        common.info(f"reset {target}: deleted {len(res['deleted'])} path(s)")
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
