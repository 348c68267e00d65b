"""Projects that travel and heal (issue 20), through the real pipeline (in-process).

Bookkeeping damage never costs a stage: a missing or damaged manifest (data/, shards/*/,
checkpoints/) is rebuilt from the fingerprints the shards and checkpoints record, and only a
real input change moves work aside. The remaining hostile inputs of the catalogue: a
binary prompt file, --auto-resume with a last_project that is not a string, --project naming
a file, `set` with no KEY.
"""

from __future__ import annotations

import json
import shutil

import pytest
from pipeline_helpers import cli_at_home, make_project

from gguf_trainer import atomic, corpus
from gguf_trainer.errors import UserError
from gguf_trainer.exit_codes import EXIT_NO_PROJECT, EXIT_OK
from gguf_trainer.paths import MANIFEST_JSON, STALE_PREFIX, ProjectPaths
from gguf_trainer.project import update_settings
from gguf_trainer.runner import pipeline, supervisor

PACK = "t5xxl_pixart"
MANIFEST_FOLDERS = ("data", "shards/val", "shards/train", "checkpoints")


def work_bytes(root) -> dict[str, bytes]:
    """What a redone stage would rewrite: the corpus, every shard and checkpoint, the export."""
    files = [*root.glob("data/*.jsonl"), *root.glob("shards/*/*.safetensors"),
             *root.glob("checkpoints/*.pt"), *root.parent.glob("*.gguf")]
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
    before = work_bytes(proj)
    for folder in folders:
        _damage(proj / folder / MANIFEST_JSON, how)
    start = len(paths.pipeline_log.read_bytes())
    assert pipeline.run_foreground(paths) == 0
    log = log_since(paths, start)
    assert work_bytes(proj) == before  # no stage was redone: the same bytes
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
        corpus.read_source(path)
    msg = str(info.value)
    assert "is not a text file" in msg and str(path) in msg and "\n" not in msg


def test_a_text_file_with_a_few_binary_lines_still_trains_on_the_rest(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_bytes(b"a red fox in the snow\n" * 5 + b"bin\x00ary\n" * 2)
    assert [s.text for s in corpus.read_source(path)] == ["a red fox in the snow"] * 5


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
