"""`gguf-trainer render` and its job against a stand-in `ggk` (tests/e2e/stand_in_ggk.py) that
writes an image and the SD_DUMP_COND files as the real engine does: both halves run with the
pack's command lines, the cosine comes from the dumps, each result is kept in renders/ with
its command lines, one render per project, Stop ends it and its ggk, and what is missing is
said before anything runs."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import cli_at_home

from gguf_trainer.base.errors import UserError
from gguf_trainer.check import compare
from gguf_trainer.runner import jobs, render_job
from gguf_trainer.store.project import create_project, load_project

STAND_IN = Path(__file__).with_name("stand_in_ggk.py")
MAGEFLOW_FILES = ("mageflow-edit-turbo-nvfp4.gguf", "pig_mageflow_vae_fp32-f16.gguf",
                  "mmproj-qwen3vl-4b-it-f16.gguf", "sheep.png", "Qwen3-VL-4B-Instruct-f16.gguf")


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A MageFlow project with a student and an exported adapter file, ggk's model folder,
    and the stand-in installed as `ggk` on PATH (what `pip install ggk` gives)."""
    home = tmp_path / "home"
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(home))
    monkeypatch.setenv("HOME", str(home))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ggk = bin_dir / "ggk"
    ggk.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(STAND_IN))} "$@"\n'
    )
    ggk.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    root = tmp_path / "p"
    student = tmp_path / "pig_clip-f16.gguf"
    student.write_bytes(b"GGUF")  # the stand-in never reads it; the real ggk would
    create_project(root, "qwen3vl_mageflow", overrides={"materials.student.path": str(student)})
    adapter = load_project(root).final_gguf
    adapter.parent.mkdir(parents=True, exist_ok=True)
    adapter.write_bytes(b"GGUF")
    models = tmp_path / "ggk-models"
    models.mkdir()
    return root, models, home


def test_missing_pieces_are_named_before_anything_runs(setup, monkeypatch):
    root, models, _home = setup
    with pytest.raises(UserError) as err:
        render_job.start_render(root, "a sheep", 7)
    assert "the folder with ggk's model files (mageflow-edit-turbo-nvfp4.gguf" in str(err.value)
    render_job.save_render_settings(models=str(models))
    (models / "sheep.png").write_bytes(b"png")
    with pytest.raises(UserError, match="mageflow-edit-turbo-nvfp4.gguf, pig_mageflow_vae"):
        render_job.start_render(root, "a sheep", 7)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert any("pip install ggk" in m for m in render_job.render_status(root)["missing"])
    assert not (root / "renders").exists()  # nothing ran


def test_render_both_halves_with_the_dump_cosine(setup):
    root, models, home = setup
    for name in MAGEFLOW_FILES:
        (models / name).write_bytes(b"x")
    res = cli_at_home(
        "render",
        "--project",
        root,
        "--prompt",
        "a sheep in sunglasses",
        "--seed",
        "7",
        "--models",
        models,
        "--wait",
        home=home,
    )
    assert res.returncode == 0, res.stderr + res.stdout
    (folder,) = (root / "renders").iterdir()
    record = json.loads((folder / "render.json").read_text())
    teacher, adapter = record["halves"]["teacher"], record["halves"]["adapter"]
    # the pack's command for each half: the adapter's --llm/--llm-adapter, the teacher's own LLM
    assert (
        "--llm-adapter" in adapter["command"]
        and str(load_project(root).final_gguf) in adapter["command"]
    )
    assert (
        "--llm-adapter" not in teacher["command"]
        and "Qwen3-VL-4B-Instruct-f16.gguf" in teacher["command"]
    )
    for h in (teacher, adapter):
        argv = shlex.split(h["command"])
        assert (
            argv[argv.index("-p") + 1] == "a sheep in sunglasses"
            and argv[argv.index("-s") + 1] == "7"
        )
        assert Path(h["image"]).read_bytes().startswith(b"\x89PNG")
    # MageFlow's command already runs at CFG 1: its own dump is the prompt's, no extra pass
    assert "cond_command" not in adapter
    ref = np.fromfile(folder / "teacher-dump" / "llm_hidden.bin", "<f4").reshape(
        len("a sheep in sunglasses"), -1
    )
    pred = np.fromfile(folder / "adapter-dump" / "adapter_out.bin", "<f4").reshape(ref.shape)
    assert record["figures"]["cos"] == pytest.approx(compare(pred, ref)["cos"], rel=1e-9)
    assert "adapter vs teacher" in record["figures_note"]
    assert f"all rows {record['figures']['cos']:.4f}" in res.stdout  # after the lead figures
    assert render_job.list_renders(root)[0]["prompt"] == "a sheep in sunglasses"


def test_one_render_per_project_and_stop_ends_it(setup, monkeypatch):
    root, models, _home = setup
    for name in MAGEFLOW_FILES:
        (models / name).write_bytes(b"x")
    render_job.save_render_settings(models=str(models))
    monkeypatch.setenv("STAND_IN_SLEEP_S", "120")
    st = render_job.start_render(root, "a slow sheep", 1)
    assert st["status"] == "running"
    with pytest.raises(UserError, match="already running"):
        render_job.start_render(root, "another", 2)
    deadline = time.monotonic() + 60  # the job is inside its first ggk run
    while "rendering" not in str(jobs.job_status(root, "render")["progress"].get("phase")):
        assert time.monotonic() < deadline, jobs.job_status(root, "render")
        time.sleep(0.2)
    assert render_job.stop_render(root) == "stopped"
    assert jobs.job_status(root, "render")["status"] == "stopped"
    log = next((root / "renders").iterdir()) / "teacher.log"
    # killed in its sleep: it never wrote the image (no log: stopped before ggk even started,
    # the phase is set just before the process is)
    assert not log.exists() or "stand-in ggk" not in log.read_text()
    assert not (log.parent / "teacher.png").exists()


def test_a_family_without_a_teacher_path_renders_the_adapter_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "home"))
    root = tmp_path / "llada"
    create_project(root, "llada_image")
    plan = render_job.plan_for(root, "a sheep", 3)
    assert [r.half for r in plan.runs] == ["adapter"]
    assert "ggk has no teacher path for" in plan.no_teacher
    pixart = tmp_path / "pixart"
    create_project(pixart, "t5xxl_pixart")
    plan = render_job.plan_for(pixart, "a fox", 3)
    teacher, adapter = plan.runs
    assert "--t5xxl" in teacher.argv and "--llm-adapter" not in teacher.argv
    assert "--llm-adapter" in adapter.argv and "--t5xxl" not in adapter.argv
    # PixArt renders at its own CFG; the dump comes from a CFG-1 conditioning pass
    assert teacher.cond_argv[teacher.cond_argv.index("--cfg-scale") + 1] == "1"


def test_placeholders_in_a_packs_command_take_the_users_files(setup, tmp_path):
    """Z-Image prints `--diffusion-model <z-image-turbo DiT .gguf> --vae <flux ae .gguf>` and
    the teacher `--llm <qwen3-4b .gguf>`: unset, the CLI refuses in one sentence naming them
    before anything runs; set with --file, each is one argument of the command ggk gets."""
    _root, _models, home = setup
    root = tmp_path / "z image"
    create_project(root, "qwen3_zimage",
                   overrides={"materials.student.path": str(tmp_path / "pig_clip-f16.gguf")})
    adapter = load_project(root).final_gguf
    adapter.parent.mkdir(parents=True, exist_ok=True)
    adapter.write_bytes(b"GGUF")
    res = cli_at_home("render", "--project", root, "--prompt", "a pig", home=home)
    assert res.returncode == 1
    for ph in ("<z-image-turbo DiT .gguf>", "<flux ae .gguf>", "<qwen3-4b .gguf>"):
        assert ph in res.stderr
    assert '--file "<z-image-turbo DiT .gguf>=PATH"' in res.stderr
    assert not (root / "renders").exists()  # nothing ran
    files = {ph: tmp_path / "ggk files" / f"{ph.strip('<>')}.gguf"
             for ph in ("<z-image-turbo DiT .gguf>", "<flux ae .gguf>", "<qwen3-4b .gguf>")}
    files["<z-image-turbo DiT .gguf>"].parent.mkdir()
    for path in files.values():
        path.write_bytes(b"x")
    flags = [a for ph, path in files.items() for a in ("--file", f"{ph}={path}")]
    res = cli_at_home("render", "--project", root, "--prompt", "a pig", *flags, "--wait",
                      home=home)
    assert res.returncode == 0, res.stderr + res.stdout
    (folder,) = (root / "renders").iterdir()
    record = json.loads((folder / "render.json").read_text())
    teacher = shlex.split(record["halves"]["teacher"]["command"])
    adapter_argv = shlex.split(record["halves"]["adapter"]["command"])
    for argv in (teacher, adapter_argv):
        assert not [a for a in argv if "<" in a or ">" in a], argv
        assert argv[argv.index("--diffusion-model") + 1] == str(files["<z-image-turbo DiT .gguf>"])
        assert argv[argv.index("--vae") + 1] == str(files["<flux ae .gguf>"])
    assert teacher[teacher.index("--llm") + 1] == str(files["<qwen3-4b .gguf>"])
    assert "adapter vs teacher" in record["figures_note"]  # the stand-in's --llm teacher dump
