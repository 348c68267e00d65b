"""A finished `gguf-trainer demo` project travels (a project is its folder: moved, renamed or
copied it keeps its work and never writes to the old path), through the CLI as a user runs
it: moved and renamed with shutil.move (a decoy copy now at the old path), it has nothing to
redo, continues training and exports inside its new folder, never touching the old path;
copied with `cp -a`, its `reset output` removes only the copy's own GGUF."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from pipeline_helpers import cli_at_home

from gguf_trainer.base.paths import STALE_PREFIX

pytestmark = pytest.mark.slow


def state_of(root) -> dict[str, tuple[bytes, int]]:
    """Every file under root: bytes and mtime."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def work(root) -> dict[str, bytes]:
    """What a redone stage rewrites: the corpus, every shard and checkpoint."""
    files = [
        *root.glob("data/*.jsonl"),
        *root.glob("shards/*/*.safetensors"),
        *root.glob("checkpoints/*.pt"),
    ]
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


@pytest.fixture(scope="module")
def demo(pixart_demo):
    return pixart_demo  # the run's one PixArt demo (tests/conftest.py): every test copies it


def test_the_demo_stores_its_paths_relative(demo):
    raw = json.loads((demo["root"] / "project.json").read_text())
    assert raw["materials"]["student"]["path"] == "materials/pig_clip-tiny-f16.gguf"
    assert raw["corpus"]["files"] == ["materials/demo_prompts.txt"]
    assert raw["export"]["output_dir"] == "output"
    assert str(demo["root"]) not in (demo["root"] / "exports.json").read_text()


def test_a_moved_demo_runs_on_where_it_is(demo, tmp_path):
    home = demo["home"]
    old = tmp_path / "old" / "demo"
    shutil.copytree(demo["root"], old, symlinks=True)
    new = tmp_path / "elsewhere" / "renamed"
    new.parent.mkdir()
    shutil.move(old, new)
    subprocess.run(["cp", "-a", str(new), str(old)], check=True)  # a decoy at the old path
    decoy, before = state_of(old), work(new)
    out = cli_at_home("run", "--project", new, home=home, timeout=480)
    assert out.returncode == 0, out.stderr[-2000:]
    assert work(new) == before and not list(new.glob(f"{STALE_PREFIX}*"))
    assert "redoing" not in (new / "pipeline.log").read_text()
    status = cli_at_home("status", "--project", new, "--json", home=home, timeout=120)
    assert str(old) not in status.stdout and str(new / "output") in status.stdout
    steps = demo["project"].settings.train.steps
    out = cli_at_home("run", "--project", new, "--steps", steps + 4, home=home, timeout=480)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads((new / "checkpoints" / "last.json").read_text())["step"] == steps + 4
    assert f"resuming from last.pt at step {steps}" in (new / "pipeline.log").read_text()
    gguf = new / "output" / "pig_t5_adapter-f16.gguf"
    assert gguf.is_file() and gguf.read_bytes() != decoy["output/pig_t5_adapter-f16.gguf"][0]
    assert state_of(old) == decoy  # nothing at the old path was written


# The run's own bookkeeping, rewritten by every run: everything else is work that a moved
# project must not redo (eval.json, hashes.json's material hashes, the shards' checks).
RUN_BOOKKEEPING = ("pipeline.log", "pipeline.lock", "state.json")


def settled(root, home) -> dict[str, tuple[bytes, int]]:
    """A project after a plain run: every file but the run's bookkeeping."""
    out = cli_at_home("run", "--project", root, home=home, timeout=480)
    assert out.returncode == 0, out.stderr[-2000:]
    return {k: v for k, v in state_of(root).items() if k not in RUN_BOOKKEEPING}


def test_a_real_mv_redoes_nothing_not_even_the_eval(demo, tmp_path):
    here = tmp_path / "here" / "demo"
    shutil.copytree(demo["root"], here, symlinks=True)
    before = settled(here, demo["home"])  # a first run in place writes the shards' checks
    there = tmp_path / "there" / "moved"
    there.parent.mkdir()
    subprocess.run(["mv", str(here), str(there)], check=True)
    after = settled(there, demo["home"])
    assert after == before  # eval.json, hashes.json, every shard and checkpoint as they were
    assert str(here) not in (there / "eval.json").read_text()
    # moved without its files' times (cp -r, some file managers): the eval's record of the
    # GGUF it scored still says it is done
    copy = tmp_path / "copy" / "demo"
    copy.parent.mkdir()
    subprocess.run(["cp", "-r", str(there), str(copy)], check=True)
    (copy / "output" / "pig_t5_adapter-f16.gguf").touch()  # newer than eval.json
    ev = (copy / "eval.json").read_bytes()
    out = cli_at_home("run", "--project", copy, home=demo["home"], timeout=480)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "eval              done earlier" in out.stderr
    assert (copy / "eval.json").read_bytes() == ev


def test_reset_output_in_a_cp_a_copy_keeps_the_originals_gguf(demo, tmp_path):
    home = demo["home"]
    src = tmp_path / "src" / "demo"
    shutil.copytree(demo["root"], src, symlinks=True)
    copy = tmp_path / "copy" / "demo"
    copy.parent.mkdir()
    subprocess.run(["cp", "-a", str(src), str(copy)], check=True)
    original = src / "output" / "pig_t5_adapter-f16.gguf"
    kept = original.read_bytes()
    out = cli_at_home("reset", "--project", copy, "output", home=home, timeout=120)
    assert out.returncode == 0, out.stderr
    assert original.read_bytes() == kept and str(src) not in out.stdout
    assert not (copy / "output" / "pig_t5_adapter-f16.gguf").exists()  # the copy's own GGUF went
