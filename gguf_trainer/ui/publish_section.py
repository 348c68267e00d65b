"""Output tab › "Publish to the Hugging Face Hub": the exported adapter(s) and a model card to a
repo, in one commit - what `gguf-trainer publish` does (runner/publish.py), as a detached job.

Says before the button what would go up (README.md is the card) or why it would be refused
(a mock-teacher or demo-student adapter, nothing exported, no login), with no request made.
Publish starts runner/publish_job.py's detached job (those refusals come first, as a toast);
a timer re-reads its small state file, so the box shows the phase while it runs and then where
it went, or its one sentence, after a page reload or a GUI restart too, and a publish the CLI
runs as well. Stop ends the upload; publishing again sends only what the Hub lacks.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from gguf_trainer.base.errors import UserError
from gguf_trainer.runner import control, publish_job
from gguf_trainer.ui import common

TICK_S = 3.0


@dataclass
class PublishParts:
    plan: gr.Markdown
    repo: gr.Textbox
    private: gr.Checkbox
    license: gr.Textbox
    button: gr.Button
    stop: gr.Button
    result: gr.Markdown
    timer: gr.Timer
    shown: gr.State  # the job state the box shows (view skips an unchanged one)


def build() -> PublishParts:
    with gr.Accordion("Publish to the Hugging Face Hub", open=False, elem_id="publish-box"):
        plan = gr.Markdown("", elem_id="publish-plan")
        with gr.Row(equal_height=True):
            repo = gr.Textbox("", label="Repo (USER/NAME; created when missing)", scale=3,
                              elem_id="publish-repo")
            license_id = gr.Textbox("", label="License (empty: the teacher's)", scale=1,
                                    elem_id="publish-license")
            private = gr.Checkbox(False, label="Private (a new repo)", scale=1,
                                  elem_id="publish-private")
        with gr.Row(equal_height=True):
            button = gr.Button("Publish", scale=0, min_width=200, elem_id="btn-publish")
            stop = gr.Button("Stop publish", scale=0, interactive=False,
                             elem_id="btn-publish-stop")
        result = gr.Markdown("", elem_id="publish-result")
    return PublishParts(plan, repo, private, license_id, button, stop, result,
                        gr.Timer(TICK_S), gr.State(None))


def plan_md(project: str | None) -> str:
    """What Publish would send, or the sentence it would refuse with."""
    if not project:
        return ""
    plan = control.publish_plan(project)
    if plan["refused"]:
        return f"Publish is not possible yet: {common.gui_words(plan['refused'])}"
    lines = ["Publish sends " + ", ".join(f"`{n}`" for n in plan["files"])
             + " (the model card) in one commit, and nothing else from the project."]
    if not plan["logged_in"]:
        lines.append("No Hugging Face token is stored: log in under Setup → Materials first.")
    return "\n\n".join(lines)


def status_md(job: dict) -> str:
    """The publish job as the box says it: the phase while it runs, then the repo URL and
    commit, or the one sentence it failed with."""
    from gguf_trainer.runner.publish import describe

    status = job["status"]
    if status == "running":
        phase = (job.get("progress") or {}).get("phase") or "starting"
        return f"**Publishing** (pid {job['pid']}): {phase}"
    if status == "done" and isinstance(job.get("result"), dict):
        try:
            lines = describe(job["result"], private_word="Private")
        except (KeyError, TypeError):  # a state file written by hand: not a result
            return "Last publish done."
        return "\n".join(f"* {common.gui_words(line)}" for line in lines)
    if status in ("failed", "interrupted"):
        return f"Last publish {status}: {common.gui_words(job.get('error') or '')}"
    if status == "stopped":
        return ("Last publish stopped before its commit; publishing again sends only what "
                "the Hub lacks.")
    return ""


OUTPUT_NAMES = ("button", "stop", "result", "shown")


def view(project: str | None, shown) -> list:
    """Updates for [button, stop, result, shown]; all skipped when the job is as shown."""
    if not project:
        return [gr.skip()] * len(OUTPUT_NAMES)
    try:
        job = publish_job.publish_status(project)
    except UserError:  # a broken or vanished project: the header says what is wrong
        return [gr.skip()] * len(OUTPUT_NAMES)
    sig = repr((job["status"], job.get("pid"), job.get("job_id"), job.get("finished"),
                (job.get("progress") or {}).get("phase")))
    if sig == shown:
        return [gr.skip()] * len(OUTPUT_NAMES)
    running = job["status"] == "running"
    return [gr.update(interactive=not running), gr.update(interactive=running),
            status_md(job), sig]


def wire(p: PublishParts, project: gr.State, tab: gr.Tab) -> None:
    safe_plan = common.shown_errors(plan_md)
    outs = [p.button, p.stop, p.result, p.shown]
    tab.select(safe_plan, [project], [p.plan], api_visibility="private")
    tab.select(lambda proj: view(proj, None), [project], outs, api_visibility="private")
    p.timer.tick(view, [project, p.shown], outs, queue=False, api_visibility="private")

    @common.shown_errors
    def do_publish(proj, repo, private, license_id):
        job = publish_job.start_publish(common.need_project(proj), repo, bool(private), None,
                                        (license_id or "").strip() or None)
        common.info(f"publish started (pid {job.get('pid')}); it goes on if you close the page")

    @common.shown_errors
    def do_stop(proj):
        common.info(f"publish: {publish_job.stop_publish(common.need_project(proj))}")

    reset = {"fn": lambda proj: view(proj, None), "inputs": [project], "outputs": outs,
             "api_visibility": "private"}
    p.button.click(do_publish, [project, p.repo, p.private, p.license], None,
                   api_visibility="private").then(**reset)
    p.stop.click(do_stop, [project], None, api_visibility="private").then(**reset)
