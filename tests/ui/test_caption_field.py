"""The GUI's Caption endpoint field (README "Captions from the upsampler"): a text box in the
Corpus section, outside its Advanced accordion, shown for a FLUX.3 project; an address that is
not http(s) is refused next to the field in one sentence, a good one is saved; the other
caption settings sit in Advanced."""

from __future__ import annotations

import gradio as gr
import pytest

from gguf_trainer.runner import control
from gguf_trainer.store.project import create_project
from gguf_trainer.store.project_schema import get_dotted
from gguf_trainer.ui import form


@pytest.fixture(scope="module")
def built():
    with gr.Blocks():
        return form.build()


def test_the_caption_endpoint_is_a_corpus_field(built, tmp_path):
    field = built.fields["corpus.caption_endpoint"]
    assert isinstance(field.comp, gr.Textbox) and field.meta["section"] == "Corpus"
    assert not field.meta["advanced"]
    for key in ("caption_model", "caption_share", "caption_max_tokens", "caption_workers"):
        assert built.fields[f"corpus.{key}"].meta["advanced"]
    root = tmp_path / "p"
    create_project(root, "qwen3vl_flux3")
    values = control.read_settings(root).values
    shown = dict(zip(built.fields, form.fill(built, values, "qwen3vl_flux3")))
    assert shown["corpus.caption_endpoint"].get("visible")
    widgets = {k: form.to_widget(f.meta, get_dotted(values, k)) for k, f in built.fields.items()}
    widgets["corpus.caption_endpoint"] = "127.0.0.1:8080"
    bad = control.update_settings(root, form.changes(built, values, list(widgets.values())),
                                  values)
    error = bad.errors["corpus.caption_endpoint"]
    assert "is not an http(s) address; set it like http://127.0.0.1:8080/v1" in error
    assert "\n" not in error
    widgets["corpus.caption_endpoint"] = "http://127.0.0.1:8080/v1"
    good = control.update_settings(root, form.changes(built, values, list(widgets.values())),
                                   values)
    assert good.ok, good.message()
    assert control.read_settings(root).values["corpus"]["caption_endpoint"] == (
        "http://127.0.0.1:8080/v1")
