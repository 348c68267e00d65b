"""Output tab: exported files, Export GGUF, snapshots, the evaluation, the ggk command,
Verify (re-read every shard and checkpoint in a detached job; its report shows here) and
Publish (publish_section.py).

Reads exports.json, eval.json and snapshots.json through the control API on tab select, on
Refresh, and on a tick that saw state.json change. Files are listed by path, never copied
into Gradio's cache (multi-GB files stay where they are).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from gguf_trainer.data.lead import lead_line
from gguf_trainer.runner import control
from gguf_trainer.ui import api, common, kept_section, publish_section, render_section

QUANT_ADVICE = (
    "The adapter was trained against the **f16** student, and the engine should load the same "
    "file: a quantized `pig_clip` (q8_0, q4_k …) changes the hidden states the adapter reads "
    "and lowers the cosine. Keep the student at f16 unless you have evaluated the quantized one.")


@dataclass
class OutputParts:
    refresh: gr.Button
    export: gr.Button
    snapshot: gr.Button
    exports: gr.Markdown
    evaluation: gr.Markdown
    snapshots: gr.Markdown
    ggk: gr.Textbox
    notes: gr.Markdown
    advice: gr.Markdown
    verify: gr.Button
    verified: gr.Markdown
    render: render_section.RenderParts
    publish: publish_section.PublishParts
    kept: kept_section.KeptParts


def build() -> OutputParts:
    with gr.Row():
        refresh = gr.Button("Refresh", scale=0)
        export = gr.Button("Export GGUF (from best.pt)", elem_id="btn-export")
        snapshot = gr.Button("Export snapshot (latest step)", elem_id="btn-out-snapshot")
    exports = gr.Markdown("", elem_id="out-exports")
    evaluation = gr.Markdown("", elem_id="out-eval")
    snapshots = gr.Markdown("", elem_id="out-snapshots")
    kept = kept_section.build()
    ggk = gr.Textbox("", label="Use it in ggk", lines=3, interactive=False, buttons=["copy"],
                     elem_id="ggk-command")
    notes = gr.Markdown("", elem_id="ggk-notes")
    advice = gr.Markdown(QUANT_ADVICE)
    with gr.Row():
        verify = gr.Button("Verify shards and checkpoints", scale=0, min_width=300,
                           elem_id="btn-out-verify")
    verified = gr.Markdown("", elem_id="out-verify")
    render = render_section.build()
    publish = publish_section.build()
    return OutputParts(
        refresh,
        export,
        snapshot,
        exports,
        evaluation,
        snapshots,
        ggk,
        notes,
        advice,
        verify,
        verified,
        render,
        publish,
        kept,
    )


def outputs(p: OutputParts) -> list:
    # the verify report stays last (is_busy reads it there)
    return [p.exports, p.evaluation, p.snapshots, p.ggk, p.notes,
            *kept_section.outputs(p.kept), p.verified]


VERIFY_RUNNING = "### Verify\nRe-reading every shard and checkpoint…"


def verify_md(job: dict) -> str:
    """The verify job's report (`gguf-trainer verify`'s lines), or where it stands."""
    status = job.get("status")
    if status == "running":
        return VERIFY_RUNNING
    result = job.get("result") if isinstance(job.get("result"), dict) else {}
    if status == "done" and result.get("lines"):
        return "### Verify\n" + "\n".join(f"* {common.gui_words(line)}" for line in result["lines"])
    if status in ("failed", "interrupted"):
        return f"### Verify\nVerify did not finish: {job.get('error') or status}"
    return ""


def notes_md(res: dict | None) -> str:
    """The notes `gguf-trainer results` prints under the command (the demo's stand-in student,
    where ggk's own model files must be, a companion left out), in GUI words."""
    notes = (res or {}).get("notes") or []
    return "\n".join(f"* {common.gui_words(n)}" for n in notes)


def _exports_md(project: str) -> str:
    rows = [
        [
            Path(e["path"]).name,
            e.get("kind", ""),
            common.fmt_size(e.get("size")),
            common.fmt_time(e.get("time")),
            "yes" if e.get("exists", True) else "**missing**",
            e["path"],
        ]
        for e in control.list_exports(project)
    ]
    return "### Exported files\n" + (
        common.md_table(["file", "kind", "size", "time", "on disk", "path"], rows)
        or "Nothing exported yet."
    )


def _eval_md(project: str, pack: dict | None) -> str:
    ev = control.read_eval(project)
    if not ev:
        return "### Evaluation\nNo evaluation yet (it runs after the export)."
    keys = list((pack or {}).get("eval_keys") or []) or [
        k for k, v in (ev.get("metrics") or {}).items() if isinstance(v, float)
    ]
    metrics = ev.get("metrics") or {}
    base = ev.get("baseline") or {}
    rows = [
        [k, common.fmt(metrics.get(k)), common.fmt(base.get(f"baseline_{k}"))]
        for k in keys
        if k in metrics
    ]
    head = f"### Evaluation of `{Path(ev.get('gguf') or '').name}`"
    if ev.get("mock"):
        head += "\n**MOCK teacher** — " + (ev.get("note") or "a smoke test, not a usable adapter")
    beats = {True: "beats the mean baseline; ", False: "does NOT beat the mean baseline; "}.get(
        ev.get("beats_baseline"), ""
    )
    lines = [
        head,
        (
            f"headline **{ev.get('headline')} = {common.fmt(ev.get('val_cos'))}**, {beats}"
            f"trained {common.fmt(ev.get('trained_steps'))} of "
            f"{common.fmt(ev.get('planned_steps'))} "
            f"steps; evaluated {common.fmt_time(ev.get('time'))}"
        ),
        common.md_table(["metric", "value", "mean baseline"], rows),
    ]
    lead = lead_line(ev.get("lead")) if isinstance(ev.get("lead"), dict) else None
    if lead:  # the rows the DiT reads, each set centred on its own mean, lead the summary
        lines.insert(1, f"**{lead}**")
    quant = kept_section.quant_md(ev)  # export.dtype q8_0 / bf16 against the f16 file
    if quant:
        lines.append(quant)
    for key in ("health", "reference"):  # absent on versions and teachers without them
        val = ev.get(key)
        if isinstance(val, str) and val:
            lines.append(f"**{key.capitalize()}:** {val}")
        elif isinstance(val, dict) and val:
            lines.append(
                f"**{key.capitalize()}**\n"
                + "\n".join(f"* {k}: {common.fmt(v)}" for k, v in val.items())
            )
        elif isinstance(val, list) and val:
            lines.append(f"**{key.capitalize()}**\n" + "\n".join(f"* {v}" for v in val))
    return "\n\n".join(lines)


def _snapshots_md(project: str) -> str:
    rows = []
    for s in control.list_snapshots(project):
        ev = s.get("eval") or {}
        pct = (
            f" ({100 * s['step'] / s['planned_steps']:.0f}%)"
            if s.get("step") and s.get("planned_steps")
            else ""
        )
        rows.append(
            [
                f"{s.get('step')}{pct}",
                s.get("planned_steps"),
                s.get("checkpoint"),
                common.fmt(s.get("val_cos")),
                common.fmt(ev.get("headline")),
                Path(s.get("path") or "").name,
                common.fmt_size(s.get("size")),
            ]
        )
    return "### Snapshots\n" + (
        common.md_table(["step", "planned", "checkpoint", "val cos", "eval", "file", "size"], rows)
        or "No snapshots yet (Train tab › Export snapshot)."
    )


def render(project: str | None) -> list:
    if not project:
        return ["", "", "", "", "", *kept_section.render(None), ""]
    view = control.open_project(project)
    res = control.results(project) if hasattr(control, "results") else {}
    return [
        _exports_md(project),
        _eval_md(project, view.pack),
        _snapshots_md(project),
        (res or {}).get("ggk") or "(export the adapter first)",
        notes_md(res),
        *kept_section.render(project),
        verify_md(control.verify_job(project)),
    ]


def is_busy(shown: list) -> bool:
    """Whether render()'s view shows a job still running (the tick then reads it again even
    when no file changed: a job that dies writes nothing)."""
    return shown[-1] == VERIFY_RUNNING


def wire(p: OutputParts, project: gr.State, tab: gr.Tab) -> None:
    safe_render = common.shown_errors(render)
    p.refresh.click(safe_render, [project], outputs(p), api_visibility="private")
    tab.select(safe_render, [project], outputs(p), api_visibility="private")

    @common.shown_errors
    def do_export(proj):
        api.export(common.need_project(proj))
        common.info("export + eval started from best.pt; follow it on the Train tab")

    @common.shown_errors
    def do_snapshot(proj):
        job = api.snapshot(common.need_project(proj), "last", False)
        common.info(f"snapshot export started (pid {job.get('pid')})")

    render_section.wire(p.render, project, tab)
    kept_section.wire(p.kept, project)
    publish_section.wire(p.publish, project, tab)
    p.export.click(do_export, [project], None, api_visibility="private")
    p.snapshot.click(do_snapshot, [project], None, api_visibility="private")

    @common.shown_errors
    def do_verify(proj):
        job = control.start_verify(common.need_project(proj))
        common.info(f"verify started (pid {job.get('pid')}); its report shows here when it ends")
        return verify_md(control.verify_job(proj))

    p.verify.click(do_verify, [project], [p.verified], api_visibility="private")
