"""Classes 4 and 5 of the hostile-input catalogue, through the real pipeline (in-process).

Class 4: no raw exception reaches the user. Damaged or foreign checkpoints, output and copy
folders that cannot take a file, a path too long, and a bug each end as one sentence (a bug:
"internal error" and the log path) with the project's data untouched.
Class 5: a full disk or a read-only project during every stage, `set` and `snapshot`: one
sentence, nothing lost or half-written, no tmp file, and state.json not left "running".
"""

from __future__ import annotations

import json
import pickle
import shutil
import zipfile

import pytest
import torch
from hostile_fs import fill, full_disk, read_only, tree_bytes
from pipeline_helpers import make_project

from gguf_trainer import cli
from gguf_trainer.base.errors import UserError, as_user_error
from gguf_trainer.base.exit_codes import EXIT_INTERNAL, EXIT_USER
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import pipeline
from gguf_trainer.runner.state import Report
from gguf_trainer.store.project import update_settings

PACK = "t5xxl_pixart"
# What a user would lose: checkpoints, shards, the corpus, settings, exports and their records.
PROTECTED = ("proj/checkpoints/", "proj/shards/", "proj/data/", "proj/project.json",
             "proj/exports.json", "proj/eval.json")


def protected(disk) -> dict[str, bytes]:
    files = tree_bytes(disk)
    return {k: v for k, v in files.items()
            if (k.startswith(PROTECTED) or k.endswith(".gguf")) and not k.endswith("verified.json")}


def assert_one_sentence(text: str) -> None:
    assert text and "Traceback" not in text and "\n" not in text.strip(), text
    assert text.strip().endswith("."), text


def state(paths) -> dict:
    return json.loads(paths.state_json.read_text())


def run(paths, **kw) -> tuple[int, str]:
    """(exit code, the sentence the user reads) of one foreground run."""
    try:
        code = pipeline.run_foreground(paths, **kw)
    except UserError as e:  # refused before the run could record anything (the CLI prints it)
        return EXIT_USER, str(e)
    return code, state(paths).get("error") or ""


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_materials):
    """disk/proj: a finished run; its GGUF is in disk/ (export.output_dir "")."""
    disk = tmp_path_factory.mktemp("hostile-runs") / "disk"
    root = disk / "proj"
    make_project(root, PACK, tiny_materials, **{"export.output_dir": ""})
    assert pipeline.run_foreground(ProjectPaths(root)) == 0
    return disk


@pytest.fixture
def disk(finished, tmp_path):
    copy = tmp_path / "disk"
    shutil.copytree(finished, copy, symlinks=True)
    return copy


# ---------------------------------------------------------------- class 4: checkpoints


def _malicious_pickle(path):
    class Boom:
        def __reduce__(self):
            return (print, ("this must never run",))

    path.write_bytes(pickle.dumps({"model": Boom()}))


def _foreign_global(path):  # a zip checkpoint whose pickle names a global weights_only refuses
    import fractions

    torch.save({"model": {}, "step": fractions.Fraction(1, 3)}, path)


def _foreign_keys(path):
    torch.save({"state_dict": {"w": torch.zeros(2)}, "epoch": 3}, path)


def _other_geometry(path):
    ck = torch.load(path, weights_only=True)
    ck["model"] = {k: torch.zeros(*(d + 1 for d in v.shape)) for k, v in ck["model"].items()}
    torch.save(ck, path)


def _wrong_types(path):
    ck = torch.load(path, weights_only=True)
    ck["step"], ck["stream"] = "12", [0, 0, 0]
    torch.save(ck, path)


def _absurd_config(path):
    ck = torch.load(path, weights_only=True)
    ck["config"] = {**ck["config"], "width": 10**15, "depth": 10**9}
    torch.save(ck, path)


def _bad_zip_member(path):
    data = bytearray(path.read_bytes())
    i = bytes(data).index(b"PK\x03\x04", 10)  # the second member's header
    data[i:i + 4] = b"XXXX"
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "empty": lambda p: p.write_bytes(b""),
    "text": lambda p: p.write_text("not a checkpoint\n"),
    "random": lambda p: p.write_bytes(bytes(range(256)) * 64),
    "malicious_pickle": _malicious_pickle,
    "foreign_global": _foreign_global,
    "foreign_keys": _foreign_keys,
    "other_geometry": _other_geometry,
    "wrong_types": _wrong_types,
    "absurd_config": _absurd_config,
    "bad_zip_member": _bad_zip_member,
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("which", ["last", "best"])
def test_a_damaged_or_foreign_checkpoint_is_one_sentence(disk, damage, which, capfd):
    paths = ProjectPaths(disk / "proj")
    ck = paths.checkpoints / f"{which}.pt"
    DAMAGE[damage](ck)
    if which == "last":
        update_settings(paths.root, {"train.steps": 15})  # training resumes from last.pt
        kw = {}
    else:
        kw = {"only": ["export"], "force": True}  # export reads best.pt
    before = protected(disk)
    code, sentence = run(paths, **kw)
    assert code == EXIT_USER, sentence
    assert_one_sentence(sentence)
    assert str(ck) in sentence and "delete it" in sentence
    assert state(paths)["status"] == "failed"
    assert protected(disk) == before  # the damaged file is the user's to delete, not ours
    assert "this must never run" not in capfd.readouterr().out


def test_zipfile_is_what_torch_writes():
    """The bad_zip_member case edits a real zip header (guards the helper, not the code)."""
    import io

    buf = io.BytesIO()
    torch.save({"a": torch.zeros(1)}, buf)
    assert zipfile.is_zipfile(io.BytesIO(buf.getvalue()))


# ---------------------------------------------------------------- class 4: output folders


def _file_in_place(disk, folder):
    folder.write_text("a file where the folder should be\n")


def _under_a_file(disk, folder):
    folder.parent.mkdir(parents=True, exist_ok=True)
    (folder.parent / "blocker").write_text("x")
    return folder.parent / "blocker" / "out"


def _too_long(disk, folder):
    return folder / ("n" * 300)


@pytest.mark.parametrize("setting", ["export.output_dir", "export.copy_to"])
@pytest.mark.parametrize("case", ["is_a_file", "under_a_file", "name_too_long", "read_only"])
def test_an_output_folder_that_cannot_take_the_file(disk, setting, case):
    paths = ProjectPaths(disk / "proj")
    folder = disk / "target"
    if case == "is_a_file":
        _file_in_place(disk, folder)
    elif case == "under_a_file":
        folder = _under_a_file(disk, folder)
    elif case == "name_too_long":
        folder = _too_long(disk, folder)
    else:
        folder.mkdir()
    update_settings(paths.root, {setting: str(folder)})
    before = protected(disk)
    if case == "read_only":
        with read_only(folder):
            code, sentence = run(paths, only=["export"], force=True)
    else:
        code, sentence = run(paths, only=["export"], force=True)
    assert code == EXIT_USER, sentence
    assert_one_sentence(sentence)
    shown = str(folder) if case != "under_a_file" else str(folder.parent)
    assert shown in sentence
    assert protected(disk) == before
    assert not list(disk.rglob("*.tmp"))


def test_a_bug_says_internal_error_with_the_log_path(disk):
    paths = ProjectPaths(disk / "proj")

    def buggy(paths, report, only, force):
        return {}["missing"]

    code = pipeline.run_foreground(paths, run=buggy)
    st = state(paths)
    assert code == EXIT_INTERNAL and st["status"] == "failed"
    assert st["error"].startswith("internal error (KeyError")
    assert str(paths.pipeline_log) in st["error"]
    assert "Traceback" in paths.pipeline_log.read_text()


@pytest.mark.parametrize("target", ["a_file", "under_a_file"])
def test_demo_dir_that_cannot_be_a_project(tmp_path, target, capsys, monkeypatch):
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "home"))
    blocker = tmp_path / "blocker"
    blocker.write_text("mine\n")
    where = blocker if target == "a_file" else blocker / "demo"
    code = cli.main(["demo", "--dir", str(where), "--no-run"])
    err = capsys.readouterr().err
    assert code == EXIT_USER and err.startswith("error: ")
    assert_one_sentence(err.removeprefix("error: "))
    assert str(blocker) in err
    assert blocker.read_text() == "mine\n"


# ---------------------------------------------------------------- class 5: the disk


def _fresh(disk, tiny_materials, corpus_done: bool):
    root = disk / "fresh"
    make_project(root, PACK, tiny_materials, **{"export.output_dir": ""})
    if corpus_done:
        assert pipeline.run_foreground(ProjectPaths(root), only=["corpus"]) == 0
    return root


STAGE_SETUPS = {
    # stage -> (prepare(disk, materials) -> project root, run kwargs, the stage that fills the disk)
    "corpus": (lambda d, m: _fresh(d, m, corpus_done=False), {}, "corpus"),
    "precompute": (lambda d, m: _fresh(d, m, corpus_done=True), {}, "precompute_val"),
    "train": (
        lambda d, m: update_settings(d / "proj", {"train.steps": 18}).paths.root,
        {},
        "train",
    ),
    "export": (lambda d, m: d / "proj", {"only": ["export"], "force": True}, "export"),
    "eval": (lambda d, m: d / "proj", {"only": ["eval"], "force": True}, "eval"),
}


def _protected_of(disk, root):
    files = tree_bytes(disk)
    rel = root.name + "/"
    keep = tuple(rel + p.removeprefix("proj/") for p in PROTECTED)
    return {
        k: v
        for k, v in files.items()
        if (k.startswith(keep) or k.endswith(".gguf")) and not k.endswith("verified.json")
    }


def _fill_when(monkeypatch, disk, kind: str, target: str) -> None:
    """The disk becomes full the moment `target` begins (the pipeline itself started fine)."""
    begin = Report.begin_stage

    def begin_and_fill(self, name, *a, **kw):
        if name == target and kind == "tmpfs":
            fill(disk)
        return begin(self, name, *a, **kw)

    monkeypatch.setattr(Report, "begin_stage", begin_and_fill)


def _assert_disk_sentence(sentence: str, disk, fs: str) -> None:
    assert_one_sentence(sentence)
    assert str(disk) in sentence
    if fs == "full":
        assert "is full" in sentence or "size limit" in sentence, sentence
    else:
        assert "read-only" in sentence or "permission" in sentence, sentence


@pytest.mark.parametrize("stage", sorted(STAGE_SETUPS))
def test_the_disk_fills_up_during_a_stage(disk, tiny_materials, stage, monkeypatch):
    prepare, kw, target = STAGE_SETUPS[stage]
    root = prepare(disk, tiny_materials)
    paths = ProjectPaths(root)
    before = _protected_of(disk, root)
    with full_disk(disk, spare_bytes=4 << 20) as kind:
        _fill_when(monkeypatch, disk, kind, target)
        code, sentence = run(paths, **kw)
        st = state(paths)
    assert code == EXIT_USER, sentence
    _assert_disk_sentence(sentence, disk, "full")
    # the final record was written although the disk was full: never left "running"
    assert st["status"] == "failed" and st["error"] == sentence and st["exit_code"] == EXIT_USER
    assert st["stages"][target]["status"] == "failed"
    assert _protected_of(disk, root) == before
    assert not list(disk.rglob("*.tmp"))


@pytest.mark.parametrize("stage", ["corpus", "train", "export"])
def test_a_read_only_project_refuses_to_start(disk, tiny_materials, stage):
    prepare, kw, _ = STAGE_SETUPS[stage]
    root = prepare(disk, tiny_materials)
    paths = ProjectPaths(root)
    before = _protected_of(disk, root)
    state_before = paths.state_json.read_bytes() if paths.state_json.exists() else None
    with read_only(disk):
        code, sentence = run(paths, **kw)
    assert code == EXIT_USER, sentence
    _assert_disk_sentence(sentence, disk, "read_only")
    assert _protected_of(disk, root) == before
    assert not list(disk.rglob("*.tmp"))
    # nothing could be written: the record of the previous run is intact
    assert (paths.state_json.read_bytes() if paths.state_json.exists() else None) == state_before


@pytest.mark.parametrize("fs", ["full", "read_only"])
def test_set_steps_on_a_full_or_read_only_disk(disk, fs, capsys):
    paths = ProjectPaths(disk / "proj")
    before = protected(disk)
    with full_disk(disk) if fs == "full" else read_only(disk):
        code = cli.main(["set", "--project", str(paths.root), "--steps", "30"])
    err = capsys.readouterr().err
    assert code == EXIT_USER and err.startswith("error: ")
    _assert_disk_sentence(err.removeprefix("error: "), disk, fs)
    assert protected(disk) == before
    assert not list(disk.rglob("*.tmp"))


@pytest.mark.parametrize("fs", ["full", "read_only"])
def test_snapshot_on_a_full_or_read_only_disk(disk, fs):
    from gguf_trainer.runner.snapshot import run_snapshot

    paths = ProjectPaths(disk / "proj")
    before = protected(disk)
    with (
        full_disk(disk) if fs == "full" else read_only(disk),
        pytest.raises(OSError) as e,
    ):  # a DiskError, or what the snapshot lock raises
        run_snapshot(paths.root, fresh=False)
    user = as_user_error(e.value, fallback=paths.root)  # what every edge (CLI, job, UI) shows
    assert user is not None
    assert_one_sentence(str(user))
    assert str(disk) in str(user)
    assert protected(disk) == before
    assert not list(disk.rglob("*.tmp")) and not list(disk.glob("*step*.gguf"))


# ---------------------------------------------------------------- class 4: project.json


def _deep(n: int) -> bytes:
    return b'{"pack": "t5xxl_pixart", "train": {"steps": ' + b"[" * n + b"]" * n + b"}}"


PROJECT_JSON = {
    "latin1": '{"pack": "t5xxl_pixart", "name": "caf\xe9"}'.encode("latin-1"),
    "utf16": '{"pack": "t5xxl_pixart"}'.encode("utf-16"),
    "nested_100k": b"[" * 100_000 + b"]" * 100_000,
    "nested_500": _deep(500),  # below the parser's recursion limit, above any reader's taste
    "huge_integer": b'{"pack": "t5xxl_pixart", "train": {"steps": 1' + b"0" * 5000 + b"}}",
    "nul_bytes": b"\0" * 100,
    "truncated": b'{"pack": "t5xx',
}


@pytest.mark.parametrize("command", ["status", "set", "run"])
@pytest.mark.parametrize("case", sorted(PROJECT_JSON))
def test_a_broken_project_json_is_one_sentence(tmp_path, case, command, capsys):
    from gguf_trainer.store.project import create_project

    root = tmp_path / "p"
    create_project(root, PACK)
    (root / "project.json").write_bytes(PROJECT_JSON[case])
    argv = {"status": ["status"], "set": ["set", "--steps", "5"], "run": ["run"]}[command]
    code = cli.main([*argv, "--project", str(root)])
    out = capsys.readouterr()
    text = (out.err + out.out).strip()
    assert code == EXIT_USER, text
    assert "Traceback" not in text and "internal error" not in text and "\n" not in text, text
    assert "project.json" in text
    assert (root / "project.json").read_bytes() == PROJECT_JSON[case]


# ---------------------------------------------------------------- class 7 through the pipeline


@pytest.mark.parametrize("case", ["huge_u8_array", "data_past_eof", "huge_tensor_count"])
def test_a_hostile_student_gguf_is_refused_before_anything_changes(disk, case):
    from hostile_gguf_files import HOSTILE

    paths = ProjectPaths(disk / "proj")
    student = disk / "hostile-student.gguf"
    student.write_bytes(HOSTILE[case])
    update_settings(paths.root, {"materials.student.path": str(student)})
    before = protected(disk)
    before.pop("proj/project.json")
    code, sentence = run(paths)
    assert code == EXIT_USER, sentence
    assert_one_sentence(sentence)
    assert str(student) in sentence and "truncated or not a GGUF file" in sentence
    after = protected(disk)
    after.pop("proj/project.json")
    assert after == before  # shards, checkpoints and exports survive a bad new student


def test_the_detached_pipeline_on_a_read_only_project(disk, capsys):
    """`python -m gguf_trainer.runner.pipeline` (what `start` spawns): the sentence on stderr,
    which the supervisor's monitor keeps, and the user-error exit code."""
    paths = ProjectPaths(disk / "proj")
    before = tree_bytes(disk)
    with read_only(disk):
        code = pipeline.main(["--project", str(paths.root)])
    err = capsys.readouterr().err
    assert code == EXIT_USER
    assert_one_sentence(err)
    assert "read-only" in err or "permission" in err
    assert tree_bytes(disk) == before
