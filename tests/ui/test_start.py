"""Start on the Train tab, through its handler function: unsaved Setup changes are saved
first with compare-and-set (a conflict or a bad value starts nothing and is shown next to
the field), and required materials that are not ready are named before starting."""

from __future__ import annotations

import gradio as gr
import pytest

from gguf_trainer.runner import control
from gguf_trainer.store.project import create_project
from gguf_trainer.store.project_schema import get_dotted
from gguf_trainer.ui import form, train_start


@pytest.fixture(scope="module")
def fm():
    with gr.Blocks():
        return form.build()


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "gt_home"))
    monkeypatch.delenv("GGUF_TRAINER_MATERIALS", raising=False)
    monkeypatch.delenv("GGUF_TRAINER_MOCK_TEACHER", raising=False)


@pytest.fixture
def launched(monkeypatch):
    """control.start recorded instead of launching a pipeline."""
    calls = []
    monkeypatch.setattr(control, "start", lambda root, **kw: calls.append(str(root)) or 4242)
    return calls


def page(fm, root):
    """(the page's read state, its widget values) right after opening `root`."""
    got = control.read_settings(root)
    read = {"values": got.values, "version": got.version}
    widgets = {k: form.to_widget(f.meta, get_dotted(got.values, k)) for k, f in fm.fields.items()}
    return read, widgets


def test_start_saves_unsaved_changes_then_starts_and_names_missing_materials(
    fm, tmp_path, launched
):
    root = tmp_path / "p"
    create_project(root, "t5xxl_pixart")
    read, widgets = page(fm, root)
    widgets["train.lr"] = 1e-3
    out = train_start.start_from_page(fm, str(root), read, list(widgets.values()))
    assert out.started and out.pid == 4242 and launched == [str(root)]
    assert control.read_settings(root).values["train"]["lr"] == 1e-3  # saved before the start
    label = fm.fields["train.lr"].meta["label"]
    assert (
        f"Saved your Setup changes: {label} (train.lr)." in out.message
        and out.saved.message == "Saved."
    )
    assert out.saved.read["values"]["train"]["lr"] == 1e-3  # the page now reads what it saved
    titles = " ".join(out.missing)
    assert "Student: pig_clip GGUF (missing)" in titles and "teacher" in titles.lower()
    assert "Student" in train_start.missing_warning(out.missing)
    # nothing unsaved and nothing missing that is wanted: no save, and the mock teacher is not asked
    # for
    control.update_settings(root, {"precompute.mock_teacher": True}, None)
    read, widgets = page(fm, root)
    out = train_start.start_from_page(fm, str(root), read, list(widgets.values()))
    assert out.started and out.saved is None and not any("T5" in m for m in out.missing)


def test_a_change_made_on_disk_since_the_page_read_it_starts_nothing(fm, tmp_path, launched):
    root = tmp_path / "p"
    create_project(root, "t5xxl_pixart")
    read, widgets = page(fm, root)
    control.set_steps(root, "12k")  # `gguf-trainer set --steps 12k` from a terminal
    widgets["train.steps"] = 5000
    widgets["train.lr"] = 1e-3
    out = train_start.start_from_page(fm, str(root), read, list(widgets.values()))
    assert not out.started and launched == [] and "Not started" in out.message
    assert set(out.saved.result["conflicts"]) == {"train.steps"}
    now = control.read_settings(root).values["train"]
    # not overwritten; and (issue 31 item 5: a stray Steps=12 was kept, then "Not started") a
    # Start that does not start keeps none of the other changes either
    assert now["steps"] == 12000 and now["lr"] == read["values"]["train"]["lr"] != 1e-3
    assert "nothing saved" in out.message
    marks = dict(zip(fm.fields, out.saved.marks))
    assert "changed on disk to 12000" in marks["train.steps"]["info"]


def test_an_invalid_change_starts_nothing_and_writes_nothing(fm, tmp_path, launched):
    root = tmp_path / "p"
    create_project(root, "t5xxl_pixart")
    before = (root / "project.json").read_bytes()
    read, widgets = page(fm, root)
    widgets["train.width"] = 100
    out = train_start.start_from_page(fm, str(root), read, list(widgets.values()))
    assert not out.started and launched == [] and (root / "project.json").read_bytes() == before
    marks = dict(zip(fm.fields, out.saved.marks))
    assert marks["train.width"]["info"].startswith("⚠ train.width: 100 is not")


def test_a_refused_start_is_the_control_sentence_after_the_save(fm, tmp_path):
    root = tmp_path / "p"
    create_project(root, "t5xxl_pixart")
    read, widgets = page(fm, root)
    widgets["train.lr"] = 1e-3
    before = control.read_settings(root).values["train"]["lr"]
    out = train_start.start_from_page(fm, str(root), read, list(widgets.values()))
    assert not out.started  # refused by control.start (no student)
    assert f"gguf-trainer link --project {root.resolve()} student PATH" in out.message
    # Issue 31 item 5: a Start that does not start saves nothing; the edit stays in the field
    assert control.read_settings(root).values["train"]["lr"] == before != 1e-3
    assert "were not saved" in out.message and out.saved.read == read


def test_start_never_saves_a_field_this_project_does_not_show(fm, tmp_path, launched):
    """Issue 24: a hidden field keeps what the previous project put in it (fill() only hides
    it); Start saved that as an edit. Only fields shown for this project's pack are compared."""
    root = tmp_path / "p"
    create_project(root, "qwen3vl_mageflow")
    read, widgets = page(fm, root)
    hidden = sorted(set(fm.fields) - form.shown_keys("qwen3vl_mageflow") - set(form.READ_ONLY))
    assert "precompute.t5_window" in hidden  # PixArt's, hidden for MageFlow
    widgets["precompute.t5_window"] = 300  # left there by a PixArt project opened before
    before = (root / "project.json").read_bytes()
    out = train_start.start_from_page(fm, str(root), read, list(widgets.values()))
    assert out.started and out.saved is None and (root / "project.json").read_bytes() == before


def test_start_on_a_finished_project_says_done_and_offers_more_steps(fm, tmp_path, launched):
    from gguf_trainer.base import atomic
    from gguf_trainer.runner.state import empty_state

    root = tmp_path / "p"
    create_project(root, "t5xxl_pixart", overrides={"train.steps": 800})
    st = empty_state()
    st.update(
        status="done",
        stage="eval",
        step=800,
        steps=800,
        stages={"train": {"status": "done", "done": 800, "total": 800, "unit": "steps"}},
    )
    atomic.write_json(root / "state.json", st)
    read, widgets = page(fm, root)
    out = train_start.start_from_page(fm, str(root), read, list(widgets.values()))
    assert not out.started and launched == [] and out.suggest_steps == 1800
    assert "already done (800 / 800 steps)" in out.message and "1800" in out.message
    control.set_steps(root, 1800)  # Apply the offer: Start trains further
    out = train_start.start_from_page(fm, str(root), read, list(widgets.values()))
    assert out.started and launched == [str(root)]

