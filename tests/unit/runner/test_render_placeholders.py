"""Every pack's ggk command through render_plan: a `<placeholder>` the pack prints (ggk's file
it cannot name, e.g. `<z-image-turbo DiT .gguf>`) is one argument, the user's file set for it;
unset, the render is refused before anything runs with one sentence naming each placeholder
and where to set it (the CLI's --file, the GUI's field)."""

from __future__ import annotations

import re
import shlex

import pytest

from gguf_trainer import render
from gguf_trainer.base.errors import UserError
from gguf_trainer.packs import get_pack, pack_ids
from gguf_trainer.runner import render_job
from gguf_trainer.store.project import create_project, load_project
from gguf_trainer.ui.common import gui_words

PLACEHOLDER = re.compile(r"<[^<>]+>")
SUFFIXES = (".gguf", ".safetensors", ".png")


def _project(tmp_path, pack_id):
    """A project in a folder with a space, its student linked (a path with a space too) and
    its adapter exported: only ggk's own files can be missing."""
    root = tmp_path / "my projects" / pack_id
    student = tmp_path / "my models" / "pig_clip-f16.gguf"
    student.parent.mkdir(parents=True, exist_ok=True)
    student.write_bytes(b"GGUF")
    create_project(root, pack_id, overrides={"materials.student.path": str(student)})
    project = load_project(root)
    project.final_gguf.parent.mkdir(parents=True, exist_ok=True)
    project.final_gguf.write_bytes(b"GGUF")
    return project


def _declared(pack):
    """What the pack prints, read independently of render.py: its placeholders (the engine
    command's, the teacher args') and the plain file names ggk reads from the model folder."""
    cmd = pack.engine_command(student="S.gguf", adapter="A.gguf")
    # a render draws the prompt as text to image: a sample edit's reference picture and the
    # vision encoder reading it are left out (issue 31 item 8: the picture is no model file)
    cmd = re.sub(r" --(?:ref-image|llm_vision) (?:<[^<>]+>|\S+)", "", cmd)
    teacher = pack.engine_teacher_args
    words = shlex.split(PLACEHOLDER.sub("X", f"{cmd} {teacher}"))
    plain = {w for i, w in enumerate(words) if w.endswith(SUFFIXES) and words[i - 1] != "-o"}
    return PLACEHOLDER.findall(cmd), PLACEHOLDER.findall(teacher), plain - {"S.gguf", "A.gguf"}


# the shipped packs: other test modules register test packs of their own while collecting
SHIPPED = [i for i in pack_ids()
           if type(get_pack(i)).__module__.startswith("gguf_trainer.packs.")]


@pytest.mark.parametrize("pack_id", SHIPPED)
def test_every_packs_placeholders_are_named_or_filled(tmp_path, pack_id):
    project = _project(tmp_path, pack_id)
    in_cmd, in_teacher, plain = _declared(project.pack)
    models = tmp_path / "ggk-models"
    models.mkdir()
    for name in plain:
        (models / name).write_bytes(b"x")

    plan = render.render_plan(project, "a red fox", 7, "/opt/ggk/bin/ggk", models)
    wanted = list(dict.fromkeys(in_cmd + in_teacher))
    if not wanted:
        assert plan.missing == []
    else:
        (sentence,) = plan.missing  # one sentence, naming each placeholder and how to set it
        assert all(ph in sentence for ph in wanted), sentence
        assert '--file "' in sentence and "Files for the placeholders" in sentence
        assert "--file" not in gui_words(sentence)  # the GUI names its own field

    # each placeholder's file (a folder and a name with spaces) is one argument in its place
    given = {}
    for i, ph in enumerate(wanted):
        given[ph] = tmp_path / "ggk files" / f"file {i} of {pack_id}.gguf"
        given[ph].parent.mkdir(exist_ok=True)
        given[ph].write_bytes(b"x")
    plan = render.render_plan(project, "a red fox", 7, "/opt/ggk/bin/ggk", models,
                              {ph: str(p) for ph, p in given.items()})
    assert plan.missing == []
    halves = {r.half: r for r in plan.runs}
    for run in plan.runs:
        for argv in filter(None, (run.argv, run.cond_argv)):
            assert not [a for a in argv if "<" in a or ">" in a], argv
            assert str(project.final_gguf) in argv or run.half == "teacher"
            assert argv[argv.index("-p") + 1] == "a red fox"
    adapter_argv = halves["adapter"].argv
    assert adapter_argv[adapter_argv.index("--llm") + 1] == str(project.material_path("student"))
    for ph in in_cmd:
        assert str(given[ph]) in adapter_argv
        if "teacher" in halves:
            assert str(given[ph]) in halves["teacher"].argv
    for ph in in_teacher:
        assert str(given[ph]) in halves["teacher"].argv
        assert str(given[ph]) not in adapter_argv


def test_a_relative_placeholder_file_is_a_name_in_the_model_folder(tmp_path):
    project = _project(tmp_path, "qwen3_zimage")
    files = {"<z-image-turbo DiT .gguf>": "z image turbo.gguf", "flux ae .gguf": "ae.gguf",
             "<qwen3-4b  .gguf>": "qwen3 4b.gguf"}  # brackets and spacing: the same placeholder
    plan = render.render_plan(project, "a fox", 1, "ggk", None, files)
    assert plan.missing == [(
        "the folder with ggk's model files (z image turbo.gguf, ae.gguf, qwen3 4b.gguf): set it "
        "with `gguf-trainer render --models DIR` (remembered) or in Output › Render it in your "
        "ggk › Folder with ggk's model files"
    )]
    models = tmp_path / "m"
    models.mkdir()
    (models / "z image turbo.gguf").write_bytes(b"x")
    plan = render.render_plan(project, "a fox", 1, "ggk", models, files)
    assert plan.missing == [
        (f"ae.gguf, qwen3 4b.gguf in {models}: put ggk's model files there or set the folder "
         "that holds them with `gguf-trainer render --models DIR` (remembered) or in Output › "
         "Render it in your ggk › Folder with ggk's model files")
    ]
    teacher = plan.runs[0].argv
    assert teacher[teacher.index("--llm") + 1] == "qwen3 4b.gguf" and plan.models == str(models)


def test_a_placeholder_file_that_is_not_there_is_a_sentence(tmp_path):
    project = _project(tmp_path, "qwen3vl_ideogram4")
    gone = tmp_path / "gone.gguf"
    plan = render.render_plan(project, "a fox", 1, "ggk", None,
                              {"<ideogram4 DiT .gguf>": str(gone), "<ideogram4 VAE .gguf>": ""})
    assert plan.missing == [
        f"the file set for <ideogram4 DiT .gguf>, {gone}: it is not a file; set the right path",
        ("a file for each placeholder in the pack's ggk command (<ideogram4 VAE .gguf>): set "
         'each with `gguf-trainer render --file "<ideogram4 VAE .gguf>=PATH"` (remembered) or '
         "in Output › Render it in your ggk › Files for the placeholders"),
    ]
    assert plan.models == ""  # nothing named relative to a model folder: none is asked for


def test_split_command_keeps_placeholders_and_quoted_words_whole():
    assert render.split_command('ggk --vae <flux ae .gguf> -p "a <b c> d" --llm \'/x y/s.gguf\'') \
        == ["ggk", "--vae", "<flux ae .gguf>", "-p", "a <b c> d", "--llm", "/x y/s.gguf"]
    assert render.placeholders(["<a b>", "-p", "a <b c> d", "<a b>"]) == ["<a b>"]


def test_placeholder_files_are_remembered_merged_and_unset(tmp_path):
    assert render_job.parse_files(["z-image-turbo DiT .gguf=~/m/z.gguf", " "]) == {
        "<z-image-turbo DiT .gguf>": "~/m/z.gguf"
    }
    with pytest.raises(UserError, match='"<placeholder>=PATH"'):
        render_job.parse_files(["/m/z.gguf"])
    with pytest.raises(UserError, match="not a placeholder's file"):
        render_job.parse_files(["<>=/m/z.gguf"])
    render_job.save_render_settings(files={"<a .gguf>": "/m/a.gguf", "<b .gguf>": "b.gguf"})
    render_job.save_render_settings(files={"<a .gguf>": "", "<c .gguf>": "~/c.gguf"})
    files = render_job.render_settings()["files"]
    assert files["<b .gguf>"] == "b.gguf" and "<a .gguf>" not in files
    assert not files["<c .gguf>"].startswith("~")
    render_job.save_render_settings(files={"<d .gguf>": "/d.gguf"}, replace_files=True)
    assert render_job.render_settings()["files"] == {"<d .gguf>": "/d.gguf"}
    assert render_job.parse_files(render_job.files_text({"<d .gguf>": "/d.gguf"}).splitlines()) \
        == {"<d .gguf>": "/d.gguf"}
