"""Output tab › Render it in your ggk, in process: what it says without ggk, and a render
kept in renders/ shown side by side with its figures and command lines."""

from __future__ import annotations

import json

import gradio as gr
from PIL import Image

from gguf_trainer.store.project import create_project
from gguf_trainer.ui import render_section


def test_without_ggk_it_says_what_to_install_and_render_is_off(tmp_path, monkeypatch):
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    root = tmp_path / "p"
    create_project(root, "llada_image")
    status, start, stop, teacher, adapter, result, files, sig = render_section.view(str(root), None)
    assert "pip install ggk" in status and "export it first" in status
    assert "ggk has no teacher path" in status  # LLaDA: the adapter's image alone
    assert start["interactive"] is False and stop["interactive"] is False
    assert teacher is None and adapter is None and "No render yet" in result
    assert files == {"__type__": "update", "visible": False}  # LLaDA's command has none
    assert render_section.view(str(root), sig) == [gr.skip()] * 8  # unchanged: nothing sent


def test_the_newest_render_is_shown_with_its_cosine_and_commands(tmp_path, monkeypatch):
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "home"))
    root = tmp_path / "p"
    create_project(root, "qwen3vl_mageflow")
    folder = root / "renders" / "20260101-000000-s7"
    folder.mkdir(parents=True)
    for half, colour in (("teacher", (0, 0, 255)), ("adapter", (255, 0, 0))):
        Image.new("RGB", (8, 8), colour).save(folder / f"{half}.png")
    record = {"prompt": "a sheep", "seed": 7, "finished": 1.0, "figures_note": "adapter vs teacher",
              "figures": {"cos": 0.91234, "cos_centered": 0.8, "rel_mse": 0.1},
              "halves": {h: {"command": f"ggk {h} -p 'a sheep'", "image": str(folder / f"{h}.png")}
                         for h in ("teacher", "adapter")}}
    (folder / "render.json").write_text(json.dumps(record))
    *_, teacher, adapter, result, _files, _sig = render_section.view(str(root), None)
    assert teacher.getpixel((0, 0)) == (0, 0, 255) and adapter.getpixel((0, 0)) == (255, 0, 0)
    assert "**all rows 0.9123 (centred 0.8000, rel_mse 0.1)**" in result
    assert "`ggk teacher -p 'a sheep'`" in result


def _render(root, images: dict) -> None:
    """A finished render in root's renders/ whose render.json records `images` per half."""
    folder = root / "renders" / "20260101-000000-s7"
    folder.mkdir(parents=True, exist_ok=True)
    record = {"prompt": "a sheep", "seed": 7, "finished": 1.0,
              "halves": {h: {"command": f"ggk {h}", "image": str(p)} for h, p in images.items()}}
    (folder / "render.json").write_text(json.dumps(record))


def test_a_render_record_naming_a_file_outside_the_project_shows_nothing(tmp_path, monkeypatch):
    """render.json is a project file anyone who can write the folder can plant: an image path
    it names outside the project (a private photo) is never read, nor a linked image."""
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "home"))
    root = tmp_path / "p"
    create_project(root, "qwen3vl_mageflow")
    private = tmp_path / "private"
    private.mkdir()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(private / "photo.png")
    _render(root, {"teacher": private / "photo.png", "adapter": root / "adapter.png"})
    folder = root / "renders" / "20260101-000000-s7"
    (folder / "adapter.png").symlink_to(private / "photo.png")
    *_, teacher, adapter, _result, _files, _sig = render_section.view(str(root), None)
    assert teacher is None and adapter is None
    (folder / "adapter.png").unlink()
    (folder / "adapter.png").write_bytes(b"not a picture")  # a broken file: nothing, no error
    assert render_section.view(str(root), None)[4] is None


def test_a_moved_projects_render_is_shown_from_where_it_is_now(tmp_path, monkeypatch):
    """render.json keeps the absolute paths of the render's time; after `mv` the images are
    the ones beside the record, never the files now at the old place (a decoy there)."""
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "home"))
    old, new = tmp_path / "old", tmp_path / "new"
    create_project(old, "qwen3vl_mageflow")
    folder = old / "renders" / "20260101-000000-s7"
    _render(old, {h: folder / f"{h}.png" for h in ("teacher", "adapter")})
    for half, colour in (("teacher", (0, 0, 255)), ("adapter", (255, 0, 0))):
        Image.new("RGB", (8, 8), colour).save(folder / f"{half}.png")
    old.rename(new)
    folder.mkdir(parents=True)  # the decoy at the old place
    for half in ("teacher", "adapter"):
        Image.new("RGB", (8, 8), (9, 9, 9)).save(folder / f"{half}.png")
    *_, teacher, adapter, _result, _files, _sig = render_section.view(str(new), None)
    assert teacher.getpixel((0, 0)) == (0, 0, 255) and adapter.getpixel((0, 0)) == (255, 0, 0)
    lines = render_section.render_job.describe(render_section.render_job.list_renders(new)[0])
    assert f"teacher:   {new / 'renders' / '20260101-000000-s7' / 'teacher.png'}" in lines


def test_a_packs_placeholders_are_named_with_the_field_that_sets_them(tmp_path, monkeypatch):
    """Z-Image's command prints `<z-image-turbo DiT .gguf>`, `<flux ae .gguf>` and the teacher's
    `<qwen3-4b .gguf>`: the section names each and this box's field (not the CLI's flag), and
    once the box's lines are saved they are no longer missing."""
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "home"))
    root = tmp_path / "p"
    create_project(root, "qwen3_zimage")
    status = render_section.view(str(root), None)[0]
    assert all(ph in status for ph in ("<z-image-turbo DiT .gguf>", "<flux ae .gguf>",
                                       "<qwen3-4b .gguf>"))
    assert "Files for the placeholders" in status and "--file" not in status
    assert render_section.view(str(root), None)[6]["visible"] is True  # the box shows
    for name in ("dit.gguf", "ae.gguf", "qwen.gguf"):
        (tmp_path / name).write_bytes(b"x")
    lines = (f"<z-image-turbo DiT .gguf>={tmp_path / 'dit.gguf'}\n"
             f"flux ae .gguf = {tmp_path / 'ae.gguf'}\n<qwen3-4b .gguf>={tmp_path / 'qwen.gguf'}")
    render_section.render_job.save_render_settings(
        files=render_section.render_job.parse_files(lines.splitlines()), replace_files=True
    )
    assert "placeholder" not in render_section.view(str(root), None)[0]


def test_each_page_load_fills_the_fields_and_save_writes_only_what_changed(tmp_path, monkeypatch):
    """Issue 31 item 2: the fields were filled once when the GUI process started; after a CLI
    `render --models` (or in a new process) they looked empty and Save wrote the empty fields
    back, losing both paths. Now each load reads the settings, and Save writes the changes."""
    from gguf_trainer.runner import render_job

    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "home"))
    render_job.save_render_settings("/opt/ggk/bin/ggk", "/models",
                                    {"<qwen3-4b .gguf>": "/m/q.gguf"})
    with gr.Blocks():
        parts = render_section.build()  # nothing is read at build time: each load fills them
    assert parts.ggk.value == "" and parts.models.value == "" and parts.files.value == ""
    ggk, models, files, loaded = render_section.fill()  # the page load
    assert (ggk, models) == ("/opt/ggk/bin/ggk", "/models") and "/m/q.gguf" in files
    # an untouched Save writes nothing
    said, _ = render_section.save(ggk, models, files, loaded)
    assert said == "nothing changed"
    # the CLI changes the model folder and adds a file while the page is open
    render_job.save_render_settings(models="/models2", files={"<vae .gguf>": "/m/vae.gguf"})
    said, (ggk2, models2, files2, _) = render_section.save("/other/ggk", models, files, loaded)
    conf = render_job.render_settings()
    assert conf["ggk"] == "/other/ggk"  # the one field the user changed
    assert conf["models"] == "/models2"  # not written back from the stale field
    assert set(conf["files"]) == {"<qwen3-4b .gguf>", "<vae .gguf>"}
    assert (ggk2, models2) == ("/other/ggk", "/models2") and "/m/vae.gguf" in files2
    # a Save on fields that were never filled (None) writes only what was typed
    assert render_section.changed_settings("", "", "", None) == {}
    # a line taken out of the box is unset; the others stay
    _, _, files3, loaded3 = render_section.fill()
    kept = "\n".join(line for line in files3.splitlines() if "vae" not in line)
    render_section.save("/other/ggk", "/models2", kept, loaded3)
    assert set(render_job.render_settings()["files"]) == {"<qwen3-4b .gguf>"}


def test_a_sample_edits_reference_image_is_no_model_file(tmp_path, monkeypatch):
    """Issue 31 item 8: Boogu's sample command edits `pig.png` (`--llm_vision <mmproj>
    --ref-image pig.png`); a render draws the typed prompt, so neither the picture nor the
    vision encoder is asked for, and the section says the render is text to image."""
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "home"))
    root = tmp_path / "p"
    create_project(root, "qwen3vl_boogu")
    models = tmp_path / "models"
    models.mkdir()
    render_section.render_job.save_render_settings(models=str(models))
    status = render_section.view(str(root), None)[0]
    assert "pig.png" in status and "text to image" in status  # said once, as what is left out
    missing, said = status.split("The render draws")
    assert "pig.png" not in missing and "mmproj" not in missing and "pig.png" in said
    plan = render_section.render_job.plan_for(root)
    argv = [a for run in plan.runs for a in run.argv]
    assert "--ref-image" not in argv and "--llm_vision" not in argv
    assert plan.placeholders and all("mmproj" not in ph for ph in plan.placeholders)
