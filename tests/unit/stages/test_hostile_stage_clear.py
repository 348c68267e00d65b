"""The delete a stage makes when its inputs change (Stage.clear, checkpoints moved aside)
follows reset's rule: only the files the tool writes there (paths.TOOL_FILES) go; someone
else's file keeps its folder and is named in one log sentence; a link is never followed
out of the project."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import STALE_PREFIX, ProjectPaths, tool_files_in
from gguf_trainer.runner import control
from gguf_trainer.stages import corpus, precompute, precompute_inputs, train

PACK = "t5xxl_pixart"
MINE = "the user's own words\n"


@pytest.fixture
def paths(tmp_path) -> ProjectPaths:
    root = tmp_path / "proj"
    control.new_project(root, PACK, overrides={"export.output_dir": str(tmp_path / "out")})
    return ProjectPaths(root)


def _write(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_tool_files_of_a_stage_folder_below_a_listed_one():
    assert tool_files_in("shards/val") == ("*.safetensors", "manifest.json", "verified.json")
    assert tool_files_in("data") == ("*.jsonl", "manifest.json", "images/*")
    assert tool_files_in("elsewhere") is None


def test_corpus_redo_keeps_a_users_file_in_data_and_names_it(paths, caplog):
    samples = _write(paths.data / "train.jsonl", "{}\n")
    _write(paths.data / "images" / "ab.png")
    prompts = _write(paths.data / "my-prompts.txt", MINE)  # the user keeps prompts there
    with caplog.at_level(logging.WARNING):
        corpus.STAGE.clear(paths)
    assert prompts.read_text() == MINE
    assert not samples.exists() and not (paths.data / "images" / "ab.png").exists()
    said = [r.getMessage() for r in caplog.records if "my-prompts.txt" in r.getMessage()]
    assert len(said) == 1 and "did not write" in said[0]


def test_a_folder_of_only_tool_files_is_removed_whole(paths, caplog):
    _write(paths.data / "train.jsonl")
    _write(paths.shard_dir("val") / "shard-00000.safetensors")
    _write(paths.shard_dir("val") / "manifest.json")
    corpus.STAGE.clear(paths)
    precompute.PRECOMPUTE_VAL.clear(paths)
    assert not paths.data.exists() and not paths.shard_dir("val").exists()
    assert not caplog.records or all("did not write" not in r.getMessage() for r in caplog.records)


def test_shards_redo_keeps_a_foreign_file(paths):
    shard = _write(paths.shard_dir("val") / "shard-00000.safetensors")
    notes = _write(paths.shard_dir("val") / "notes.md", MINE)
    precompute.PRECOMPUTE_VAL.clear(paths)
    assert notes.read_text() == MINE and not shard.exists()


def test_a_link_inside_a_stage_folder_is_kept_and_its_target_untouched(paths, tmp_path):
    outside = _write(tmp_path / "home" / "big.jsonl", MINE)
    (paths.data).mkdir()
    (paths.data / "train.jsonl").symlink_to(outside)
    corpus.STAGE.clear(paths)
    assert outside.read_text() == MINE and (paths.data / "train.jsonl").is_symlink()


def test_a_stage_folder_linked_outside_is_a_sentence_and_untouched(paths, tmp_path):
    outside = tmp_path / "home" / "data"
    _write(outside / "train.jsonl", MINE)
    paths.data.symlink_to(outside, target_is_directory=True)
    with pytest.raises(UserError, match="symlink"):
        corpus.STAGE.clear(paths)
    assert (outside / "train.jsonl").read_text() == MINE


def test_moving_checkpoints_aside_keeps_a_foreign_file_in_place(paths, caplog):
    last = _write(paths.checkpoints / "last.pt", "weights")
    _write(paths.checkpoints / "last.json", "{}")
    notes = _write(paths.checkpoints / "notes.txt", MINE)
    with caplog.at_level(logging.WARNING):
        train.STAGE.clear(paths)
    assert notes.read_text() == MINE  # still in checkpoints/, where the user put it
    assert not last.exists() and not (paths.checkpoints / "last.json").exists()
    stale = [d for d in paths.root.iterdir() if d.name.startswith(STALE_PREFIX)]
    assert len(stale) == 1 and (stale[0] / "last.pt").read_text() == "weights"
    assert not (stale[0] / "notes.txt").exists()
    said = [r.getMessage() for r in caplog.records if "notes.txt" in r.getMessage()]
    assert len(said) == 1


def test_checkpoints_of_tool_files_move_aside_whole(paths):
    _write(paths.checkpoints / "last.pt", "weights")
    train.STAGE.clear(paths)
    stale = [d for d in paths.root.iterdir() if d.name.startswith(STALE_PREFIX)]
    assert not paths.checkpoints.exists() and (stale[0] / "last.pt").read_text() == "weights"


def test_checkpoints_linked_outside_are_never_followed(paths, tmp_path):
    outside = tmp_path / "home" / "work"
    _write(outside / "last.pt", MINE)
    paths.checkpoints.symlink_to(outside, target_is_directory=True)
    with pytest.raises(UserError, match="symlink"):
        train.STAGE.clear(paths)
    assert (outside / "last.pt").read_text() == MINE and paths.checkpoints.is_symlink()
    assert not [d for d in paths.root.iterdir() if d.name.startswith(STALE_PREFIX)]


def _linked_shards(paths, tmp_path) -> Path:
    """shards/train linked to someone's folder of weights (any *.safetensors there looks
    like a damaged shard)."""
    outside = _write(tmp_path / "home" / "models" / "model.safetensors", MINE)
    paths.shards.mkdir(parents=True, exist_ok=True)
    paths.shard_dir("train").symlink_to(outside.parent, target_is_directory=True)
    _write(outside.parent / ".partial.tmp", MINE)
    return outside


def test_shard_rot_in_a_folder_linked_outside_deletes_nothing(paths, tmp_path):
    from gguf_trainer.store.project import load_project

    outside = _linked_shards(paths, tmp_path)
    with pytest.raises(UserError, match="is not inside .*damaged shard cannot be deleted"):
        precompute_inputs.verify_split(load_project(paths.root), "train", "f" * 64)
    assert outside.read_text() == MINE and (outside.parent / ".partial.tmp").read_text() == MINE


def test_verify_repair_in_a_folder_linked_outside_deletes_nothing(paths, tmp_path):
    from gguf_trainer.runner import verify

    outside = _linked_shards(paths, tmp_path)
    assert "model.safetensors" in verify.verify_project(paths.root)["shards"]["train"]["damaged"]
    with pytest.raises(UserError, match="damaged shard cannot be deleted and recomputed there"):
        verify.verify_project(paths.root, repair=True)
    assert outside.read_text() == MINE
