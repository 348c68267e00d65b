"""Recent projects: opened ones, the last one, and the demos made from the CLI."""

from __future__ import annotations

from gguf_trainer.store.project import create_project
from gguf_trainer.ui import output_tab, recent


def test_recent_projects_include_the_demos(tmp_path, monkeypatch):
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "gt_home"))
    monkeypatch.setattr("gguf_trainer.base.paths.PROJECTS_ROOT", tmp_path / "projects")
    demo = tmp_path / "projects" / "demo_t5xxl_pixart"
    mine = tmp_path / "elsewhere" / "mine"
    create_project(demo, "t5xxl_pixart")
    create_project(mine, "t5xxl_pixart")
    assert recent.projects() == [str(demo.resolve())]  # made by `gguf-trainer demo`, never opened
    recent.remember(str(mine))
    assert recent.projects() == [str(mine.resolve()), str(demo.resolve())]


def test_output_notes_are_the_clis_in_gui_words():
    notes = output_tab.notes_md({"notes": [
        ("link your pig_clip-f16.gguf (`gguf-trainer link --project /p student PATH`); until then "
        "the command names it by its file name"),
        "this project's student is the demo's tiny stand-in, not the real pig_clip"]})
    assert notes.count("\n") == 1 and "tiny stand-in" in notes and "--project" not in notes
