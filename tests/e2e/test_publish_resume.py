"""A publish killed mid-upload resumes: the first `gguf-trainer publish` (a subprocess) sends one
LFS object whole and is killed while the Hub holds the second one's PUT; the second publish
sends only the object the Hub lacks and ends in one commit holding both files and the card."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
from publish_project import make_project, write_export
from waiting import wait_for

from gguf_trainer.runner import publish

pytestmark = pytest.mark.slow

TOKEN = "hf_publish_resume_token"
REPO = "tester/pig-t5-resume"


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_killed_publish_sends_only_the_missing_object_then_commits_once(
        hub_server, tmp_path, monkeypatch):
    hub_server.tokens.add(TOKEN)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    project, final = make_project(tmp_path)
    snap = write_export(project, project.snapshot_gguf(250), "snapshot", 250, seed=1)
    first, second = sha256(final), sha256(snap)
    assert first != second
    hub_server.hold_put(second)
    stored = lambda: hub_server.lfs.get(("model", REPO), {})
    cmd = [sys.executable, "-m", "gguf_trainer.cli", "publish", "--project", str(project.dir),
           "--repo", REPO, "--file", final.name, "--file", snap.name]
    proc = subprocess.Popen(cmd, env=dict(os.environ), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        wait_for(lambda: proc.poll() is not None
                 or (first in stored() and hub_server.put_arrived(second)),
                 what="the first object stored and the second one's PUT held")
        assert proc.poll() is None, proc.communicate()
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    hub_server.release_put(second)  # its body arrives torn (the client is gone): not stored
    assert first in stored() and second not in stored() and not hub_server.commits
    sent_before = len(hub_server.lfs_puts())

    res = publish.publish(project.dir, REPO, files=[final.name, snap.name])

    assert hub_server.lfs_puts()[sent_before:] == [second]  # only what the Hub lacked
    assert len(hub_server.commits) == 1 and res["changed"]
    assert sorted(hub_server.commits[0]["files"]) == sorted([final.name, snap.name, "README.md"])
    repo = hub_server.repos[("model", REPO)]
    assert repo.files[final.name] == final.read_bytes()
    assert repo.files[snap.name] == snap.read_bytes()
