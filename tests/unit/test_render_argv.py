"""A prompt is a value, never a flag (issue 29, item 4): ggk's parser takes the element
after `-p` as the prompt whatever it starts with, so a prompt `-s`, `-o`, `-p`,
`--cfg-scale` or `--steps` must leave every pack's command exactly as a plain prompt leaves
it, the prompt in the one place a plain prompt takes."""

from __future__ import annotations

import pytest

from gguf_trainer import render
from gguf_trainer.packs import pack_ids
from gguf_trainer.store.project import create_project, load_project

PLAIN = "a red fox"
HOSTILE = ("-s", "-o", "-p", "--cfg-scale", "--steps", "-p=x", "--seed")


def _project(tmp_path, pack_id):
    root = tmp_path / pack_id
    student = tmp_path / "pig_clip-f16.gguf"
    student.write_bytes(b"GGUF")
    create_project(root, pack_id, overrides={"materials.student.path": str(student)})
    return load_project(root)


def _argvs(plan) -> list[list[str]]:
    return [argv for run in plan.runs for argv in (run.argv, run.cond_argv) if argv]


@pytest.mark.parametrize("pack_id", pack_ids())
def test_every_packs_command_takes_a_flag_like_prompt_as_the_prompt(tmp_path, pack_id):
    project = _project(tmp_path, pack_id)
    plain = _argvs(render.render_plan(project, PLAIN, 42, "ggk", None))
    for argv in plain:
        assert argv.count(PLAIN) == 1, argv
        assert argv[argv.index("-s") + 1] == "42" and argv.count("-s") == 1
    for prompt in HOSTILE:
        hostile = _argvs(render.render_plan(project, prompt, 42, "ggk", None))
        expected = [[prompt if a == PLAIN else a for a in argv] for argv in plain]
        assert hostile == expected, (prompt, hostile)


def test_flag_positions_skip_values():
    argv = ["ggk", "-p", "-s", "-s", "7", "--cfg-scale", "4"]
    assert render.flag_positions(argv) == {"-p": [1], "-s": [3], "--cfg-scale": [5]}


def test_the_clis_missing_list_names_its_options(tmp_path):
    """Issue 31 item 8: `gguf-trainer render` said "choose it" for the model folder; it names
    `--models DIR` and `--ggk PATH` (the GUI turns them into its fields: ui.common.gui_words),
    and a sample edit's reference image is no model file to put in the folder."""
    create_project(tmp_path / "p", "qwen3vl_mageflow")
    project = load_project(tmp_path / "p")
    plan = render.render_plan(project, "a fox", 1, ggk=None, models=None)
    said = "; ".join(plan.missing)
    assert "`gguf-trainer render --ggk PATH`" in said
    assert "`gguf-trainer render --models DIR`" in said and "choose it" not in said
    assert "sheep.png" not in said and "mmproj" not in said  # left out, and said so:
    assert "--ref-image sheep.png" in plan.text_only
    (tmp_path / "m").mkdir()
    plan = render.render_plan(project, "a fox", 1, ggk=None, models=tmp_path / "m")
    assert "--models DIR" in "; ".join(plan.missing) and "sheep.png" not in "; ".join(plan.missing)
