"""A project folder someone else planted: symbolic links where the tool's files belong.

Every file the GUI and the API read from a project to show or return (logs, metrics,
eval.json, snapshots.json, state.json, project.json) must be a regular file under the
project's real path, every component resolved; a link out, a linked folder on the way, a
FIFO are one sentence or "nothing there", and never the linked file's bytes. The project
folder itself may be a link (its target is the project).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gguf_trainer.base import project_file
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import control, downloads, jobs, processes, state
from gguf_trainer.store.project import load_project
from gguf_trainer.ui import live

PACK = "t5xxl_pixart"
SECRET = "SECRET-9f3c-do-not-serve"


@pytest.fixture
def proj(tmp_path) -> Path:
    root = tmp_path / "proj"
    control.new_project(root, PACK, overrides={"export.output_dir": str(tmp_path / "out")})
    return root


@pytest.fixture
def secret(tmp_path) -> Path:
    """A private file outside the project (an SSH key, a credentials JSON)."""
    folder = tmp_path / "home" / ".ssh"
    folder.mkdir(parents=True)
    path = folder / "id_rsa"
    path.write_text(json.dumps({"headline": SECRET, "val_cos": 0.5, "error": SECRET,
                                "snapshots": [{"step": 1, "path": SECRET}]}) + "\n")
    return path


def test_a_log_linked_to_a_secret_is_a_sentence_never_its_bytes(proj, secret):
    (proj / "pipeline.log").symlink_to(secret)
    with pytest.raises(project_file.UnsafeProjectFile, match="leads outside the project"):
        control.tail_log(proj, 0)
    cur = live.Cursor()
    live.read_new_log(cur, ProjectPaths(proj), "pipeline")  # what the Logs tab shows
    assert "leads outside the project" in cur.log_text and SECRET not in cur.log_text


def test_eval_json_linked_to_a_secret_is_not_returned(proj, secret):
    (proj / "eval.json").symlink_to(secret)
    with pytest.raises(project_file.UnsafeProjectFile):
        control.read_eval(proj)
    assert SECRET not in json.dumps(control.results(proj))


def test_project_json_linked_to_a_secret_is_not_returned(proj, secret):
    pj = proj / "project.json"
    secret.write_text(json.dumps({"pack": PACK, "name": "x", "note": SECRET}))
    pj.unlink()
    pj.symlink_to(secret)
    view = control.open_project(proj)
    assert not view.ok and "leads outside the project" in view.errors[0]
    assert SECRET not in json.dumps(view.as_dict())


def test_records_metrics_and_state_linked_out_read_as_nothing(proj, secret):
    for name in ("snapshots.json", "state.json", "metrics.jsonl", "exports.json"):
        (proj / name).symlink_to(secret)
    with pytest.raises(project_file.UnsafeProjectFile):
        control.list_snapshots(proj)
    assert state.read_metrics(ProjectPaths(proj), 0) == ([], 0)
    assert SECRET not in json.dumps(control.status(proj))
    assert SECRET not in json.dumps(control.list_exports(proj))


def test_a_linked_folder_on_the_way_cannot_escape(tmp_path, proj, secret):
    """Every component counts: checkpoints/ (or any folder) linked outside the project."""
    (proj / "checkpoints").symlink_to(secret.parent, target_is_directory=True)
    with pytest.raises(project_file.UnsafeProjectFile, match="leads outside"):
        project_file.read_bytes(proj, proj / "checkpoints" / "id_rsa")
    with pytest.raises(project_file.UnsafeProjectFile, match="leads outside"):
        project_file.read_bytes(proj, proj / "sub" / ".." / ".." / "home" / ".ssh" / "id_rsa")


def test_a_fifo_in_place_of_a_log_does_not_hang_the_reader(proj):
    os.mkfifo(proj / "pipeline.log")
    assert control.tail_log(proj, 0) == ("", 0)  # nothing to show, at once
    with pytest.raises(project_file.NotAFile, match="not a regular file"):
        project_file.read_bytes(proj, proj / "pipeline.log")
    with pytest.raises(project_file.NotAFile):
        project_file.open_append(proj, proj / "pipeline.log")


def test_a_project_folder_that_is_itself_a_link_works(tmp_path, proj):
    (proj / "eval.json").write_text(json.dumps({"headline": "cos", "val_cos": 0.75}))
    (proj / "pipeline.log").write_text("one\n")
    (proj / "inner.log").write_text("inner\n")
    (proj / "snapshot.log").symlink_to(proj / "inner.log")  # a link inside the project is fine
    link = tmp_path / "link-to-proj"
    link.symlink_to(proj, target_is_directory=True)
    assert control.read_eval(link)["val_cos"] == 0.75
    assert control.tail_log(link, 0) == ("one\n", 4)
    assert control.tail_log(link, 0, log="snapshot")[0] == "inner\n"
    assert control.open_project(link).ok


def test_a_missing_file_is_still_not_written_yet(proj):
    assert control.read_eval(proj) is None
    assert control.tail_log(proj, 0) == ("", 0)
    with pytest.raises(FileNotFoundError):
        project_file.resolve(proj, proj / "nothing.json")


def test_reset_in_a_folder_that_held_someone_elses_files_deletes_only_the_tools(tmp_path):
    """A project.json put into a folder with its own data/ and checkpoints/ (an older version
    let /create_project do that): reset corpus removes only folders holding nothing but
    files the tool writes there, and names what it left."""
    root = tmp_path / "mine"
    control.new_project(root, PACK)
    paths = ProjectPaths(root)
    (paths.data / "images").mkdir(parents=True)
    (paths.data / "notes.csv").write_text("my research\n")
    (paths.data / "train.jsonl").write_text("{}\n")
    (paths.checkpoints / "sub").mkdir(parents=True)
    (paths.checkpoints / "sub" / "thesis.pt").write_bytes(b"mine")
    (paths.shard_dir("val")).mkdir(parents=True)  # the tool's own: only its names
    (paths.shard_dir("val") / "val-00000.safetensors").write_bytes(b"s")
    (paths.shard_dir("val") / "manifest.json").write_text("{}")
    (paths.shard_dir("val") / ".manifest.json.x1.tmp").write_text("")
    plan = control.reset_plan(root, "corpus")
    kept = {k["path"]: k["reason"] for k in plan.keep}
    assert "holds notes.csv, which gguf-trainer did not write" in kept[str(paths.data)]
    assert "holds sub/thesis.pt" in kept[str(paths.checkpoints)]
    done = control.reset(root, "corpus")
    assert done.deleted == plan.delete and str(paths.shards) in done.deleted
    assert (paths.data / "notes.csv").read_text() == "my research\n"
    assert (paths.checkpoints / "sub" / "thesis.pt").read_bytes() == b"mine"
    assert not paths.shards.exists()


def test_logs_and_metrics_are_never_appended_through_a_link(proj, tmp_path):
    """`pipeline.log -> ~/.bashrc` must not get the run's output appended to it."""
    victim = tmp_path / "home" / ".bashrc"
    victim.parent.mkdir(parents=True)
    victim.write_text("export PATH=/usr/bin\n")
    paths = ProjectPaths(proj)
    for name in ("pipeline.log", "metrics.jsonl", "download.log"):
        (proj / name).symlink_to(victim)
    with pytest.raises(project_file.UnsafeProjectFile, match="symbolic link"):
        processes.spawn_detached(["true"], paths.pipeline_log, proj)  # nothing is started
    with pytest.raises(project_file.UnsafeProjectFile):
        state._open_metrics_for_append(paths.metrics_jsonl)
    with pytest.raises(project_file.UnsafeProjectFile):
        downloads._note(load_project(proj), "student: linked /x")
    assert victim.read_text() == "export PATH=/usr/bin\n"
    (proj / "metrics.jsonl").unlink()
    (proj / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "lo')  # torn last line
    with state._open_metrics_for_append(paths.metrics_jsonl) as f:
        f.write('{"step": 2}\n')
    assert (proj / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'


def test_a_job_state_linked_to_a_secret_is_never_shown(proj, secret):
    """snapshot-job.json / verify-job.json / render-job.json are shown by the Output tab and
    returned by the API (error, result, progress): a link out reads as no job."""
    for job in ("snapshot", "verify", "render"):
        (proj / f"{job}-job.json").symlink_to(secret)
    shown = [control.snapshot_job(proj), control.verify_job(proj), jobs.job_status(proj, "render")]
    assert all(j["status"] == "idle" for j in shown)
    assert SECRET not in json.dumps(shown)
