"""Records are not proof of ownership (issue 29, items 1 and 2).

A hand-edited exports.json or snapshots.json naming a stranger's file with its true size and
sha256 must not make `reset output` delete it, nor the Output tab list it: the tool deletes
or overwrites only files where and as it writes exports (the project folder, its current
export.output_dir and export.copy_to; `<name>[-step<N>]-<dtype>.gguf` or a companion). And an
export never overwrites a file at its name that this project did not write.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gguf_trainer.base import atomic, safe_delete
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import control
from gguf_trainer.store.project import load_project, refuse_overwrite

PACK = "t5xxl_pixart"


@pytest.fixture
def proj(tmp_path):
    root = tmp_path / "proj"
    control.new_project(root, PACK, overrides={"export.output_dir": str(tmp_path / "out")})
    (tmp_path / "out").mkdir()
    return root


def _record(proj: Path, path: Path, key: str | None = None, where: str = "exports") -> None:
    """Record `path` in the project's records with its TRUE size and sha256 (a forger's best)."""
    paths = ProjectPaths(proj)
    rec = {"kind": "final", "time": time.time(), **safe_delete.file_record(path)}
    if where == "exports":
        man = atomic.read_json(paths.exports_json, {"files": {}})
        man["files"][key or str(path)] = rec
        atomic.write_json(paths.exports_json, man)
    else:
        man = atomic.read_json(paths.snapshots_json, {"snapshots": []})
        man["snapshots"].append({**rec, "path": key or str(path), "step": 1})
        atomic.write_json(paths.snapshots_json, man)


def _victims(tmp_path: Path) -> dict[str, Path]:
    victim = tmp_path / "victim"
    victim.mkdir()
    other = tmp_path / "elsewhere"
    other.mkdir()
    files = {"model": victim / "model.gguf", "notes": victim / "notes.txt",
             "our_name_elsewhere": other / "pig_t5_adapter-f16.gguf"}
    for p in files.values():
        p.write_bytes(b"GGUF someone's precious bytes " + p.name.encode())
    return files


@pytest.mark.parametrize("where", ["exports", "snapshots"])
@pytest.mark.parametrize("case", ["model", "notes", "our_name_elsewhere", "relative"])
def test_a_forged_record_with_true_size_and_hash_deletes_nothing(proj, tmp_path, case, where):
    files = _victims(tmp_path)
    target = files["model" if case == "relative" else case]
    key = "../victim/model.gguf" if case == "relative" else None
    _record(proj, target, key, where)
    before = {p: p.read_bytes() for p in files.values()}
    plan = control.reset_plan(proj, "output")
    assert str(target) not in plan.delete
    assert any(k["path"] == str(target) for k in plan.keep)
    done = control.reset(proj, "output")
    assert str(target) not in done.deleted
    assert {p: p.read_bytes() for p in files.values()} == before
    assert str(target) not in {e["path"] for e in control.list_exports(proj)}


def test_a_true_record_in_the_output_folder_still_deletes(proj, tmp_path):
    ours = tmp_path / "out" / "pig_t5_adapter-step10-f16.gguf"
    ours.write_bytes(b"GGUF ours")
    _record(proj, ours)
    assert str(ours) in control.reset(proj, "output").deleted and not ours.exists()


def test_export_places_compare_real_paths_and_names():
    places = safe_delete.ExportPlaces(("/a/out",), "pig", ("pig_sigvq-f16.gguf",))
    assert places.why_not("/a/out/pig-f16.gguf") is None
    assert places.why_not("/a/out/pig-step7-f16.gguf") is None
    assert places.why_not("/a/out/pig_sigvq-f16.gguf") is None
    for bad in ("/a/out/notes.txt", "/a/out/pig2-f16.gguf", "/a/pig-f16.gguf",
                "/a/out/sub/pig-f16.gguf", "/a/out/pig-step-f16.gguf"):
        assert places.why_not(bad), bad


@pytest.mark.parametrize("name", ["pig_t5_adapter-step10-f16.gguf", "pig_t5_adapter-f16.gguf"])
def test_an_export_never_overwrites_a_users_file_at_its_name(proj, tmp_path, name):
    user = tmp_path / "out" / name
    user.write_bytes(b"the user's own file")
    with pytest.raises(UserError, match=f"{name} already exists and this project did not write"):
        refuse_overwrite(load_project(proj), user)
    assert user.read_bytes() == b"the user's own file"


def test_an_export_never_overwrites_a_file_recorded_under_a_forged_place(proj, tmp_path):
    files = _victims(tmp_path)
    _record(proj, files["our_name_elsewhere"])
    with pytest.raises(UserError, match="is not in this project's folder"):
        refuse_overwrite(load_project(proj), files["our_name_elsewhere"])


def test_an_export_overwrites_its_own_recorded_file(proj, tmp_path):
    ours = tmp_path / "out" / "pig_t5_adapter-step10-f16.gguf"
    ours.write_bytes(b"GGUF ours")
    _record(proj, ours)
    refuse_overwrite(load_project(proj), ours)  # no refusal
    refuse_overwrite(load_project(proj), tmp_path / "out" / "pig_t5_adapter-step11-f16.gguf")
    ours.write_bytes(b"GGUF changed by the user")
    with pytest.raises(UserError, match="changed since the tool wrote it"):
        refuse_overwrite(load_project(proj), ours)
