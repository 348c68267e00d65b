"""Projects that travel and heal (a project is its folder: moved or copied, or with its
bookkeeping damaged, it loses no finished work), through the real pipeline (in-process).

Bookkeeping damage never costs a stage: a missing or damaged manifest (data/, shards/*/,
checkpoints/) is rebuilt from the fingerprints the shards and checkpoints record, and only a
real input change moves work aside. The remaining hostile inputs of the catalogue: a
binary prompt file, --auto-resume with a last_project that is not a string, --project naming
a file, `set` with no KEY.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from pipeline_helpers import cli_at_home, make_project

from gguf_trainer import cli
from gguf_trainer.base import atomic, places
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.exit_codes import EXIT_NO_PROJECT, EXIT_OK, EXIT_USER
from gguf_trainer.base.paths import MANIFEST_JSON, STALE_PREFIX, ProjectPaths
from gguf_trainer.materials.prompt_files import read_source
from gguf_trainer.runner import control, pipeline, supervisor
from gguf_trainer.stages import corpus
from gguf_trainer.store.project import load_project, update_settings

# Its module fixtures run whole pipelines (tests/conftest.py's e2e tier, out of the fast one).
pytestmark = pytest.mark.e2e

PACK = "t5xxl_pixart"
MANIFEST_FOLDERS = ("data", "shards/val", "shards/train", "checkpoints")


def work_bytes(root, exports: bool = False) -> dict[str, bytes]:
    """What a redone stage would rewrite: the corpus, every shard and checkpoint (and the
    exports beside the project)."""
    files = [*root.glob("data/*.jsonl"), *root.glob("shards/*/*.safetensors"),
             *root.glob("checkpoints/*.pt"), *(root.parent.glob("*.gguf") if exports else ())]
    return {str(p.relative_to(root.parent)): p.read_bytes() for p in files}


def log_since(paths, start: int) -> str:
    return paths.pipeline_log.read_text(errors="replace")[start:]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_materials):
    """disk/proj: a finished run; its GGUF is in disk/ (export.output_dir "")."""
    disk = tmp_path_factory.mktemp("hostile-travel") / "disk"
    make_project(disk / "proj", PACK, tiny_materials, **{"export.output_dir": ""})
    assert pipeline.run_foreground(ProjectPaths(disk / "proj")) == 0
    return disk


@pytest.fixture
def proj(finished, tmp_path):
    copy = tmp_path / "disk"
    shutil.copytree(finished, copy, symlinks=True)
    return copy / "proj"


def _damage(path, how: str) -> None:
    if how == "missing":
        path.unlink()
    elif how == "garbage":
        path.write_bytes(b"\x00{not json")
    elif how == "other_json":  # valid JSON of another shape is damage, not an input change
        path.write_text(json.dumps({"fingerprint": 7}))
    else:  # a folder in its place
        path.unlink()
        path.mkdir()


@pytest.mark.parametrize("folders, how", [
    (("checkpoints",), "missing"), (("checkpoints",), "garbage"), (("shards/train",), "other_json"),
    (("shards/val",), "missing"), (("data",), "garbage"), (("data",), "folder"),
    (MANIFEST_FOLDERS, "missing"),
])
def test_a_damaged_manifest_is_rebuilt_from_the_data_with_nothing_redone(proj, folders, how):
    paths = ProjectPaths(proj)
    before = work_bytes(proj, exports=True)
    for folder in folders:
        _damage(proj / folder / MANIFEST_JSON, how)
    start = len(paths.pipeline_log.read_bytes())
    assert pipeline.run_foreground(paths) == 0
    log = log_since(paths, start)
    assert work_bytes(proj, exports=True) == before  # no stage was redone: the same bytes
    assert not list(proj.glob(f"{STALE_PREFIX}*"))
    assert log.count("rebuilt the missing or damaged manifest") == 1, log
    assert "redoing" not in log and "recomputing" not in log
    for folder in folders:
        man = atomic.read_json(proj / folder / MANIFEST_JSON)
        assert isinstance(man["fingerprint"], str) and man["complete"] is True
    # healed once: the next run has nothing to say
    start = len(paths.pipeline_log.read_bytes())
    assert pipeline.run_foreground(paths) == 0
    assert "rebuilt the missing" not in log_since(paths, start)


def test_a_checkpoint_saved_before_its_summary_held_the_fingerprint_vouches_from_the_pt(proj):
    paths = ProjectPaths(proj)
    for side in proj.glob("checkpoints/*.json"):
        if side.name != MANIFEST_JSON:
            data = json.loads(side.read_text())
            assert data.pop("train_fp")  # what an older version wrote
            side.write_text(json.dumps(data))
    (proj / "checkpoints" / MANIFEST_JSON).unlink()
    before = work_bytes(proj)
    assert pipeline.run_foreground(paths) == 0
    assert work_bytes(proj) == before and not list(proj.glob(f"{STALE_PREFIX}*"))


def test_a_real_input_change_without_a_manifest_still_moves_the_checkpoints_aside(proj):
    paths = ProjectPaths(proj)
    (proj / "checkpoints" / MANIFEST_JSON).unlink()
    update_settings(proj, {"train.lr": 1e-3})  # the checkpoints were made from another lr
    start = len(paths.pipeline_log.read_bytes())
    assert pipeline.run_foreground(paths) == 0
    assert len(list(proj.glob(f"{STALE_PREFIX}*"))) == 1
    assert "outputs without a manifest: redoing train" in log_since(paths, start)


def test_a_damaged_checkpoint_vouches_for_nothing(proj):
    """A last.pt that cannot be read (and a summary without the fingerprint) heals nothing:
    training is redone, the old folder kept aside."""
    (proj / "checkpoints" / MANIFEST_JSON).unlink()
    (proj / "checkpoints" / "last.json").write_text("{}")
    (proj / "checkpoints" / "last.pt").write_bytes(b"not a checkpoint")
    assert pipeline.run_foreground(ProjectPaths(proj)) == 0
    assert len(list(proj.glob(f"{STALE_PREFIX}*"))) == 1


# ---------------------------------------------------------------- remaining hostile inputs


@pytest.mark.parametrize("raw", [
    b"\x00\x01\x02 some words\n" * 40,                    # NUL and control bytes on every line
    bytes(range(256)) * 40,                               # random-looking binary
    b"a fine prompt about a cat\n" + b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 30,  # an image
])
def test_a_binary_prompt_file_is_refused_as_not_a_text_file(tmp_path, raw):
    path = tmp_path / "prompts.txt"
    path.write_bytes(raw)
    with pytest.raises(UserError) as info:
        read_source(path)
    msg = str(info.value)
    assert "is not a text file" in msg and str(path) in msg and "\n" not in msg


def test_a_text_file_with_a_few_binary_lines_still_trains_on_the_rest(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_bytes(b"a red fox in the snow\n" * 5 + b"bin\x00ary\n" * 2)
    assert [s.text for s in read_source(path)] == ["a red fox in the snow"] * 5


@pytest.mark.parametrize("last", [7, ["a", "b"], {"p": 1}, None, True, "", "  "])
def test_auto_resume_with_a_last_project_that_is_not_a_path_is_no_last_project(
        tmp_path, monkeypatch, last):
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path))
    atomic.write_json(supervisor.settings_path(), {"last_project": last})
    assert supervisor.auto_resume() == "auto-resume: no project was started yet"


def test_project_naming_a_file_exits_2_like_any_other_non_project(tmp_path):
    afile = tmp_path / "notes.txt"
    afile.write_text("hello")
    for args in (("status", "--project", afile), ("set", "--project", afile)):
        out = cli_at_home(*args, home=tmp_path / "home", timeout=120)
        assert out.returncode == EXIT_NO_PROJECT, out.stderr
        assert "is a file, not a project folder" in out.stderr and "Traceback" not in out.stderr


def test_set_without_a_key_shows_every_setting(proj, tmp_path):
    out = cli_at_home("set", "--project", proj, home=tmp_path / "home", timeout=120)
    assert out.returncode == EXIT_OK, out.stderr
    shown = dict(line.split(" = ", 1) for line in out.stdout.splitlines())
    raw = json.loads((proj / "project.json").read_text())
    assert json.loads(shown["train.steps"]) == raw["train"]["steps"]
    assert json.loads(shown["train.lr"]) == raw["train"]["lr"]
    assert json.loads(shown["corpus.files"]) == raw["corpus"]["files"]
    assert json.loads(shown["materials.student.path"]) == raw["materials"]["student"]["path"]
    assert json.loads(shown["pack"]) == PACK
    assert len(shown) > 40  # every setting, not just the steps


# ---------------------------------------------------------------- projects that travel


def tree_state(root) -> dict[str, tuple[bytes, int]]:
    """Every file under root: bytes and mtime (a decoy must be neither read into nor written)."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def inside(tmp_path_factory, tiny_materials):
    """disk/proj: a finished run whose materials and prompt file live inside the project
    folder (as the demo's do); its GGUF is in disk/ (the default output folder)."""
    disk = tmp_path_factory.mktemp("travel") / "disk"
    root = disk / "proj"
    mats = root / "materials"
    mats.mkdir(parents=True)
    local = {"student": mats / "pig.gguf", "tokenizer": mats / "tok",
             "prompts": mats / "prompts.txt"}
    shutil.copyfile(tiny_materials["student"], local["student"])
    shutil.copytree(tiny_materials["tokenizer"], local["tokenizer"])
    shutil.copyfile(tiny_materials["prompts"], local["prompts"])
    make_project(root, PACK, local, **{"export.output_dir": ""})
    assert pipeline.run_foreground(ProjectPaths(root)) == 0
    return disk


def test_in_project_paths_are_stored_relative_and_read_absolute(inside):
    root = inside / "proj"
    raw = json.loads((root / "project.json").read_text())
    assert raw["materials"]["student"]["path"] == "materials/pig.gguf"
    assert raw["materials"]["student_tokenizer"]["path"] == "materials/tok"
    assert raw["corpus"]["files"] == ["materials/prompts.txt"]
    assert raw["export"]["output_dir"] == ""
    exports = json.loads((root / "exports.json").read_text())["files"]
    assert list(exports) == ["../pig_t5_adapter-f16.gguf"]  # beside the project, from the project
    proj = load_project(root)
    assert proj.material_path("student") == root / "materials" / "pig.gguf"
    assert proj.settings.corpus.files == [str(root / "materials" / "prompts.txt")]
    assert control.read_settings(root).values["corpus"]["files"] == [
        str(root / "materials/prompts.txt")
    ]


def test_a_moved_project_continues_with_nothing_recomputed_and_never_touches_its_old_place(
    inside, tmp_path, tiny_materials
):
    old = tmp_path / "old"
    shutil.copytree(inside, old, symlinks=True)
    new = tmp_path / "elsewhere" / "renamed"
    new.parent.mkdir()
    shutil.move(old / "proj", new)
    before = work_bytes(new)
    # a decoy: another project now sits at the old path, with the same file names
    make_project(old / "proj", PACK, tiny_materials, **{"export.output_dir": ""})
    decoy = tree_state(old)
    paths = ProjectPaths(new)
    info = control.status(new)
    assert str(new.parent) in json.dumps(control.results(new)) and str(old) not in json.dumps(info)
    start = len(paths.pipeline_log.read_bytes())
    assert pipeline.run_foreground(paths) == 0
    log = log_since(paths, start)
    assert work_bytes(new) == before  # shards, checkpoints, corpus: the same bytes
    assert not list(new.glob(f"{STALE_PREFIX}*")) and "redoing" not in log
    assert tree_state(old) == decoy
    # more steps continue from the checkpoint; the export lands beside the new folder
    update_settings(new, {"train.steps": 15})
    start = len(paths.pipeline_log.read_bytes())
    assert pipeline.run_foreground(paths) == 0
    log = log_since(paths, start)
    assert "resuming from last.pt at step 12" in log and "redoing" not in log
    assert json.loads((new / "checkpoints" / "last.json").read_text())["step"] == 15
    gguf = new.parent / "pig_t5_adapter-f16.gguf"
    assert gguf.is_file()
    assert json.loads((new / "exports.json").read_text())["files"].keys() == {f"../{gguf.name}"}
    assert tree_state(old) == decoy  # the decoy's files, its GGUF beside it included
    assert str(old) not in (new / "project.json").read_text()


def test_reset_output_in_a_copy_removes_only_the_copys_exports(inside, tmp_path):
    src = tmp_path / "a"
    shutil.copytree(inside, src, symlinks=True)
    copy = tmp_path / "b" / "proj"
    copy.parent.mkdir()
    subprocess.run(["cp", "-a", str(src / "proj"), str(copy)], check=True)
    original = src / "pig_t5_adapter-f16.gguf"
    kept = original.read_bytes()
    done = control.reset(copy, "output")  # its record names the file beside the copy: none yet
    assert original.read_bytes() == kept and not any(str(src) in p for p in done.deleted)
    # the copy exports beside itself; its reset removes that one, the original's stays
    assert pipeline.run_foreground(ProjectPaths(copy)) == 0
    mine = copy.parent / original.name
    assert mine.is_file()
    done = control.reset(copy, "output")
    assert str(mine) in done.deleted and not mine.exists() and original.read_bytes() == kept


def test_an_older_projects_absolute_export_records_in_a_copy_are_left_alone(inside, tmp_path):
    """exports.json written by an older version names absolute paths: in a copy they are the
    original's files, which the copy's reset must keep."""
    src = tmp_path / "a"
    shutil.copytree(inside, src, symlinks=True)
    ej = src / "proj" / "exports.json"
    files = json.loads(ej.read_text())["files"]
    ej.write_text(
        json.dumps(
            {"files": {str(places.recorded_path(k, src / "proj")): v for k, v in files.items()}}
        )
    )
    copy = tmp_path / "b" / "proj"
    copy.parent.mkdir()
    subprocess.run(["cp", "-a", str(src / "proj"), str(copy)], check=True)
    original = src / "pig_t5_adapter-f16.gguf"
    done = control.reset(copy, "output")
    assert original.is_file() and str(original) not in done.deleted
    assert any(k["path"] == str(original) for k in done.kept)


def _legacy_corpus_fingerprint(settings) -> dict:
    """The corpus fingerprint as versions before content identity wrote it: the settings with
    their paths, each file's sha256 keyed by its absolute path."""
    import hashlib
    from pathlib import Path

    files = {}
    for p in corpus.source_files(settings):
        files[str(p)] = (
            hashlib.sha256(Path(p).read_bytes()).hexdigest() if p.is_file() else "missing"
        )
    return {"settings": settings.corpus.model_dump(mode="json"), "files": files}


def _absolute_project_json(root) -> None:
    """project.json and exports.json as an older version wrote them: every path absolute."""
    pj = root / "project.json"
    pj.write_text(
        json.dumps(places.from_stored_settings(json.loads(pj.read_text()), root), indent=2)
    )
    ej = root / "exports.json"
    files = json.loads(ej.read_text())["files"]
    ej.write_text(
        json.dumps({"files": {str(places.recorded_path(k, root)): v for k, v in files.items()}})
    )


def test_an_older_project_stays_done_is_rewritten_relative_then_travels(
    tmp_path, tiny_materials, monkeypatch
):
    disk = tmp_path / "disk"
    root = disk / "proj"
    (root / "materials").mkdir(parents=True)
    prompts = root / "materials" / "prompts.txt"
    shutil.copyfile(tiny_materials["prompts"], prompts)
    make_project(root, PACK, {**tiny_materials, "prompts": prompts}, **{"export.output_dir": ""})
    with monkeypatch.context() as m:  # the run an older version made
        m.setattr(corpus, "fingerprint_inputs", _legacy_corpus_fingerprint)
        m.setattr(corpus, "legacy_same_content", lambda recorded, fp: False)
        assert pipeline.run_foreground(ProjectPaths(root)) == 0
    _absolute_project_json(root)
    recorded = atomic.read_json(root / "data" / MANIFEST_JSON)["inputs"]
    assert str(prompts) in recorded["files"]  # keyed by place, as it was
    before = work_bytes(root, exports=True)
    paths = ProjectPaths(root)
    start = len(paths.pipeline_log.read_bytes())
    assert pipeline.run_foreground(paths) == 0  # read as it is: nothing to redo
    assert work_bytes(root, exports=True) == before and "redoing" not in log_since(paths, start)
    assert str(prompts) in (root / "project.json").read_text()
    update_settings(root, {"train.steps": 12})  # a settings write (no change of value)...
    update_settings(root, {"train.log_every": 3})  # ...and one that writes
    raw = json.loads((root / "project.json").read_text())
    assert raw["corpus"]["files"] == ["materials/prompts.txt"]  # rewritten relative
    # moved, the old record still stands for the same content: nothing recomputed
    new = tmp_path / "moved" / "proj"
    new.parent.mkdir()
    shutil.move(root, new)
    paths = ProjectPaths(new)
    before = work_bytes(new)
    start = len(paths.pipeline_log.read_bytes())
    assert pipeline.run_foreground(paths) == 0
    log = log_since(paths, start)
    assert work_bytes(new) == before and "redoing" not in log, log
    assert not list(new.glob(f"{STALE_PREFIX}*"))
    # a real change of the prompt file's content is still a change
    with open(new / "materials" / "prompts.txt", "a", encoding="utf-8") as f:
        f.write("a new prompt about a lighthouse at dusk\n")
    start = len(paths.pipeline_log.read_bytes())
    assert pipeline.run_foreground(paths) == 0
    assert "corpus inputs changed" in log_since(paths, start)
    assert isinstance(atomic.read_json(new / "data" / MANIFEST_JSON)["inputs"]["files"], list)


def test_reset_output_in_a_copy_beside_the_original_keeps_the_originals_gguf(inside, tmp_path):
    """cp -a proj proj2 in the same folder: both records name the same GGUF beside them; the
    copy's reset leaves it, naming the project that records it too."""
    src = tmp_path / "a"
    shutil.copytree(inside, src, symlinks=True)
    subprocess.run(["cp", "-a", str(src / "proj"), str(src / "proj2")], check=True)
    original = src / "pig_t5_adapter-f16.gguf"
    done = control.reset(src / "proj2", "output")
    assert original.is_file() and str(original) not in done.deleted
    assert any("records it too" in k["reason"] for k in done.kept)


# ---------------------------------------------------------------- verify


def _rot(path, offset: int = -64) -> None:
    """Flip one byte, keeping size and mtime (bit rot: a run's verified.json cannot see it)."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_verify_finds_rot_and_repair_recomputes_just_the_damaged_shard(proj, capsys):
    shard = sorted((proj / "shards" / "train").glob("*.safetensors"))[1]
    good, before = shard.read_bytes(), work_bytes(proj)
    others = {k: v for k, v in before.items() if not k.endswith(shard.name) or "/train/" not in k}
    _rot(shard)
    assert cli.main(["verify", "--project", str(proj)]) == EXIT_USER
    out = capsys.readouterr().out
    assert f"{shard.name}: checksum mismatch (corrupted)" in out and "--repair" in out
    assert "shards/val: 2 whole, 0 damaged" in out and "checkpoints/last.pt: ok" in out
    assert shard.read_bytes() != good  # a report changes nothing
    assert cli.main(["verify", "--project", str(proj), "--repair"]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"recomputed: train/{shard.name}" in out and "every shard and checkpoint is whole" in out
    assert shard.read_bytes() == good  # recomputed to the same bytes
    assert {k: v for k, v in work_bytes(proj).items() if k in others} == others
    assert not list(proj.glob(f"{STALE_PREFIX}*"))


def test_verify_reports_a_damaged_checkpoint_with_what_to_do(proj, capsys):
    _rot(proj / "checkpoints" / "best.pt", offset=200)
    assert cli.main(["verify", "--project", str(proj)]) == EXIT_USER
    out = capsys.readouterr().out
    assert "checkpoints/best.pt:" in out and "damaged" in out and "checkpoints/last.pt: ok" in out


def test_verify_runs_as_a_job_for_the_gui(proj):
    from gguf_trainer.runner import jobs
    from gguf_trainer.ui.output_tab import verify_md

    _rot(min((proj / "shards" / "val").glob("*.safetensors")))
    control.start_verify(proj)
    job = jobs.wait(proj, "verify", timeout_s=300)
    assert job["status"] == "done", job
    assert job["result"]["ok"] is False
    shown = verify_md(control.verify_job(proj))
    assert "checksum mismatch" in shown and "1 damaged" in shown


def test_verify_of_a_file_or_a_non_project_exits_2(tmp_path):
    afile = tmp_path / "x.txt"
    afile.write_text("x")
    assert cli.main(["verify", "--project", str(afile)]) == EXIT_NO_PROJECT
    assert cli.main(["verify", "--project", str(tmp_path)]) == EXIT_NO_PROJECT


# ---------------------------------------------------------------- the tokenizer by content


def test_a_changed_student_tokenizer_is_a_changed_input(inside, tmp_path):
    disk = tmp_path / "disk"
    shutil.copytree(inside, disk, symlinks=True)
    root = disk / "proj"
    cfg = root / "materials" / "tok" / "tokenizer_config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "model_max_length": 77}))
    paths = ProjectPaths(root)
    start = len(paths.pipeline_log.read_bytes())
    assert pipeline.run_foreground(paths) == 0
    assert "precompute_val inputs changed (student_tokenizer" in log_since(paths, start)


def test_shards_recorded_before_the_tokenizer_was_an_input_keep_standing(inside):
    from gguf_trainer.stages.precompute import PRECOMPUTE_VAL

    project = load_project(inside / "proj")
    upstream = {"corpus": "0123456789abcdef"}
    now = PRECOMPUTE_VAL.inputs(project, upstream, None)
    assert now["student_tokenizer"]["files"] >= 2  # every file of the folder, by content
    older = {k: v for k, v in now.items() if k != "student_tokenizer"}
    assert PRECOMPUTE_VAL.inputs(project, upstream, older) == older  # same fingerprint as before
    assert "student_tokenizer" in PRECOMPUTE_VAL.inputs(
        project, upstream, {**older, "shard_size": 9}
    )


def test_a_copied_project_links_missing_materials_found_by_identity_then_names_link(
    tmp_path, monkeypatch
):
    """Copied to another machine: the recorded student and tokenizer paths do not exist
    there. The start links the pig_clip GGUF discovery finds (GGUF_TRAINER_MATERIALS), then
    names the tokenizer it found nowhere with the `link` command."""
    from material_repos import pig_clip_header_gguf

    from gguf_trainer.store.project import create_project

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("gguf_trainer.base.paths.PROJECTS_ROOT", tmp_path / "projects")
    shared = tmp_path / "shared"
    shared.mkdir()
    pig_clip_header_gguf(shared / "pig_clip-f16.gguf")
    monkeypatch.setenv("GGUF_TRAINER_MATERIALS", str(shared))
    gone = tmp_path / "the-other-machine"
    root = tmp_path / "copy" / "proj"
    create_project(
        root,
        PACK,
        overrides={
            "precompute.mock_teacher": True,
            "materials": {
                "student": {"path": str(gone / "pig_clip-f16.gguf")},
                "student_tokenizer": {"path": str(gone / "tok")},
            },
        },
    )
    with pytest.raises(UserError) as info:
        control.preflight(root)
    msg = str(info.value)
    assert "student tokenizer is missing" in msg and "\n" not in msg
    assert f"gguf-trainer link --project {root} student_tokenizer PATH" in msg
    assert load_project(root).material_path("student") == (shared / "pig_clip-f16.gguf").resolve()


# ---------------------------------------------------------------- places (pure path rules)


def test_places_store_inside_relative_and_leave_outside_absolute(tmp_path):
    real = tmp_path / "real"
    (real / "proj").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    root = tmp_path / "link" / "proj"  # a project reached through a linked folder
    data = {
        "materials": {
            "student": {"path": str(real / "proj" / "m" / "s.gguf")},  # resolved
            "teacher": {"path": "/models/t5"},
            "odd": {"path": 7},
        },
        "corpus": {
            "files": [str(root / "p.txt"), "/data/q.txt", 3],
            "train_file": "",
            "val_file": "~/v.txt",
            "image_folders": [str(root / "imgs")],
        },
        "export": {"output_dir": str(root / "output"), "copy_to": "/srv/ggk"},
    }
    stored = places.to_stored_settings(data, root)
    assert stored["materials"]["student"]["path"] == "m/s.gguf"
    assert (
        stored["materials"]["teacher"]["path"] == "/models/t5"
        and stored["materials"]["odd"]["path"] == 7
    )
    assert stored["corpus"]["files"] == ["p.txt", "/data/q.txt", 3]
    assert stored["corpus"]["val_file"] == "~/v.txt" and stored["corpus"]["image_folders"] == [
        "imgs"
    ]
    assert stored["export"] == {"output_dir": "output", "copy_to": "/srv/ggk"}
    back = places.from_stored_settings(stored, root)
    assert back["corpus"]["files"][0] == str(root / "p.txt") and back["export"][
        "output_dir"
    ] == str(root / "output")
    assert data["corpus"]["files"][0] == str(root / "p.txt")  # the input is not changed
    for path, key in (
        (root.parent / "x.gguf", "../x.gguf"),
        (root / "out" / "x.gguf", "out/x.gguf"),
        (tmp_path / "x.gguf", str(tmp_path / "x.gguf")),
    ):
        assert places.record_key(path, root) == key
        assert places.recorded_path(key, root) == path


def test_a_copy_with_an_outside_output_folder_never_deletes_or_overwrites_the_originals_gguf(
    tmp_path,
):
    """export.output_dir outside both projects (a shared models folder): a `cp -a` copy's
    exports.json names the original's very GGUF. The copy's reset keeps it and its export is
    refused before it would overwrite it; the original, and the original moved, still own it."""
    from gguf_trainer.stages import export as export_stage
    from gguf_trainer.store.project import check_name_clash

    out = tmp_path / "models"
    a = tmp_path / "a" / "proj"
    control.new_project(a, PACK, overrides={"export.output_dir": str(out)})
    gguf = load_project(a).final_gguf
    out.mkdir()
    gguf.write_bytes(b"GGUF the original's adapter")
    export_stage.record_export(load_project(a), gguf, kind="final")
    b = tmp_path / "b" / "proj"
    b.parent.mkdir()
    subprocess.run(["cp", "-a", str(a), str(b)], check=True)
    with pytest.raises(UserError, match="written by the project .* is not overwritten"):
        check_name_clash(load_project(b))
    kept = {k["path"]: k["reason"] for k in control.reset_plan(b, "output").keep}
    assert f"the project {a} wrote it and records it too" in kept[str(gguf)]
    assert str(gguf) not in control.reset(b, "output").deleted
    assert gguf.read_bytes() == b"GGUF the original's adapter"
    moved = tmp_path / "moved"
    a.rename(moved)  # a move is not a copy: the writer's old place holds no project
    check_name_clash(load_project(moved))
    assert str(gguf) in control.reset(moved, "output").deleted and not gguf.exists()


def test_a_copys_snapshot_never_overwrites_the_originals_in_an_outside_output_folder(
    inside, tmp_path
):
    """The snapshot GGUF is `<name>-step<N>-f16.gguf` in the output folder: with that folder
    outside both projects, a `cp -a` copy's snapshot at the original's step would overwrite
    the original's file. Refused with the sentence; the original's own snapshot still works."""
    from gguf_trainer.runner import snapshot

    src = tmp_path / "a"
    shutil.copytree(inside, src, symlinks=True)
    out = tmp_path / "models"
    update_settings(src / "proj", {"export.output_dir": str(out)})
    first = snapshot.run_snapshot(src / "proj", "last", fresh=False)
    gguf = out / first["path"].rsplit("/", 1)[-1]
    kept = gguf.read_bytes()
    copy = tmp_path / "b" / "proj"
    copy.parent.mkdir()
    subprocess.run(["cp", "-a", str(src / "proj"), str(copy)], check=True)
    with pytest.raises(UserError, match="written by the project .* is not overwritten"):
        snapshot.run_snapshot(copy, "last", fresh=False)
    assert gguf.read_bytes() == kept
    assert snapshot.run_snapshot(src / "proj", "last", fresh=False)["path"] == first["path"]


def test_a_snapshot_never_overwrites_a_users_file_at_its_name(inside, tmp_path):
    """`snapshot --no-fresh` onto `<name>-step<N>-f16.gguf` that the user put there (issue 29,
    item 2): refused in one sentence naming the file, the file untouched."""
    from gguf_trainer.runner import snapshot

    src = tmp_path / "a"
    shutil.copytree(inside, src, symlinks=True)
    out = tmp_path / "models"
    update_settings(src / "proj", {"export.output_dir": str(out)})
    out.mkdir()
    step = json.loads((src / "proj" / "checkpoints" / "last.json").read_text())["step"]
    user = out / f"{load_project(src / 'proj').settings.name}-step{step}-f16.gguf"
    user.write_bytes(b"the user's own file")
    with pytest.raises(UserError, match=f"{user.name} already exists and this project did not"):
        snapshot.run_snapshot(src / "proj", "last", fresh=False)
    assert user.read_bytes() == b"the user's own file"
