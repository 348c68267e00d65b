"""The Gradio Blocks app: header, the five tabs, the timers, the page load, the API.

Per browser tab it keeps only the open project's path, what the Setup form read, and a
`live.Cursor` (how far it has read the project's files). Every page load and tick re-reads
the project, so reloading, a second browser or a restarted GUI re-attach to a running job.
The first project shown is `?project=DIR` from the URL, else the one the GUI was launched
on (`--auto-resume`), else the last project used.
"""

from __future__ import annotations

import threading

import gradio as gr

from gguf_trainer import __version__
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import control
from gguf_trainer.ui import (
    api,
    files,
    hardware_tab,
    live,
    logs_tab,
    materials_section,
    output_tab,
    recent,
    render_section,
    setup_tab,
    train_tab,
    train_view,
)

TICK_S = 2.0
HW_TICK_S = 5.0
CSS = """
#stage-strip button.stage { white-space: pre-line; line-height: 1.25; min-height: 5.2em;
  font-size: 0.82em; border-width: 2px; }
#stage-strip .stage-done { border-color: #2f9e63 !important; background: #e8f6ee !important;
  color: #1d5e3b !important; }
#stage-strip .stage-running { border-color: #4f6ef7 !important; background: #eaeefe !important;
  color: #27378a !important; }
#stage-strip .stage-failed, #stage-strip .stage-interrupted { border-color: #d9480f !important;
  background: #fdece4 !important; color: #8a2d08 !important; }
#stage-strip .stage-stopped, #stage-strip .stage-stalled { border-color: #e0a52a !important;
  background: #fdf6e3 !important; }
#stage-strip button.stage:disabled { opacity: 1; cursor: default; }
#stage-strip .stage-pending { opacity: 0.7 !important; }
/* The file browser is a dialog over the page: whichever field asked (the last one is far
   below the project box), it opens in view, not where the Group happens to sit. */
#file-browser { position: fixed !important; top: 8vh; left: 50%; transform: translateX(-50%);
  width: min(960px, 94vw); max-height: 84vh; overflow-y: auto; z-index: 1000; padding: 8px;
  background: var(--background-fill-primary, #fff); box-shadow: 0 8px 40px rgba(0, 0, 0, 0.35);
  border: 1px solid #888; border-radius: 8px; }
/* Gradio repeats the Group's elem_id on its inner box: only the outer one is the dialog. */
#file-browser #file-browser { position: static !important; transform: none; width: auto;
  max-height: none; overflow: visible; box-shadow: none; border: 0; padding: 0; }
/* Material table headers and short cells are words: never broken inside one. The table
   scrolls inside its box, and the last column ("where", which holds the error) wraps. */
#materials-md table { display: block; overflow-x: auto; max-width: 100%; }
#materials-md th, #materials-md td { word-break: keep-all; overflow-wrap: normal; }
#materials-md th, #materials-md td:nth-child(n+2):nth-child(-n+7) { white-space: nowrap; }
#materials-md td:nth-child(9) { white-space: normal; min-width: 18em; overflow-wrap: anywhere; }
/* File names are never split inside a word ("snapsho/t"): the tables scroll instead. */
#out-exports table, #out-snapshots table { display: block; overflow-x: auto; }
#out-exports td:first-child, #out-snapshots td:nth-child(6) { white-space: nowrap; }
/* A field warning (the info line under a field) reads as an error, not as faint help. */
.field-error [data-testid="block-info"], .field-error .info { font-weight: 600; }
/* Vega lays the series legend out below the plot's own height and the SVG clips it: let it
   show, with room under the chart, so train cos and val cos are labelled. */
#loss-plot .vega-embed, #cos-plot .vega-embed { height: calc(100% - 64px) !important; }
#loss-plot svg.marks, #cos-plot svg.marks { overflow: visible !important; }
/* A field the last save refused (form.mark): red frame, its sentence red under the label. */
.field-error { border: 2px solid #d9480f !important; border-radius: 6px; }
.field-error [data-testid="block-info"], .field-error .info { color: #b3380b !important; }
/* Toasts: Gradio gathers the toasts of one kind in one box with a count, "Info (3)", each
   message under the last. A press's toast replaces the one before it: the newest alone. */
.toast-messages > :not(:last-child) { display: none !important; }
.toast-count { display: none !important; }
"""

_tick_lock = threading.Lock()  # ticks take milliseconds; one at a time keeps cursors whole


# Gradio closes a kind's toast box `duration` s after the FIRST toast in it (its timer starts
# when the box holds one message), so a press's newest toast could vanish at once. Our toasts
# carry no Gradio timer (common.info/warn: duration None); each box closes 10 s after its
# newest message.
TOAST_JS = """
() => {
  const timers = new WeakMap();
  const arm = (box) => {
    clearTimeout(timers.get(box));
    timers.set(box, setTimeout(() => box.querySelector('.toast-close')?.click(), 10000));
  };
  const BOX = '[data-testid="toast-body"]';
  new MutationObserver((records) => {
    for (const r of records) {
      if (!r.addedNodes.length) continue;
      const box = r.target.closest?.(BOX);
      if (box) arm(box);
      for (const n of r.addedNodes) {
        if (n.nodeType !== 1) continue;
        if (n.matches(BOX)) arm(n);
        n.querySelectorAll(BOX).forEach(arm);
      }
    }
  }).observe(document.body, {childList: true, subtree: true});
}
"""


def build_app(roots: list[str] | None = None, project: str | None = None) -> gr.Blocks:
    files.set_launch_roots(roots)
    start_project = project
    with gr.Blocks(title="gguf-trainer", analytics_enabled=False) as app:
        project_state = gr.State(None)
        read_state = gr.State(None)
        cursor = gr.State(live.Cursor())
        gr.Markdown(f"## gguf-trainer {__version__} — pig_clip adapters for ggk", elem_id="title")
        header = gr.Markdown("", elem_id="header")
        with gr.Tabs(elem_id="tabs"):
            with gr.Tab("Setup", id="setup", elem_id="tab-setup"):
                setup = setup_tab.build()
            with gr.Tab("Train", id="train", elem_id="tab-train"):
                train = train_tab.build()
            with gr.Tab("Hardware", id="hardware", elem_id="tab-hardware") as hw_tab:
                hw = hardware_tab.build()
            with gr.Tab("Logs", id="logs", elem_id="tab-logs") as logs_tab_ui:
                logs = logs_tab.build()
            with gr.Tab("Output", id="output", elem_id="tab-output") as out_tab:
                out = output_tab.build()
        timer = gr.Timer(TICK_S)
        hw_timer = gr.Timer(HW_TICK_S)

        tick_outs = [header, *train_tab.tick_outputs(train), logs.text, *output_tab.outputs(out)]

        def tick(proj, cur: live.Cursor, which_log, follow, log10):
            """Inputs: the open project, this tab's cursor and display options. Outputs:
            header, the Train tab's live parts, the log text and the Output tab; gr.skip()
            for everything unchanged (nothing is sent when nothing changed)."""
            if not proj:
                return [gr.skip()] * len(tick_outs)
            with _tick_lock:  # a page-load refresh and a timer tick may overlap on one cursor
                try:
                    return _tick(proj, cur, which_log, follow, log10)
                except UserError as e:  # the folder went away, a file is unreadable, ...
                    msg = f"Project `{proj}`: ⚠ {e}"
                    return [msg if cur.changed("header", msg) else gr.skip()] + [gr.skip()] * (
                        len(tick_outs) - 1
                    )

        def _tick(proj, cur: live.Cursor, which_log, follow, log10):
            if cur.project != proj:
                cur.reset_for(proj)
            paths = ProjectPaths(proj)
            sig = live.state_signature(paths)
            state_changed = sig != cur.state_sig or not paths.exists()
            plot_changed = live.read_new_metrics(cur, paths)
            info = (
                control.status(proj)
                if (state_changed or plot_changed or "info" not in cur.shown)
                else None
            )
            if info is not None and not info.get("mock"):
                info["mock"] = configured_mock(proj)
            cur.shown["info"] = 1
            ups: list = []
            if info is not None:
                cur.state_sig = sig
                head = header_text(proj, info)
                ups.append(head if cur.changed("header", head) else gr.skip())
                ups += train_view.render(cur, info, plot_changed, log10)
            else:
                ups += [gr.skip()] * (1 + len(train_tab.tick_outputs(train)))
            ups.append(logs_tab.render(cur, paths, which_log, follow))
            out_sig = live.outputs_signature(paths)
            if state_changed or out_sig != cur.outputs_sig or cur.outputs_busy:
                shown = output_tab.render(proj)
                cur.outputs_sig, cur.outputs_busy = out_sig, output_tab.is_busy(shown)
                ups += [
                    v if cur.changed(f"out{i}", v) else gr.skip()
                    for i, v in enumerate(shown)
                ]
            else:
                ups += [gr.skip()] * len(output_tab.outputs(out))
            return ups

        tick_inputs = [project_state, cursor, logs.which, logs.follow, train.log_scale]
        timer.tick(tick, tick_inputs, tick_outs, queue=False, api_visibility="private")
        refresh = {
            "fn": tick,
            "inputs": tick_inputs,
            "outputs": tick_outs,
            "queue": False,
            "api_visibility": "private",
        }

        def hw_tick(proj):
            if not proj:
                return gr.skip()
            return train_view.hardware_md(control.status(proj))

        mat_outs = materials_section.outputs(setup.materials)

        def slow_tick(proj, cur: live.Cursor):
            """Every HW_TICK_S: live hardware readings and the material status (downloads
            move without the pipeline running); the materials only when they changed."""
            if not proj:
                return [gr.skip()] * (1 + len(mat_outs))
            try:
                mats = materials_section.materials_view(proj)
                hw = hw_tick(proj)
            except UserError:  # the tick above says what is wrong with the project
                return [gr.skip()] * (1 + len(mat_outs))
            return [hw, *(mats if cur.changed("materials", mats) else [gr.skip()] * len(mats))]

        hw_timer.tick(
            slow_tick,
            [project_state, cursor],
            [train.live_hw, *mat_outs],
            queue=False,
            api_visibility="private",
        )
        train.log_scale.change(**refresh)
        logs.which.change(**refresh)

        def after_open_fn(proj):
            return train_view.steps_value(proj), (hw_tick(proj) if proj else "")

        after_open = {
            "fn": after_open_fn,
            "inputs": [project_state],
            "outputs": [train.steps, train.live_hw],
            "api_visibility": "private",
        }

        setup_tab.wire(setup, project_state, read_state, cursor, after_open)
        train_tab.wire(train, project_state, refresh, read_state, setup.form, setup.save_md)
        logs_tab.wire(logs, cursor, logs_tab_ui)
        hardware_tab.wire(hw, project_state, hw_tab)
        output_tab.wire(out, project_state, out_tab)

        def on_load(request: gr.Request):
            """Page load: pick the project (URL ?project=, launch project, last project) and
            fill Setup from disk."""
            proj = None
            asked = (
                request.query_params.get("project") if request is not None else None
            ) or start_project
            for cand in (asked, recent.last()):
                if cand and ProjectPaths(cand).exists():
                    proj = str(ProjectPaths(cand).root)
                    break
            if proj and asked and proj not in recent.projects()[:1]:
                recent.remember(proj)  # opened by path (?project=, --project): a recent one too
            ups, rd = setup_tab.load_values(setup, proj)
            return [proj, rd, *ups]

        app.load(
            on_load,
            None,
            [project_state, read_state, *setup_tab.load_outputs(setup)],
            api_visibility="private",
        ).then(**after_open).then(**refresh)
        # the render settings are the user's, not the project's: read per page load
        app.load(render_section.fill, None, render_section.fill_outputs(out.render),
                 api_visibility="private")
        api.register(app)
        # The UI's own events are not API: only api.ENDPOINTS are documented for clients.
        for fn in app.fns.values():
            if fn.api_name not in api.ENDPOINTS:
                fn.api_visibility = "private"
    return app


def configured_mock(project: str) -> bool:
    """A project set to the mock teacher is labelled MOCK even before its run records it."""
    try:
        return bool(control.read_settings(project).values["precompute"]["mock_teacher"])
    except (UserError, KeyError):
        return False


def header_text(project: str, info: dict) -> str:
    status = info.get("status") or "idle"
    mock = " · **MOCK**" if info.get("mock") else ""
    return f"Project `{project}` · **{status}**{mock}"
