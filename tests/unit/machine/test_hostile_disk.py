"""Classes 4 and 5, at the write site: every writer meets a full disk, a read-only folder, a
path too long and a file in place of a folder, and each time the old file stays, no tmp file
is left, and the error is a DiskError (a UserError) whose one sentence names the target.
"""

from __future__ import annotations

import errno
import os

import pytest
import torch
from hostile_fs import full_disk, read_only
from safetensors.torch import save_file

from gguf_trainer.base import atomic
from gguf_trainer.base.errors import DiskError, UserError, as_user_error

OLD = b'{"old": true}\n'
BIG = 1 << 20  # larger than the spare room every case leaves


def _json(path):
    atomic.write_json(path, {"new": "x" * BIG})


def _bytes(path):
    atomic.write_bytes(path, b"\1" * BIG)


def _torch(path):
    with atomic.atomic_path(path, suffix=".pt") as tmp:
        torch.save({"w": torch.zeros(BIG // 4)}, tmp)


def _safetensors(path):
    with atomic.atomic_path(path, suffix=".safetensors") as tmp:
        save_file({"w": torch.zeros(BIG // 4)}, str(tmp))


def _gguf(path):
    import gguf
    import numpy as np

    with atomic.atomic_path(path, suffix=".gguf") as tmp:
        w = gguf.GGUFWriter(str(tmp), "x")
        w.add_tensor("t", np.zeros(BIG // 4, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


WRITERS = {"json": _json, "bytes": _bytes, "torch": _torch, "safetensors": _safetensors,
           "gguf": _gguf}


def _assert_sentence(err: BaseException, target) -> None:
    text = str(err)
    assert isinstance(err, DiskError) and isinstance(err, UserError) and isinstance(err, OSError)
    assert str(target) in text and "\n" not in text and text.endswith(".")
    assert ".tmp" not in text  # the user's file is named, not our temp file


def _left_as_it_was(folder, target) -> None:
    assert target.read_bytes() == OLD
    assert sorted(p.name for p in folder.iterdir()) == [target.name]  # no tmp file left


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_full_disk_keeps_the_old_file(tmp_path, writer):
    folder = tmp_path / "proj"
    folder.mkdir()
    target = folder / "file.out"
    target.write_bytes(OLD)
    with full_disk(folder, spare_bytes=64 << 10) as kind:
        with pytest.raises(DiskError) as e:
            WRITERS[writer](target)
        _assert_sentence(e.value, target)
        assert e.value.errno in (errno.ENOSPC, errno.EFBIG), kind
        assert ("full" if kind == "tmpfs" else "size limit") in str(e.value)
        _left_as_it_was(folder, target)


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_read_only_folder_keeps_the_old_file(tmp_path, writer):
    folder = tmp_path / "proj"
    folder.mkdir()
    target = folder / "file.out"
    target.write_bytes(OLD)
    with read_only(folder):
        with pytest.raises(DiskError) as e:
            WRITERS[writer](target)
        _assert_sentence(e.value, target)
        assert e.value.errno in (errno.EROFS, errno.EACCES)
    _left_as_it_was(folder, target)


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("case", ["name_too_long", "parent_is_a_file", "target_is_a_folder"])
def test_bad_targets_are_one_sentence(tmp_path, writer, case):
    if case == "name_too_long":
        target = tmp_path / ("n" * 300 + ".out")
    elif case == "parent_is_a_file":
        (tmp_path / "f").write_bytes(OLD)
        target = tmp_path / "f" / "sub" / "file.out"
    else:
        target = tmp_path / "dir.out"
        (target / "inside").mkdir(parents=True)
    with pytest.raises(DiskError) as e:
        WRITERS[writer](target)
    _assert_sentence(e.value, target)
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_programmer_errors_inside_a_write_stay_exceptions(tmp_path):
    with pytest.raises(KeyError), atomic.atomic_path(tmp_path / "x"):
        raise KeyError("bug")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS, errno.ENAMETOOLONG, errno.ENOTDIR,
                                 errno.EACCES, errno.EISDIR, errno.EIO, errno.EDQUOT])
def test_edges_turn_environment_errors_into_sentences(err):
    exc = OSError(err, os.strerror(err), "/p/.state.json.abc.tmp", None, "/p/state.json")
    user = as_user_error(exc)
    assert isinstance(user, UserError) and "/p/state.json" in str(user) and ".tmp" not in str(user)


@pytest.mark.parametrize("exc", [KeyError("k"), OSError(errno.EBADF, "bad fd"), ValueError("v"),
                                 OSError("no errno")])
def test_bugs_stay_internal(exc):
    assert as_user_error(exc) is None


@pytest.mark.parametrize("exc", [MemoryError(), torch.cuda.OutOfMemoryError("CUDA out of memory")])
def test_out_of_memory_is_the_machine_not_a_bug(exc):
    user = as_user_error(exc)
    assert isinstance(user, UserError) and "ran out of memory" in str(user)
    assert "train.batch_size" in str(user)


def test_check_writable_folder(tmp_path):
    assert atomic.check_writable_folder(tmp_path / "new" / "out", "export.output_dir").is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match=r"export.output_dir\) is a file, not a folder"):
        atomic.check_writable_folder(tmp_path / "file", "export.output_dir")
    with pytest.raises(DiskError, match="export.copy_to"):
        atomic.check_writable_folder(tmp_path / "file" / "sub", "export.copy_to")
    ro = tmp_path / "ro"
    ro.mkdir()
    with read_only(ro), pytest.raises(DiskError, match="export.copy_to = .*cannot be written"):
        atomic.check_writable_folder(ro, "export.copy_to")
    assert list(ro.iterdir()) == []


# ---------------------------------------------------------------- guarded JSON reads


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


BAD_JSON = {
    "latin1": ('{"name": "caf\xe9"}'.encode("latin-1"), "not UTF-8"),
    "utf16": ('{"a": 1}'.encode("utf-16"), "not UTF-8"),
    "binary": (bytes(range(256)), "not UTF-8"),
    "truncated": (b'{"train": {"steps": 1', "not valid JSON"),
    "garbage": (b"steps = 12\n", "not valid JSON"),
    "empty": (b"", "not valid JSON"),
    "deep_100k": (_nested(100_000), "nests deeper"),
    "deep_65": (_nested(65), "nests deeper"),
    "deep_dicts": (b'{"a":' * 200 + b"1" + b"}" * 200, "nests deeper"),
    "deep_500_lists": (b'{"train": {"steps": ' + _nested(500) + b"}}", "nests deeper"),
    "huge_integer": (b'{"train": {"steps": 1' + b"0" * 5000 + b"}}", "number too long"),
    "nul_bytes": (b"\0" * 64, "not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(BAD_JSON))
def test_read_json_refuses_with_a_sentence(tmp_path, case):
    data, phrase = BAD_JSON[case]
    path = tmp_path / "project.json"
    path.write_bytes(data)
    with pytest.raises(atomic.BadJSONFile) as e:
        atomic.read_json(path, fix="correct it in an editor")
    text = str(e.value)
    assert isinstance(e.value, UserError) and isinstance(e.value, ValueError)
    assert str(path) in text and phrase in text and "\n" not in text
    assert text.endswith("correct it in an editor.") or "folder" in text
    assert path.read_bytes() == data


def test_read_json_accepts_what_we_write_and_a_bom(tmp_path):
    path = tmp_path / "a.json"
    atomic.write_json(path, {"a": [1, {"b": [2]}]})
    assert atomic.read_json(path) == {"a": [1, {"b": [2]}]}
    path.write_bytes(b"\xef\xbb\xbf" + b'{"x": 1}')
    assert atomic.read_json(path) == {"x": 1}
    assert atomic.read_json(tmp_path / "missing.json", {"d": 1}) == {"d": 1}
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(atomic.BadJSONFile, match="is a folder"):
        atomic.read_json(tmp_path / "dir.json")


# ---------------------------------------------------------------- final records on a full disk


def test_final_records_survive_a_full_disk(tmp_path):
    """state.json (pipeline) and <name>-job.json (jobs) must not stay "running" for a
    process that ended: with no room for a new file they are rewritten in place."""
    from hostile_fs import fill

    from gguf_trainer.runner.jobs import JobHandle, state_path

    folder = tmp_path / "proj"
    folder.mkdir()
    job = JobHandle(folder, "snapshot", {"status": "running", "error": None, "note": "x" * 300})
    job.write()
    with full_disk(folder, spare_bytes=64 << 10) as kind:
        if kind != "tmpfs":
            pytest.skip("needs a real full disk (tmpfs as root): RLIMIT_FSIZE caps files only")
        fill(folder)
        with pytest.raises(DiskError):  # really full: a new file cannot be written
            atomic.write_bytes(folder / "probe", b"x")
        job.state.update(status="failed", error="the disk is full.", note="")
        job.write()
        assert atomic.read_json(state_path(folder, "snapshot"))["status"] == "failed"
    assert not list(folder.glob("*.tmp"))
