"""Issue 31 item 1: a material no repo holds (a pack's "link a local copy" teacher) is never
downloaded. Download (GUI and CLI) skips it with one sentence saying where to get it and how
to link it, its status row says the same (never "interrupted"), and `new` prints `link` for it.
Every registered pack is tried: Download either downloads or says what to link."""

from __future__ import annotations

import pytest
from material_repos import TOK_REPO, tokenizer_files

from gguf_trainer import cli
from gguf_trainer.packs import get_pack, pack_ids
from gguf_trainer.runner import downloads, jobs, material_status
from gguf_trainer.store.project import create_project, load_project
from gguf_trainer.ui import materials_section

LINK_ONLY = [p for p in pack_ids()
             if any(not m.repo for m in get_pack(p).teacher_materials)]


@pytest.fixture
def hub(hub_server, tmp_path, monkeypatch):
    material_status._listing_cache.clear()
    hub_server.add_repo(TOK_REPO, tokenizer_files())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "gt_home"))
    monkeypatch.delenv("GGUF_TRAINER_MATERIALS", raising=False)
    monkeypatch.setattr("gguf_trainer.base.paths.PROJECTS_ROOT", tmp_path / "projects")
    return hub_server


def test_six_packs_declare_a_teacher_to_link():
    assert len(LINK_ONLY) >= 6, LINK_ONLY


@pytest.mark.parametrize("pack_id", LINK_ONLY)
def test_download_skips_a_teacher_no_repo_holds_with_the_link_sentence(hub, tmp_path, pack_id):
    root = tmp_path / "projects" / pack_id
    create_project(root, pack_id)
    lines: list[str] = []
    failures = downloads.download_foreground(root, on_line=lines.append)  # no HFValidationError
    teacher = next(line for line in lines if line.startswith("teacher:"))
    assert "no public repo holds it, so it is never downloaded" in teacher, teacher
    assert f"gguf-trainer link --project {root} teacher PATH" in teacher
    assert any(line.startswith("student_tokenizer: ready") for line in lines), lines
    assert failures == 2  # the student and the teacher are still to link: not an internal error
    row = next(r for r in downloads.material_statuses(root) if r["id"] == "teacher")
    assert row["state"] == "missing" and row["note"] is None
    assert row["error"] == teacher.split(" - ", 1)[1]
    # detached (the GUI's Download): skipped with the same sentence, nothing started
    started = downloads.start_download(root)
    skipped = next(r for r in started if r["id"] == "teacher")
    assert skipped["action"] == "skipped" and "never downloaded" in skipped["message"]
    toast = materials_section.download_toast(started)
    assert "Setup → Materials: Replace" in toast and "gguf-trainer" not in toast
    # the GUI offers no Download for it
    _table, fetch, choice, _one = materials_section.materials_view(str(root))
    assert fetch["interactive"] is False and choice["choices"] == []


def test_an_old_interrupted_job_is_not_reported_for_a_teacher_no_repo_holds(hub, tmp_path):
    """The crash left a download job behind; the row said "interrupted; start it again"."""
    root = tmp_path / "projects" / "boogu"
    create_project(root, "qwen3vl_boogu")
    project = load_project(root)
    m = next(m for m in project.pack.teacher_materials)
    folder = downloads.job_folder(downloads.destination(project, m))
    folder.mkdir(parents=True)
    jobs.JobHandle(folder, downloads.JOB_NAME, {"schema": 1, "name": downloads.JOB_NAME,
                                                "status": "stopped", "pid": 1, "progress": {},
                                                "error": "interrupted"}).write()
    row = material_status.material_status(project, m, online=True)
    assert row["state"] == "missing" and "interrupted" not in str(row["note"])
    assert "never downloaded" in row["error"]


@pytest.mark.parametrize("pack_id, links_teacher", [("qwen3vl_boogu", True),
                                                    ("t5xxl_pixart", False)])
def test_new_prints_link_for_a_teacher_no_repo_holds(tmp_path, capsys, pack_id, links_teacher):
    root = tmp_path / "p"
    assert cli.main(["new", "--pack", pack_id, str(root)]) == 0
    out = capsys.readouterr().out
    assert (f"gguf-trainer link --project {root} teacher" in out) is links_teacher, out
    assert f"gguf-trainer download --project {root}" in out  # the tokenizer at least
