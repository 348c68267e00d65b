"""Output tab › Kept steps and the Setup tab's plan, in process, on a project whose kept steps
are files on disk (listing and deleting read no tensors): the table, the total, Delete by the
ownership rule, the refusal of a step that is not kept, and the quantized eval line."""

from __future__ import annotations

import json

import gradio as gr

from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import control
from gguf_trainer.ui import kept_section, setup_tab


def make(tmp_path, steps=(500, 1000), **settings):
    root = tmp_path / "proj"
    control.new_project(root, "t5xxl_pixart", overrides={"train.history": True, **settings})
    paths = ProjectPaths(root)
    paths.history.mkdir(parents=True)
    for s in steps:
        paths.kept_step(s).write_bytes(b"x" * 1000 * s)
        paths.kept_side(s).write_text(json.dumps({
            "step": s, "val_cos": 0.5 + s / 1e4, "best_val_cos": 0.6, "time": 1.7e9 + s,
            "reason": "schedule", "val": {"val_cc_tokens": 0.4}}))
    return root, paths


def test_the_table_lists_kept_steps_newest_first_with_the_total(tmp_path):
    root, _ = make(tmp_path)
    md, steps = kept_section.render(str(root))
    assert md.index("| 1000 |") < md.index("| 500 |")
    assert "**2 kept step(s), 1.5 MB on disk.**" in md
    assert "| 1000 | 0.4 | 0.6 | 0.6 | 1.0 MB |" in md and "| 500 | 0.4 | 0.55 |" in md, md
    assert steps == [1000, 500]  # the rows with Export and Delete, newest first


def test_a_rows_delete_removes_that_step_and_redraws(tmp_path, monkeypatch):
    root, paths = make(tmp_path)
    md, steps = kept_section.delete_step(500, str(root))
    assert steps == [1000] and "| 500 |" not in md and not paths.kept_step(500).exists()
    warned = []
    monkeypatch.setattr(kept_section.common, "warn", lambda text, **kw: warned.append(text))
    kept_section.export_step(500, str(root))  # a stale row: refused with the sentence
    assert warned == ["step 500 is not kept; the kept steps are 1000."]


def test_the_rows_render_inside_the_output_tab():
    from gguf_trainer.ui import output_tab

    with gr.Blocks():
        with gr.Tab("Output") as tab:
            parts = output_tab.build()
        output_tab.wire(parts, gr.State(None), tab)
    assert parts.kept.steps in output_tab.outputs(parts)
    assert output_tab.outputs(parts)[-1] is parts.verified  # is_busy reads it last
    assert len(output_tab.render(None)) == len(output_tab.outputs(parts))


def test_delete_removes_the_step_and_its_sidecar_and_refuses_a_step_not_kept(tmp_path):
    root, paths = make(tmp_path)
    control.delete_kept_step(root, 500)
    assert not paths.kept_step(500).exists() and not paths.kept_side(500).exists()
    assert paths.kept_step(1000).exists()
    try:
        control.delete_kept_step(root, 500)
    except Exception as e:  # noqa: BLE001 - the sentence is what is checked
        assert str(e) == "step 500 is not kept; the kept steps are 1000."
    else:
        raise AssertionError("deleting a step that is not kept was not refused")


def test_a_linked_history_folder_is_never_deleted_through(tmp_path):
    root, paths = make(tmp_path, steps=())
    paths.history.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "step7.pt").write_bytes(b"theirs")
    paths.history.symlink_to(elsewhere)
    assert control.list_kept_steps(root)["items"] == []  # a link is not the tool's folder
    assert (elsewhere / "step7.pt").exists()


def test_no_kept_steps_says_how_to_turn_them_on(tmp_path):
    root, _ = make(tmp_path, steps=(), **{"train.history": False})
    md, _ = kept_section.render(str(root))
    assert "No kept steps" in md and "kept steps are off" in md


def test_the_setup_tab_says_what_the_schedule_makes_before_the_run(tmp_path):
    root, _ = make(tmp_path, steps=(), **{"train.steps": 20000, "train.history_every": 2000,
                                          "train.history_keep": 3})
    text = kept_section.plan_md(str(root))
    assert "10 kept step(s) every 2000 steps from step 2000 to 20000" in text
    assert "the newest 3 stay: 3 file(s) of about" in text and "last.pt is about" in text


def test_the_quantized_line_and_the_parts_build():
    ev = {"quantized": {"dtype": "q8_0", "cos_centered": 0.91, "cos_centered_f16": 0.9102,
                        "cos_centered_drop": 2e-4, "cos_to_f16": 0.99999, "bytes": 60e6,
                        "f16_bytes": 110e6}}
    line = kept_section.quant_md(ev)
    assert "q8_0 against f16" in line and "drop 2.00e-04" in line and "60.0 MB vs 110.0 MB" in line
    assert kept_section.quant_md({"quantized": None}) == ""
    with gr.Blocks():
        parts = setup_tab.build()
    assert isinstance(parts.kept_md, gr.Markdown)


def test_a_killed_write_leaves_a_tmp_that_nothing_lists_and_reset_takes_away(tmp_path):
    """kill -9 while a kept step is written leaves atomic's tmp file (never the step's name):
    not a kept step, counted by nobody, and `reset train` removes it with the folder."""
    root, paths = make(tmp_path, steps=(500,))
    (paths.history / ".step1000.pt.abc123.pt.tmp").write_bytes(b"half a pickle")
    assert [it["step"] for it in control.list_kept_steps(root)["items"]] == [500]
    info = control.status(root)
    assert info["kept"] == {"n": 1, "bytes": 500_000}
    from gguf_trainer.cli.run import format_status

    assert "  kept steps: 1 (0.00 GB); list them with gguf-trainer snapshot --project" in \
        format_status(info)
    control.reset(root, "train")
    assert not paths.history.exists()
