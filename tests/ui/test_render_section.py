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
    status, start, stop, teacher, adapter, result, sig = render_section.view(str(root), None)
    assert "pip install ggk" in status and "export it first" in status
    assert "ggk has no teacher path" in status  # LLaDA: the adapter's image alone
    assert start["interactive"] is False and stop["interactive"] is False
    assert teacher is None and adapter is None and "No render yet" in result
    assert render_section.view(str(root), sig) == [gr.skip()] * 7  # unchanged: nothing sent


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
    _status, _start, _stop, teacher, adapter, result, _sig = render_section.view(str(root), None)
    assert teacher.getpixel((0, 0)) == (0, 0, 255) and adapter.getpixel((0, 0)) == (255, 0, 0)
    assert "cosine **0.9123**" in result and "`ggk teacher -p 'a sheep'`" in result


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
    _status, _start, _stop, teacher, adapter, _result, _sig = render_section.view(str(root), None)
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
    _status, _start, _stop, teacher, adapter, _result, _sig = render_section.view(str(new), None)
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
    for name in ("dit.gguf", "ae.gguf", "qwen.gguf"):
        (tmp_path / name).write_bytes(b"x")
    lines = (f"<z-image-turbo DiT .gguf>={tmp_path / 'dit.gguf'}\n"
             f"flux ae .gguf = {tmp_path / 'ae.gguf'}\n<qwen3-4b .gguf>={tmp_path / 'qwen.gguf'}")
    render_section.render_job.save_render_settings(
        files=render_section.render_job.parse_files(lines.splitlines()), replace_files=True
    )
    assert "placeholder" not in render_section.view(str(root), None)[0]
