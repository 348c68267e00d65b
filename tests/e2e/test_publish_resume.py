"""A publish killed mid-upload resumes: the first `gguf-trainer publish` (a subprocess) sends one
LFS object whole and is killed while the Hub holds the second one's PUT; the second publish
sends only the object the Hub lacks and ends in one commit holding both files and the card."""

from __future__ import annotations

import hashlib
import json
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


UPLOAD = ("import json, sys; from pathlib import Path; "
          "from gguf_trainer.materials import hub_upload; "
          "files = {n: Path(p) for n, p in json.loads(sys.argv[2]).items()}; "
          "files['README.md'] = b'# card'; "
          "print(json.dumps(hub_upload.upload(sys.argv[1], files, False, 'Upload')))")


def test_a_killed_xet_upload_sends_only_the_xorb_the_cas_lacks(hub_server, tmp_path, monkeypatch):
    """huggingface_hub takes the Xet path whenever hf_xet is installed (the default install):
    hf_xet packs the files into xorbs of up to 64 MB, and a killed upload's next run sends
    only the xorbs hf_xet had not recorded as sent (its session's xorb records, flushed after
    every xorb because hub_upload asks it to) - then one commit, the files whole."""
    from hub_xet_routes import XetStore
    from huggingface_hub import constants

    hub_server.tokens.add(TOKEN)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.delenv("HF_HUB_DISABLE_XET")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", False)
    monkeypatch.setenv("HF_XET_XORB_COMPRESSION_POLICY", "none")  # the fake decodes no LZ4
    xet = hub_server.xet = XetStore()
    files = {}
    for name in ("pig_a-f16.gguf", "pig_b-f16.gguf"):  # 80 MiB: two xorbs
        files[name] = tmp_path / name
        files[name].write_bytes(os.urandom(40 << 20))
    cmd = [sys.executable, "-c", UPLOAD, REPO, json.dumps({n: str(p) for n, p in files.items()})]
    xet.hold_xorb(2)
    proc = subprocess.Popen(cmd, env=dict(os.environ), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    records = lambda: list((tmp_path / "hf_home").glob("xet/*/staging/*/xorb_metadata/*"))
    try:
        wait_for(lambda: proc.poll() is not None
                 or (len(xet.xorbs) == 1 and xet.xorb_held() and records()), timeout_s=120,
                 what="one xorb stored and recorded by hf_xet, the other's POST held")
        assert proc.poll() is None, proc.communicate()
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    xet.release_xorbs()  # the held body is never read: not stored
    stored = set(xet.xorbs)
    missing = [h for h in xet.xorb_posts if h not in stored]
    assert len(stored) == 1 and len(missing) == 1 and not hub_server.commits
    sent_before = len(xet.xorb_posts)

    done = subprocess.run(cmd, env=dict(os.environ), capture_output=True, text=True,
                          check=False)

    assert done.returncode == 0, done.stderr[-2000:]
    assert xet.xorb_posts[sent_before:] == missing  # only what the CAS lacked
    assert len(hub_server.commits) == 1
    repo = hub_server.repos[("model", REPO)]
    assert sorted(repo.files) == sorted([*files, "README.md"])
    for name, path in files.items():
        assert repo.files[name] == path.read_bytes(), name
    assert not any(p.startswith("/_lfs/") for _, p, _ in hub_server.requests)  # Xet, not LFS
