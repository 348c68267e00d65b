"""materials: the hash cache of big files, teacher identity over every defining file, which
materials a project wants, and the sentences for missing ones."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from gguf_trainer.base.errors import UserError
from gguf_trainer.materials import materials
from gguf_trainer.materials.materials import (
    file_sha256,
    folder_identity,
    materials_for,
    teacher_identity,
)
from gguf_trainer.packs import get_pack
from gguf_trainer.store.project_schema import ProjectSettings


def test_sha256_is_cached_by_path_size_and_mtime(tmp_path):
    data, cache = tmp_path / "student.gguf", tmp_path / "hashes.json"
    data.write_bytes(b"GGUF" + b"x" * 1000)
    first = file_sha256(data, cache)
    assert first == hashlib.sha256(data.read_bytes()).hexdigest()
    key = next(iter(json.loads(cache.read_text())))
    # A cached entry is trusted while size and mtime hold (proof: a doctored entry is returned).
    cache.write_text(json.dumps({key: "cached"}))
    assert file_sha256(data, cache) == "cached"
    data.write_bytes(b"GGUF" + b"y" * 1000)  # same size, new content and mtime
    os.utime(data, ns=(1, 2))
    assert file_sha256(data, cache) == hashlib.sha256(data.read_bytes()).hexdigest()
    assert len(json.loads(cache.read_text())) == 2


@pytest.mark.parametrize("garbage", [b"", b"not json", b"[1, 2]", b'{"k": 5}', b"\xff\xfe"])
def test_a_garbage_cache_is_rebuilt_never_fatal(tmp_path, garbage):
    data, cache = tmp_path / "f.bin", tmp_path / "hashes.json"
    data.write_bytes(b"abc")
    cache.write_bytes(garbage)
    assert file_sha256(data, cache) == hashlib.sha256(b"abc").hexdigest()
    assert isinstance(json.loads(cache.read_text()), dict)


def _snapshot(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text('{"d_model": 32}')
    (root / "spiece.model").write_bytes(b"\x00sentencepiece")
    (root / "sub" / "modeling_x.py").write_text("X = 1\n")
    (root / "model.safetensors").write_bytes(b"w" * 100)
    (root / ".cache").mkdir()
    (root / ".cache" / "download.lock").write_text("bookkeeping")
    return root


CHANGES = {
    "config": lambda r: (r / "config.json").write_text('{"d_model": 64}'),
    "tokenizer model": lambda r: (r / "spiece.model").write_bytes(b"\x00sentencepieceX"),
    "remote code": lambda r: (r / "sub" / "modeling_x.py").write_text("X = 2\n"),
    "weight size": lambda r: (r / "model.safetensors").write_bytes(b"w" * 101),
    "weight renamed": lambda r: (r / "model.safetensors").rename(r / "model-00001.safetensors"),
    "new file": lambda r: (r / "generation_config.json").write_text("{}"),
}


@pytest.mark.parametrize("change", CHANGES)
def test_teacher_identity_covers_every_defining_file(tmp_path, change):
    root = _snapshot(tmp_path / "t")
    before = folder_identity(root, tmp_path / "hashes.json")
    assert before["files"] == 4  # download bookkeeping (.cache) is not the model
    CHANGES[change](root)
    assert folder_identity(root, tmp_path / "hashes.json") != before


def test_weights_are_identified_by_name_and_size_not_read(tmp_path, monkeypatch):
    root = _snapshot(tmp_path / "t")
    before = folder_identity(root)
    (root / "model.safetensors").write_bytes(b"v" * 100)  # same size: weights are not hashed
    assert folder_identity(root) == before
    read = []
    real = materials.files_sha256
    monkeypatch.setattr(
        materials,
        "files_sha256",
        lambda paths, cache=None: read.extend(paths) or real(paths, cache),
    )
    folder_identity(root)
    assert all(p.suffix != ".safetensors" for p in read)


def _project(tmp_path, pack_id="t5xxl_pixart", **settings):
    data = {"pack": pack_id, "name": "pig_x", **settings}
    st = ProjectSettings.model_validate(data)
    paths = SimpleNamespace(hashes_json=tmp_path / "hashes.json", root=tmp_path)

    def material_path(mid):
        ref = st.materials.get(mid)
        return Path(ref.path) if ref and ref.path else None

    return SimpleNamespace(
        settings=st, pack=get_pack(pack_id), paths=paths, material_path=material_path
    )


def test_teacher_identity_uses_the_record_only_when_the_teacher_is_gone(tmp_path):
    root = _snapshot(tmp_path / "t")
    proj = _project(tmp_path, materials={"teacher": {"path": str(root)}})
    ident = teacher_identity(proj)
    assert ident == folder_identity(root, tmp_path / "hashes.json")
    assert teacher_identity(proj, recorded={"snapshot": "old"}) == ident  # present: the files win
    gone = _project(tmp_path, materials={"teacher": {"path": str(tmp_path / "gone")}})
    assert teacher_identity(gone, recorded=ident) == ident
    with pytest.raises(
        UserError, match="gone does not exist.*gguf-trainer download --project .* --id teacher"
    ):
        teacher_identity(gone)
    with pytest.raises(UserError):  # a mock record never stands in for a real teacher
        teacher_identity(gone, recorded={"mock": "t5xxl_pixart", "version": 1})


def test_identities_stand_in_silently_and_stand_ins_are_named(tmp_path, caplog):
    """The identities are read by a predicate (Stage.inputs): no log line from them; the
    loop's make_inputs names what the record stands in for, from recorded_stand_ins."""
    root = _snapshot(tmp_path / "t")
    proj = _project(tmp_path, materials={"teacher": {"path": str(root)}})
    ident = teacher_identity(proj)
    gone = _project(tmp_path, materials={"teacher": {"path": str(tmp_path / "gone")},
                                         "student": {"path": str(tmp_path / "gone.gguf")}})
    caplog.set_level("DEBUG")
    assert teacher_identity(gone, recorded=ident) == ident
    assert materials.student_identity(gone, recorded="abc") == "abc"
    assert not caplog.records
    assert materials.recorded_stand_ins(gone, {"teacher": ident, "student_sha256": "abc"}) == [
        "the student GGUF", "the teacher files"]
    assert materials.recorded_stand_ins(proj, {"teacher": ident}) == []  # present: none
    assert materials.recorded_stand_ins(gone, {"teacher": {"mock": "x"}}) == []


def test_missing_student_names_the_path_and_the_fix(tmp_path):
    proj = _project(tmp_path, materials={"student": {"path": str(tmp_path / "nope.gguf")}})
    with pytest.raises(UserError, match=r"nope.gguf does not exist.*materials.student.path"):
        materials.student_paths(proj)
    with pytest.raises(UserError, match="materials.student.path is not set"):
        materials.student_paths(_project(tmp_path))


def test_materials_for_follows_the_settings(tmp_path):
    ids = lambda proj: [m.id for m in materials_for(proj)]
    optional = [m for m in get_pack("llada_image").materials if not m.required]
    assert [m.wanted_when for m in optional] == ["export.export_sigvq"]
    on = _project(tmp_path, "llada_image", export={"export_sigvq": True})
    off = _project(tmp_path, "llada_image", export={"export_sigvq": False})
    assert optional[0].id in ids(on) and optional[0].id not in ids(off)
    assert ids(_project(tmp_path, "t5xxl_pixart")) == ["student", "student_tokenizer", "teacher"]
    mock = _project(tmp_path, "t5xxl_pixart", precompute={"mock_teacher": True})
    assert ids(mock) == ["student", "student_tokenizer"]  # the mock needs no teacher files
