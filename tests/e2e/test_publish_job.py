"""The GUI's Publish is a detached job (runner/publish_job.py) against the local Hub: while it
runs (its second object's PUT held by the Hub) a second publish of the project, from the GUI
or the CLI, is refused; Stop ends the upload before any commit; the next publish sends only the
object the Hub lacks and ends in one commit, and the Output tab's box, read afresh (a reload,
a new GUI), says where it went. A failed job shows its one sentence; a job killed -9 leaves no
upload behind that would commit unrecorded."""

from __future__ import annotations

import hashlib
import os
import signal

import psutil
import pytest
from publish_project import make_project, write_export
from waiting import wait_for

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.exit_codes import EXIT_USER
from gguf_trainer.cli import main
from gguf_trainer.runner import publish_job
from gguf_trainer.ui import common, publish_section

pytestmark = pytest.mark.slow

TOKEN = "hf_publish_job_token"
REPO = "tester/pig-t5-job"


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shown(project) -> str:
    """The box's text as a page opened now shows it (nothing kept from earlier views)."""
    return publish_section.view(str(project.dir), None)[2]


def uploader(job_pid: int) -> psutil.Process:
    """The job's upload child (a spawned interpreter), once it exists."""
    job = psutil.Process(job_pid)
    return wait_for(lambda: next((c for c in job.children() if "spawn" in " ".join(c.cmdline())),
                                 None), what="the publish job's upload child")


@pytest.fixture
def held(hub_server, tmp_path, monkeypatch):
    """A project with two exports, a job publishing both, and the Hub holding the second's
    PUT after storing the first: (hub, project, final, snapshot, job state)."""
    hub_server.tokens.add(TOKEN)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    project, final = make_project(tmp_path)
    snap = write_export(project, project.snapshot_gguf(250), "snapshot", 250, seed=1)
    hub_server.hold_put(sha256(snap))
    st = publish_job.start_publish(project.dir, REPO, files=[final.name, snap.name])
    assert st["status"] == "running" and st["pid"]
    wait_for(lambda: sha256(final) in hub_server.lfs.get(("model", REPO), {})
             and hub_server.put_arrived(sha256(snap)),
             what="the first object stored and the second one's PUT held")
    yield hub_server, project, final, snap, st
    hub_server.release_put(sha256(snap))


def test_stop_ends_the_upload_and_publishing_again_sends_only_the_rest(held, capsys):
    hub, project, final, snap, st = held
    assert shown(project).startswith(f"**Publishing** (pid {st['pid']}): uploading ")
    button, stop = publish_section.view(str(project.dir), None)[:2]
    assert button["interactive"] is False and stop["interactive"] is True

    with pytest.raises(UserError, match="a publish of this project is already running"):
        publish_job.start_publish(project.dir, REPO)
    code = main(["publish", "--project", str(project.dir), "--repo", REPO])
    err = capsys.readouterr().err
    assert code == EXIT_USER and "a publish of this project is already running" in err

    child = uploader(st["pid"])
    assert publish_job.stop_publish(project.dir) == "stopped"
    assert publish_job.publish_status(project.dir)["status"] == "stopped"
    wait_for(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE,
             what="the upload child ended by Stop")
    assert "stopped before its commit" in shown(project)
    hub.release_put(sha256(snap))  # its body arrives torn: not stored
    assert not hub.commits and sha256(snap) not in hub.lfs[("model", REPO)]
    sent_before = len(hub.lfs_puts())

    publish_job.start_publish(project.dir, REPO, files=[final.name, snap.name])
    done = publish_job.jobs.wait(project.dir, "publish", timeout_s=300)
    assert done["status"] == "done", done
    assert hub.lfs_puts()[sent_before:] == [sha256(snap)]  # only what the Hub lacked
    assert len(hub.commits) == 1
    assert sorted(hub.commits[0]["files"]) == sorted([final.name, snap.name, "README.md"])
    assert hub.repos[("model", REPO)].files[snap.name] == snap.read_bytes()
    assert done["result"]["url"] == f"{hub.url}/{REPO}" and "card" not in done["result"]
    text = shown(project)  # not "created": the stopped job made the repo
    assert text.startswith(f"* published {final.name}, {snap.name}, README.md to "
                           f"{hub.url}/{REPO} (commit {hub.commits[0]['oid'][:10]})")
    button, stop = publish_section.view(str(project.dir), None)[:2]
    assert button["interactive"] is True and stop["interactive"] is False


def test_a_job_killed_outright_leaves_no_upload_that_commits(held):
    hub, project, _final, snap, st = held
    child = uploader(st["pid"])
    os.kill(st["pid"], signal.SIGKILL)
    wait_for(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE,
             what="the orphaned upload child ending itself")
    hub.release_put(sha256(snap))
    status = publish_job.publish_status(project.dir)
    assert status["status"] == "interrupted" and not hub.commits
    assert shown(project).startswith("Last publish interrupted: the publish job (pid ")


def test_a_failed_publish_job_shows_its_one_sentence(hub_server, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_token_this_hub_knows")
    project, _ = make_project(tmp_path)
    publish_job.start_publish(project.dir, REPO)
    done = publish_job.jobs.wait(project.dir, "publish", timeout_s=300)
    assert done["status"] == "failed"
    assert done["error"] == ("the Hub refused your token for tester/pig-t5-job (401); log in "
                             "with a token that may write (`gguf-trainer login`, or HF_TOKEN), "
                             "then publish again.")
    assert shown(project) == f"Last publish failed: {common.gui_words(done['error'])}"
    assert not hub_server.commits


def test_refusals_come_before_a_job_is_started(hub_server, tmp_path):
    project, _ = make_project(tmp_path, mock=True)
    with pytest.raises(UserError, match="trained with the mock teacher"):
        publish_job.start_publish(project.dir, REPO)
    assert publish_job.publish_status(project.dir)["status"] == "idle"
    assert hub_server.requests == [] and shown(project) == ""
