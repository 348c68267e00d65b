"""GUI error handling: a refused action is one warning in GUI words, outputs untouched."""

from __future__ import annotations

import warnings

import gradio as gr

from gguf_trainer.base.errors import UserError
from gguf_trainer.ui import common, form, train_view


def test_a_user_error_is_one_warning_and_no_error_badge():
    """gr.Error raised from a page handler leaves a red "Error" badge on every output until
    its next update (issue 24); shown_errors warns once and leaves the outputs as they were."""
    @common.shown_errors
    def handler():
        raise UserError("/x is a file, not a project folder; check the --project path")

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = handler()
    assert out == gr.skip()
    said = [str(w.message) for w in seen]
    assert said == ["/x is a file, not a project folder; choose the project folder again"], said


def test_gui_words_replace_the_cli_commands():
    said = common.gui_words(
        "the student GGUF is missing (materials.student.path is not set); link your file with "
        "`gguf-trainer link --project /p student PATH` or `gguf-trainer set --project /p "
        "materials.student.path=PATH`.")
    assert "gguf-trainer" not in said and "--project" not in said
    assert "Setup → Materials: Replace, or the student path field" in said
    said = common.gui_words("train.steps = 9; `gguf-trainer start --project /p` continues from "
                            "the last checkpoint")
    assert said == "train.steps = 9; Start (Resume) continues from the last checkpoint"


def test_a_refused_field_is_marked_in_the_error_style():
    with gr.Blocks():
        fm = form.build()
    marks = dict(
        zip(
            fm.fields,
            form.mark(
                fm, {"errors": {"train.width": "100 is not a multiple of 64"}}, "t5xxl_pixart"
            ),
        )
    )
    assert marks["train.width"]["elem_classes"] == ["field", "field-error"]
    assert marks["train.width"]["info"].startswith("⚠ 100 is not")
    assert marks["train.lr"]["elem_classes"] == ["field"]


def test_the_banner_shows_words_never_a_dict():
    info = {
        "status": "running",
        "pid": 5,
        "stage": "train",
        "stages": {},
        "message": "x",
        "jobs": {
            "snapshot": {
                "status": "running",
                "pid": 9,
                "progress": {"phase": "exporting", "updated": 1.0},
            }
        },
    }
    text = train_view.banner_text(info)
    assert "Snapshot export running (pid 9): exporting" in text and "{" not in text
