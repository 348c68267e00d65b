"""Output tab › "Render it in your ggk": the teacher's and the adapter's image side by side.

A thin view of runner/render_job.py (the job that runs the user's ggk; the same functions
`gguf-trainer render` calls). Without ggk, the model folder or an exported adapter the
section says what to install or point at instead of offering a button that would fail.
Images are read from renders/ and sent as pictures (the GUI serves no project files).
A timer re-reads the job's small state file; nothing is sent when nothing changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from gguf_trainer import render
from gguf_trainer.base import project_file
from gguf_trainer.base.errors import UserError
from gguf_trainer.runner import render_job
from gguf_trainer.ui import common

TICK_S = 3.0


@dataclass
class RenderParts:
    status: gr.Markdown
    ggk: gr.Textbox
    models: gr.Textbox
    files: gr.Textbox
    save: gr.Button
    prompt: gr.Textbox
    seed: gr.Number
    start: gr.Button
    stop: gr.Button
    teacher: gr.Image
    adapter: gr.Image
    result: gr.Markdown
    timer: gr.Timer
    shown: gr.State
    loaded: gr.State  # the settings the three fields were filled with (Save writes the changes)


def build() -> RenderParts:
    """The fields start empty: each page load fills them from the user settings (`fill`),
    so a reload, a second browser or a CLI `render --models` shows what is saved now."""
    with gr.Accordion("Render it in your ggk", open=True, elem_id="render-box"):
        status = gr.Markdown("", elem_id="render-status")
        with gr.Row(equal_height=True):
            ggk = gr.Textbox(
                "",
                label="ggk command (empty: `ggk` on PATH, from pip install ggk)",
                scale=2,
                elem_id="render-ggk",
            )
            models = gr.Textbox(
                "",
                label="Folder with ggk's model files (diffusion model, VAE, encoders)",
                scale=3,
                elem_id="render-models",
            )
            save = gr.Button("Save", scale=0, elem_id="btn-render-save")
        # a pack that cannot name ggk's file prints a placeholder (`<qwen3-4b .gguf>`): the
        # user's file for each, one `<placeholder>=PATH` a line (the CLI's --file)
        files = gr.Textbox(
            "",
            label="Files for the placeholders (one a line: <placeholder>=PATH; a relative PATH "
            "is in the model folder)",
            lines=2,
            elem_id="render-files",
        )
        with gr.Row(equal_height=True):
            prompt = gr.Textbox(
                "a red fox in the snow, 35mm photo",
                label="Prompt",
                scale=4,
                elem_id="render-prompt",
            )
            seed = gr.Number(
                42, label="Seed", precision=0, minimum=0, scale=1, elem_id="render-seed"
            )
            start = gr.Button("Render", variant="primary", scale=0, elem_id="btn-render")
            stop = gr.Button("Stop render", scale=0, interactive=False, elem_id="btn-render-stop")
        with gr.Row(equal_height=True):
            teacher = gr.Image(
                label="Teacher (its own text encoder)",
                type="pil",
                interactive=False,
                elem_id="render-teacher",
            )
            adapter = gr.Image(
                label="Your adapter (pig_clip + the exported GGUF)",
                type="pil",
                interactive=False,
                elem_id="render-adapter",
            )
        result = gr.Markdown("", elem_id="render-result")
    return RenderParts(
        status,
        ggk,
        models,
        files,
        save,
        prompt,
        seed,
        start,
        stop,
        teacher,
        adapter,
        result,
        gr.Timer(TICK_S),
        gr.State(None),
        gr.State(None),
    )


def fill_outputs(p: RenderParts) -> list:
    """What `fill` updates, in its order."""
    return [p.ggk, p.models, p.files, p.loaded]


def fill() -> list:
    """The three fields as the user settings hold them now, and that reading (the `loaded`
    state Save compares with). Outputs: fill_outputs()."""
    conf = render_job.render_settings()
    return [conf["ggk"], conf["models"], render_job.files_text(conf["files"]), conf]


def changed_settings(ggk: str, models: str, files: str, loaded: dict | None) -> dict:
    """The keyword arguments of save_render_settings for what the user changed since the
    fields were filled (`loaded`; None: nothing was filled, so only what was typed counts):
    an untouched field is never written back, and a placeholder line taken out of the box
    is unset while the lines the box never showed (saved meanwhile by the CLI) are kept."""
    before = loaded or {"ggk": "", "models": "", "files": {}}
    out: dict = {}
    if (ggk or "").strip() != (before.get("ggk") or ""):
        out["ggk"] = ggk or ""
    if (models or "").strip() != (before.get("models") or ""):
        out["models"] = models or ""
    now = render_job.parse_files((files or "").splitlines())
    was = dict(before.get("files") or {})
    diff = {k: v for k, v in now.items() if was.get(k) != v}
    diff.update({k: "" for k in was if k not in now})
    if diff:
        out["files"] = diff
    return out


def save(ggk: str, models: str, files: str, loaded: dict | None) -> tuple[str, list]:
    """Save what the user changed; (the sentence for the toast, fill()'s updates)."""
    changes = changed_settings(ggk, models, files, loaded)
    if not changes:
        return "nothing changed", fill()
    conf = render_job.save_render_settings(**changes)
    said = (f"ggk: {conf['ggk'] or 'on PATH'}; model files: {conf['models'] or 'not set'}; "
            f"placeholder files: {len(conf['files'])}")
    return said, fill()


def outputs(p: RenderParts) -> list:
    return [p.status, p.start, p.stop, p.teacher, p.adapter, p.result, p.files, p.shown]


def _image(root: str, path: Path | None):
    """The image as a picture (not a file path: the GUI serves no project files), or None
    when it is absent, not an image, or leads outside the project (project_file)."""
    from PIL import Image  # Gradio's own dependency

    if path is None:
        return None
    try:
        with project_file.open_file(root, path) as f, Image.open(f) as img:
            return img.copy()
    except (OSError, ValueError, Image.DecompressionBombError):  # absent, unsafe, not an image
        return None


def status_md(st: dict) -> str:
    job = st["job"]
    lines = []
    if st["missing"]:
        lines.append(
            "**Before a render**, install or point at:\n"
            + "\n".join(f"* {common.gui_words(m)}" for m in st["missing"])
        )
    if job["status"] == "running":
        phase = (job.get("progress") or {}).get("phase") or "starting"
        lines.append(f"**Rendering** (pid {job['pid']}): {phase}")
    elif job["status"] in ("failed", "interrupted"):
        lines.append(f"Last render {job['status']}: {job.get('error')}")
    elif job["status"] == "stopped":
        lines.append("Last render stopped.")
    if st.get("no_teacher"):
        lines.append(st["no_teacher"] + ".")
    if st.get("text_only"):
        lines.append(st["text_only"][0].upper() + st["text_only"][1:] + ".")
    return "\n\n".join(lines) or "Ready: type a prompt and press Render."


def result_md(record: dict | None) -> str:
    if not record:
        return ("No render yet. Each one is kept in the project's `renders/` folder "
                "with its command lines.")
    fig = record.get("figures")
    lines = [f"**{record.get('prompt')}** · seed {record.get('seed')} · `{record.get('folder')}`"]
    if fig:
        lines.append(f"Conditioning: **{render.figures_line(fig)}** — "
                     f"{record.get('figures_note')}")
    elif record.get("figures_note"):
        lines.append(record["figures_note"])
    for half, h in (record.get("halves") or {}).items():
        lines.append(f"{half}: `{h.get('command')}`")
        if h.get("cond_command"):
            lines.append(f"{half} conditioning pass: `{h['cond_command']}`")
    return "\n\n".join(lines)


OUTPUT_NAMES = ("status", "start", "stop", "teacher", "adapter", "result", "files", "shown")


def view(project: str | None, shown) -> list:
    """Updates for outputs(); everything skipped when the job, the newest render and what is
    missing are what this page already shows."""
    if not project:
        return [gr.skip()] * len(OUTPUT_NAMES)
    try:
        st = render_job.render_status(project)
    except UserError:  # a broken or vanished project: the header says what is wrong
        return [gr.skip()] * len(OUTPUT_NAMES)
    job = st["job"]
    latest = st["latest"] or {}
    sig = repr(
        (
            job["status"],
            job.get("pid"),
            (job.get("progress") or {}).get("phase"),
            latest.get("folder"),
            latest.get("finished"),
            st["missing"],
            st.get("placeholders"),
            st.get("text_only"),
        )
    )
    if sig == shown:
        return [gr.skip()] * len(OUTPUT_NAMES)
    running = job["status"] == "running"
    return [
        status_md(st),
        gr.update(interactive=not running and not st["missing"]),
        gr.update(interactive=running),
        _image(project, render_job.half_image(latest, "teacher") if latest else None),
        _image(project, render_job.half_image(latest, "adapter") if latest else None),
        result_md(st["latest"]),
        # the box for the placeholders' files only where the pack's command has some
        gr.update(visible=bool(st.get("placeholders"))),
        sig,
    ]


def wire(p: RenderParts, project: gr.State, tab: gr.Tab) -> None:
    outs = outputs(p)
    refresh = {
        "fn": view,
        "inputs": [project, p.shown],
        "outputs": outs,
        "queue": False,
        "api_visibility": "private",
    }
    p.timer.tick(**refresh)
    tab.select(lambda proj: view(proj, None), [project], outs, api_visibility="private")

    @common.shown_errors
    def do_save(ggk, models, files, loaded):
        said, ups = save(ggk, models, files, loaded)
        common.info(said, title="Render settings")
        return ups

    @common.shown_errors
    def do_render(proj, prompt, seed):
        if seed is None or float(seed) != int(seed):
            raise UserError("the seed must be a whole number")
        job = render_job.start_render(common.need_project(proj), prompt, int(seed))
        common.info(f"render started (pid {job.get('pid')})")

    @common.shown_errors
    def do_stop(proj):
        common.info(f"render: {render_job.stop_render(common.need_project(proj))}")

    reset = {
        "fn": lambda proj: view(proj, None),
        "inputs": [project],
        "outputs": outs,
        "api_visibility": "private",
    }
    p.save.click(do_save, [p.ggk, p.models, p.files, p.loaded], fill_outputs(p),
                 api_visibility="private").then(**reset)
    p.start.click(do_render, [project, p.prompt, p.seed], None, api_visibility="private").then(
        **reset
    )
    p.stop.click(do_stop, [project], None, api_visibility="private").then(**reset)
