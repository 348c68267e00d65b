"""Output tab › Publish to the Hugging Face Hub, in process: before the button it says what
would go up, or the sentence publish would refuse with, and no request is made for either; after
it, each state of the publish job in a line."""

from __future__ import annotations

import gradio as gr
from publish_project import make_project

from gguf_trainer.ui import publish_section


def test_the_box_names_what_goes_up_and_asks_for_a_login(hub_server, tmp_path):
    project, final = make_project(tmp_path)
    shown = publish_section.plan_md(str(project.dir))
    assert f"`{final.name}`, `README.md` (the model card) in one commit" in shown
    assert "No Hugging Face token is stored" in shown
    assert hub_server.requests == []


def test_the_box_says_why_a_mock_adapter_cannot_be_published(hub_server, tmp_path):
    project, _ = make_project(tmp_path, mock=True)
    shown = publish_section.plan_md(str(project.dir))
    assert shown.startswith("Publish is not possible yet:") and "mock teacher" in shown
    assert hub_server.requests == []


def test_the_box_builds_inside_the_output_tab():
    from gguf_trainer.ui import output_tab

    with gr.Blocks():
        with gr.Tab("Output") as tab:
            parts = output_tab.build()
        output_tab.wire(parts, gr.State(None), tab)
    assert parts.publish.button.value == "Publish" and parts.publish.private.value is False


def test_the_box_says_each_state_of_the_publish_job_in_one_line():
    base = {"pid": None, "progress": {}, "error": None, "result": None}
    assert publish_section.status_md({**base, "status": "idle"}) == ""
    assert publish_section.status_md({**base, "status": "running", "pid": 7, "progress": {
        "phase": "uploading a.gguf, README.md to me/x"}}) == (
        "**Publishing** (pid 7): uploading a.gguf, README.md to me/x")
    done = {"url": "https://huggingface.co/me/x", "commit": "0123456789abcdef", "created": False,
            "changed": True, "files": ["a.gguf", "README.md"], "visibility_kept": True}
    assert publish_section.status_md({**base, "status": "done", "result": done}) == (
        "* published a.gguf, README.md to https://huggingface.co/me/x (commit 0123456789).\n"
        "* the repo existed already, so Private left its visibility as it was; change it in "
        "the repo's settings on the Hub.")
    # a state file edited by hand is a plain line, never a traceback
    assert publish_section.status_md({**base, "status": "done", "result": {"url": 1}}) == (
        "Last publish done.")
    assert publish_section.status_md({**base, "status": "failed", "error": "the Hub said no."}) == (
        "Last publish failed: the Hub said no.")
    assert "publishing again sends only what the Hub lacks" in publish_section.status_md(
        {**base, "status": "stopped"})
