"""GUI error handling: a refused action is one warning in GUI words, outputs untouched."""

from __future__ import annotations

import warnings

import gradio as gr

from gguf_trainer.base.errors import UserError
from gguf_trainer.ui import common, form, train_view


def test_a_user_error_is_one_warning_and_no_error_badge():
    """gr.Error raised from a page handler leaves a red "Error" badge on every output until
    its next update, so one bad input looked like a broken page; shown_errors warns once and
    leaves the outputs as they were."""
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
    # a project folder with a space (render's missing student; a link-only teacher's row)
    said = common.gui_words("the student pig_clip-f16.gguf: link it (`gguf-trainer link "
                            "--project /my projects/p student PATH`)")
    assert said == ("the student pig_clip-f16.gguf: link it (Setup → Materials: Replace, or "
                    "the student path field)"), said
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


def test_sizes_are_decimal_like_the_cli_and_kill_is_the_guis_word():
    """Issue 31 item 7: 9.5 GB in the CLI was "8.8 GB" (GiB) in the GUI; the banner said
    "killed on request with gguf-trainer kill"."""
    from gguf_trainer.ui import common

    assert common.fmt_size(9.5e9) == "9.5 GB" and common.fmt_size(11e6) == "11.0 MB"
    said = common.gui_words("stopped (killed on request with gguf-trainer kill)")
    assert said == "stopped (killed with Kill)"


def test_verify_on_a_never_run_project_vouches_for_nothing():
    from gguf_trainer.runner import verify

    empty = {"shards": {s: {"ok": 0, "damaged": {}} for s in verify.SPLITS},
             "checkpoints": {}, "repaired": [], "ok": True}
    lines = verify.describe(empty, "/p")
    assert lines[-1].startswith("nothing to verify yet") and "whole" not in lines[-1]


def test_a_toast_shows_each_line_and_every_bracket(capsys):
    """Issue 31 item 7: Gradio sets a toast's message as HTML, so the download toast's lines
    ran into one paragraph and a `<placeholder>` vanished as a tag. Each line is its own, and
    the text is text; the render's missing list names the CLI's option only on the CLI."""
    from gguf_trainer.ui import materials_section

    text = materials_section.download_toast([
        {"action": "started", "message": "teacher: downloading a/b"},
        {"action": "skipped", "message": "vision: no repo; link <the Qwen3-VL mmproj .gguf>"},
    ])
    assert common.toast_html(text) == (
        "• teacher: downloading a/b<br>• vision: no repo; link &lt;the Qwen3-VL mmproj .gguf&gt;")
    common.info("a & b\nc")  # outside a page event Gradio prints it
    assert capsys.readouterr().out.strip() == "a &amp; b<br>c"
    said = common.gui_words("the folder with ggk's model files (x.gguf): set it with "
                            "`gguf-trainer render --models DIR` (remembered) or in Output › "
                            "Render it in your ggk › Folder with ggk's model files")
    assert said.endswith("set it in Output › Render it in your ggk › Folder with ggk's model files")
