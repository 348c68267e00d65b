"""Output tab › "Publish to the Hugging Face Hub": the exported adapter(s) and a model card to a
repo, in one commit - the same control functions `gguf-trainer publish` calls.

Says before the button what would go up (README.md is the card) or why it would be refused
(a mock-teacher or demo-student adapter, nothing exported, no login), with no request made;
the publish runs in the click's own thread and shows where it went, or its one sentence.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from gguf_trainer.runner import control
from gguf_trainer.ui import common


@dataclass
class PublishParts:
    plan: gr.Markdown
    repo: gr.Textbox
    private: gr.Checkbox
    license: gr.Textbox
    button: gr.Button
    result: gr.Markdown


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
        button = gr.Button("Publish", scale=0, min_width=200, elem_id="btn-publish")
        result = gr.Markdown("", elem_id="publish-result")
    return PublishParts(plan, repo, private, license_id, button, result)


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


def wire(p: PublishParts, project: gr.State, tab: gr.Tab) -> None:
    safe_plan = common.shown_errors(plan_md)
    tab.select(safe_plan, [project], [p.plan], api_visibility="private")

    @common.shown_errors
    def do_publish(proj, repo, private, license_id):
        from gguf_trainer.runner.publish import describe

        result = control.publish(common.need_project(proj), repo, bool(private), None,
                                 (license_id or "").strip() or None)
        lines = describe(result)
        common.info(lines[0], title="Published")
        return "\n".join(f"* {line}" for line in lines)

    p.button.click(do_publish, [project, p.repo, p.private, p.license], [p.result],
                   api_visibility="private")
