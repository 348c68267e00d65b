"""Class 8 of the hostile-input catalogue: corruption is found where it matters.

A shard whose bytes change after its first verification keeps its size and mtime, so the
precompute stage's (size, mtime) cache still trusts it. Every read for training or eval checks
the checksum: the shard is deleted and recomputed, never trained on; the run goes on.
"""

from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np
import pytest
import torch
from pipeline_helpers import make_project

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.data import shards
from gguf_trainer.runner import pipeline
from gguf_trainer.store.project import update_settings

PACK = "t5xxl_pixart"


def _data_start(path) -> int:
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    return 8 + n


def _tensor_span(path, name) -> tuple[int, int]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    begin, end = json.loads(raw[8:8 + n])[name]["data_offsets"]
    return 8 + n + begin, 8 + n + end


def _in_place(path, edit) -> None:
    """Apply `edit(bytearray)` keeping the size and the mtime (what the cache compares)."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    edit(data, path)
    assert len(data) == st.st_size
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def flip_student_row(data, path):
    a, _ = _tensor_span(path, "student_rows")
    data[a + 3] ^= 0x40


def flip_target_row(data, path):
    _, b = _tensor_span(path, "target_rows")
    data[b - 1] ^= 0x01


def zero_lengths(data, path):
    a, b = _tensor_span(path, "target_len")
    data[a:b] = bytes(b - a)


def swap_two_rows(data, path):
    a, _ = _tensor_span(path, "student_rows")
    row = 2 * 64  # bf16 x in_dim of the tiny student
    data[a:a + row], data[a + row:a + 2 * row] = data[a + row:a + 2 * row], data[a:a + row]


def edit_checksum(data, path):
    i = bytes(data).index(b'"checksum":"') + len(b'"checksum":"')
    data[i] = ord("0") if data[i] != ord("0") else ord("1")


def garble_header(data, path):
    data[8:12] = b"\xff\xfe\xfd\xfc"


IN_PLACE = {f.__name__: f for f in (flip_student_row, flip_target_row, zero_lengths,
                                    swap_two_rows, edit_checksum, garble_header)}


@pytest.fixture
def shard_file(tmp_path):
    g = torch.Generator().manual_seed(0)
    lens = torch.tensor([3, 2, 4], dtype=torch.int32)
    tensors = {"student_rows": torch.randn(9, 64, generator=g).bfloat16(),
               "student_ids": torch.arange(9, dtype=torch.int32),
               "student_len": lens, "target_len": lens.clone(),
               "target_rows": torch.randn(9, 8, generator=g).bfloat16(),
               "sample_index": torch.arange(3, dtype=torch.int64)}
    path = tmp_path / shards.shard_name("train", 0)
    shards.write_shard(path, tensors, {"fingerprint": "fp"})
    return path


@pytest.mark.parametrize("edit", sorted(IN_PLACE))
def test_a_changed_shard_is_refused_on_read(shard_file, edit):
    assert shards.Shard(shard_file).n == 3  # whole: reads
    _in_place(shard_file, IN_PLACE[edit])
    with pytest.raises(shards.ShardCorrupted) as e:
        shards.Shard(shard_file)
    assert e.value.path == shard_file and shard_file.exists()  # the reader deletes nothing
    assert str(shard_file) in str(e.value) and "\n" not in str(e.value)
    e.value.discard(shard_file.parent)
    assert not shard_file.exists()


@pytest.mark.parametrize("how", ["truncated", "emptied", "deleted", "replaced_by_folder"])
def test_a_broken_or_missing_shard_is_refused_on_read(shard_file, how):
    if how == "truncated":
        shard_file.write_bytes(shard_file.read_bytes()[:-7])
    elif how == "emptied":
        shard_file.write_bytes(b"")
    elif how == "deleted":
        shard_file.unlink()
    else:
        shard_file.unlink()
        (shard_file / "keep-me").mkdir(parents=True)
    with pytest.raises(UserError) as e:
        list(shards.iter_batches([shard_file], batch_size=2))
    assert str(shard_file) in str(e.value)
    assert (how == "replaced_by_folder") == (shard_file / "keep-me").is_dir()
    if isinstance(e.value, shards.ShardCorrupted):
        e.value.discard(shard_file.parent)  # a folder is never deleted (not a ShardCorrupted)


def test_the_stream_refuses_a_shard_corrupted_after_it_started(shard_file):
    second = shard_file.with_name(shards.shard_name("train", 1))
    shutil.copy2(shard_file, second)
    stream = shards.ShardStream([shard_file, second], seed=0, batch_size=3)
    first = stream.next_batch()  # one shard read (and the next prefetched) while whole
    assert first.hidden.shape[0] == 3
    _in_place(second, flip_student_row)
    _in_place(shard_file, flip_student_row)
    with pytest.raises(shards.ShardCorrupted):
        for _ in range(4):  # reaches every shard, prefetched or not, within two epochs
            stream.next_batch()
            stream._cache = None  # drop the in-memory copy: the next batch reads from disk


# ---------------------------------------------------------------- the pipeline recomputes


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_materials):
    root = tmp_path_factory.mktemp("hostile-shards") / "proj"
    # output_dir "" = the project's parent: every copy below exports next to itself
    make_project(root, PACK, tiny_materials, **{"export.output_dir": ""})
    assert pipeline.run_foreground(ProjectPaths(root)) == 0
    # The second start finds everything done and records each shard as verified by (size,
    # mtime): from here on only the check on read can see a change that keeps both.
    assert pipeline.run_foreground(ProjectPaths(root)) == 0
    for split in ("train", "val"):
        verified = json.loads((ProjectPaths(root).shard_dir(split) / "verified.json").read_text())
        assert len(verified) == len(shards.shard_files(ProjectPaths(root).shard_dir(split)))
    return root


def _shard_in_use(paths, split):
    """The shard training resumes on (train), or any shard (val: every validation reads all)."""
    files = shards.shard_files(paths.shard_dir(split))
    if split == "val":
        return files[-1]
    ck = torch.load(paths.checkpoints / "last.pt", weights_only=True)
    pos = ck["stream"]
    seed = json.loads(paths.project_json.read_text())["train"].get("seed", 0)
    order = np.random.default_rng([seed, pos["epoch"]]).permutation(len(files))
    return files[int(order[pos["shard_i"]])]


def _copy(finished, tmp_path):
    """The project and its exported GGUF (next to it: output_dir "")."""
    disk = tmp_path / "disk"
    shutil.copytree(finished.parent, disk, symlinks=True)
    root = disk / finished.name
    return root, ProjectPaths(root)


@pytest.mark.parametrize("split,edit", [("train", "flip_student_row"), ("train", "swap_two_rows"),
                                        ("val", "flip_target_row")])
def test_training_on_a_changed_shard_recomputes_it_and_finishes(finished, tmp_path, edit, split):
    root, paths = _copy(finished, tmp_path)
    victim = _shard_in_use(paths, split)
    original = shards.read_meta(victim)["checksum"]
    _in_place(victim, IN_PLACE[edit])
    update_settings(root, {"train.steps": 15})  # training resumes and reads every shard again
    assert pipeline.run_foreground(paths) == 0
    log_text = paths.pipeline_log.read_text()
    assert f"shard {victim.name} is changed since it was written" in log_text
    assert "recomputing it, then resuming" in log_text
    # recomputed: the same inputs give the same tensors (safetensors orders its header freely)
    assert shards.read_meta(victim)["checksum"] == original and shards.Shard(victim).n > 0
    state = json.loads(paths.state_json.read_text())
    assert state["status"] == "done" and state["exit_code"] == 0


def test_eval_on_a_changed_val_shard_recomputes_it(finished, tmp_path):
    _root, paths = _copy(finished, tmp_path)
    victim = shards.shard_files(paths.shard_dir("val"))[0]
    original = shards.read_meta(victim)["checksum"]
    _in_place(victim, flip_target_row)
    assert pipeline.run_foreground(paths, only=["eval"], force=True) == 0
    assert shards.read_meta(victim)["checksum"] == original and shards.Shard(victim).n > 0
    assert "changed since it was written" in paths.pipeline_log.read_text()


def test_a_corrupted_shard_in_a_folder_linked_outside_is_not_deleted(shard_file, tmp_path):
    """The pipeline discards a shard found corrupted while training; in a shards/<split>
    linked out of the project the file is not the project's to delete: one sentence."""
    root = tmp_path / "proj"
    (root / "shards").mkdir(parents=True)
    (root / "shards" / "train").symlink_to(shard_file.parent, target_is_directory=True)
    linked = root / "shards" / "train" / shard_file.name
    _in_place(shard_file, IN_PLACE["garble_header"])
    with pytest.raises(shards.ShardCorrupted) as e:
        shards.Shard(linked)
    with pytest.raises(UserError, match="is not inside .*damaged shard cannot be deleted"):
        e.value.discard(root)
    assert shard_file.exists()
