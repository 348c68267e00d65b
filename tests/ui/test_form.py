"""The settings form is generated from the field metadata and round-trips every field: an
untouched page changes nothing, and each widget kind maps back to the schema's value."""

from __future__ import annotations

import gradio as gr
import pytest

from gguf_trainer.packs import pack_ids
from gguf_trainer.runner import control
from gguf_trainer.store.project import create_project
from gguf_trainer.store.project_schema import get_dotted
from gguf_trainer.ui import form


@pytest.fixture(scope="module")
def built():
    with gr.Blocks():
        return form.build()


@pytest.mark.parametrize("pack", pack_ids())
def test_an_untouched_page_changes_nothing(built, tmp_path, pack):
    root = tmp_path / "p"
    create_project(root, pack)
    values = control.read_settings(root).values
    shown = form.fill(built, values, pack)
    widgets = [form.to_widget(f.meta, get_dotted(values, k)) for k, f in built.fields.items()]
    assert form.changes(built, values, widgets) == {}
    pack_keys = {m["key"] for m in control.field_metadata(pack) if not m.get("hidden")}
    visible = {k for (k, _), u in zip(built.fields.items(), shown) if u.get("visible")}
    assert visible == pack_keys  # every field of the pack, nothing of another pack


def test_widgets_map_back_to_schema_values(built, tmp_path):
    root = tmp_path / "p"
    create_project(root, "t5xxl_pixart")
    values = control.read_settings(root).values
    widgets = {k: form.to_widget(f.meta, get_dotted(values, k)) for k, f in built.fields.items()}
    widgets.update({"train.width": 512.0, "corpus.files": "/a.txt\n\n /b.jsonl ",
                    "corpus.weights": '{"files": 0.5}', "precompute.mock_teacher": True})
    got = form.changes(built, values, list(widgets.values()))
    assert got == {"train.width": 512, "corpus.files": ["/a.txt", "/b.jsonl"],
                   "corpus.weights": {"files": 0.5}, "precompute.mock_teacher": True}
    assert isinstance(got["train.width"], int)
    res = control.update_settings(root, got, values)
    assert res.ok, res.message()
    widgets["corpus.weights"] = "{not json"
    bad = control.update_settings(root, form.changes(built, values, list(widgets.values())), None)
    assert "corpus.weights" in bad.errors  # refused next to the field


@pytest.mark.parametrize("key, pick", [("corpus.presets", ["vidprom", "gustavosta"]),
                                       ("corpus.image_presets", ["coco_captions"])])
def test_dataset_lists_are_multi_selects_of_the_known_ids(built, tmp_path, key, pick):
    from gguf_trainer.materials.corpus_sources import known_ids

    comp = built.fields[key].comp
    ids = known_ids(key.split(".")[1])
    assert isinstance(comp, gr.Dropdown) and comp.multiselect
    assert [c[1] for c in comp.choices] == ids and set(pick) <= set(ids)
    root = tmp_path / "p"
    create_project(root, "t5xxl_pixart")
    values = control.read_settings(root).values
    widgets = {k: form.to_widget(f.meta, get_dotted(values, k)) for k, f in built.fields.items()}
    assert widgets[key] == []
    widgets[key] = pick
    got = form.changes(built, values, list(widgets.values()))
    assert got == {key: pick}  # the schema's list of ids, nothing else moved
    res = control.update_settings(root, got, values)
    assert res.ok, res.message()
    assert get_dotted(control.read_settings(root).values, key) == pick
