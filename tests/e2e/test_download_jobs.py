"""Material downloads as detached jobs and in the foreground CLI, against the local Hub.

The jobs are real subprocesses (runner.jobs) that reach tests/hub_server.py through
HF_ENDPOINT in their environment. A "mid-file" moment is made by the server pausing a file
after a byte count, never by sleeping.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save as st_save

from gguf_trainer.project import create_project, load_project
from gguf_trainer.runner import downloads, jobs

pytestmark = pytest.mark.slow

TOKEN = "hf_e2eSECRETtoken9876543210"
T5_REPO = "callgg/t5-v1_1-xxl-encoder-bf16"
TOK_REPO = "callgg/pig-clip-tokenizer"
BIG = "model.safetensors"
CHUNK = 10 * 1024 * 1024  # huggingface_hub writes the body in 10 MiB chunks
PAUSE_AT = CHUNK + 4096


def _big_weights() -> bytes:
    # ~12 MiB: more than one client chunk, so a kill after the first chunk leaves a partial.
    return st_save({"w": np.random.default_rng(0).standard_normal(3_100_000).astype(np.float32)})


def _t5_files() -> dict[str, bytes]:
    return {"config.json": b'{"d_model": 4096}', "generation_config.json": b"{}",
            BIG: _big_weights(), "special_tokens_map.json": b"{}",
            "spiece.model": b"sp" * 700, "tokenizer_config.json": b"{}",
            "README.md": b"not wanted"}


def _tok_files() -> dict[str, bytes]:
    return {name: b"{}" for name in ("config.json", "generation_config.json", "tokenizer.json",
                                     "tokenizer_config.json", "vocab.json", "merges.txt")}


@pytest.fixture
def project(hub_server, tmp_path, monkeypatch):
    """A PixArt project whose teacher and tokenizer live on the local Hub."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GGUF_TRAINER_MATERIALS", raising=False)
    monkeypatch.setattr("gguf_trainer.project.PROJECTS_ROOT", tmp_path / "projects")
    monkeypatch.setenv("GGUF_TRAINER_PROJECTS", str(tmp_path / "projects"))
    files = _t5_files()
    hub_server.add_repo(T5_REPO, files)
    hub_server.add_repo(TOK_REPO, _tok_files())
    root = tmp_path / "projects" / "t5"
    create_project(root, "t5xxl_pixart")
    return root, files


def _wait(predicate, timeout_s: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _status(root, material_id: str) -> dict:
    return next(r for r in downloads.material_statuses(root) if r["id"] == material_id)


def _partial_size(dest: Path) -> int:
    return sum(p.stat().st_size for p in (dest / ".cache").rglob("*.part"))


def test_killed_download_resumes_to_identical_bytes(project, hub_server):
    root, files = project
    dest = root / "materials" / "t5-v1_1-xxl-encoder-bf16"
    assert _status(root, "teacher")["state"] == "missing"
    hub_server.pause(BIG, PAUSE_AT)
    started = downloads.start_download(root, ["teacher"])
    assert [r["action"] for r in started] == ["started"]
    pid = started[0]["pid"]
    _wait(lambda: _partial_size(dest) >= CHUNK, what="the first chunk on disk")
    st = _status(root, "teacher")
    assert st["state"] == "downloading" and st["pid"] == pid and st["files_total"] == 6
    os.kill(pid, signal.SIGKILL)
    _wait(lambda: not jobs.is_running(downloads.job_folder(dest), "download"), what="the kill")
    st = _status(root, "teacher")
    assert st["state"] == "partial" and "interrupted" in st["note"]
    assert st["bytes_partial"] >= CHUNK and not (dest / BIG).exists()
    hub_server.release(BIG)

    again = downloads.start_download(root, ["teacher"])
    assert again[0]["action"] == "started"
    done = jobs.wait(downloads.job_folder(dest), "download", timeout_s=60)
    assert done["status"] == "done", done
    assert (dest / BIG).read_bytes() == files[BIG]
    ranges = [h.get("range") for h in hub_server.get_requests("/" + BIG)]
    assert ranges[0] is None and int(ranges[-1][len("bytes="):-1]) >= CHUNK  # resumed
    assert not (dest / "README.md").exists()  # only the pack's patterns
    st = _status(root, "teacher")
    assert st["state"] == "ready" and st["files_done"] == st["files_total"] == 6
    assert load_project(root).material_path("teacher") == dest.resolve()


def test_two_concurrent_starts_download_once(project, hub_server):
    root, files = project
    dest = root / "materials" / "t5-v1_1-xxl-encoder-bf16"
    hub_server.pause(BIG, PAUSE_AT)
    results, barrier = [], threading.Barrier(2)

    def click():
        barrier.wait()
        results.extend(downloads.start_download(root, ["teacher"]))

    threads = [threading.Thread(target=click) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(r["action"] for r in results) == ["running", "started"], results
    assert len({r["pid"] for r in results}) == 1
    # A foreground CLI download at the same time finds the job instead of starting another.
    lines = []
    assert downloads.download_foreground(root, ["teacher"], on_line=lines.append) == 0
    assert lines == [f"teacher: downloading (pid {results[0]['pid']})"]
    hub_server.release(BIG)
    assert jobs.wait(downloads.job_folder(dest), "download", timeout_s=60)["status"] == "done"
    assert len(hub_server.get_requests("/" + BIG)) == 1
    assert (dest / BIG).read_bytes() == files[BIG]


def test_token_reaches_the_hub_but_no_file_or_payload(project, hub_server, monkeypatch, tmp_path):
    root, _files = project
    hub_server.add_repo(T5_REPO, _t5_files(), gated=True)
    failed = downloads.start_download(root, ["teacher"])[0]
    dest = root / "materials" / "t5-v1_1-xxl-encoder-bf16"
    st = jobs.wait(downloads.job_folder(dest), "download", timeout_s=60)
    assert st["status"] == "failed" and "hf auth login" in st["error"], (failed, st)
    row = _status(root, "teacher")
    assert row["state"] == "failed" and "gated" in row["error"]

    hub_server.tokens.add(TOKEN)
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # the job gets it through its environment only
    payloads = downloads.start_download(root, ["teacher"])
    assert jobs.wait(downloads.job_folder(dest), "download", timeout_s=60)["status"] == "done"
    payloads += downloads.material_statuses(root)
    assert _status(root, "teacher")["state"] == "ready"
    assert hub_server.get_requests("/" + BIG)[-1]["authorization"] == f"Bearer {TOKEN}"
    assert TOKEN not in json.dumps(payloads)
    for p in tmp_path.rglob("*"):
        if p.is_file():
            assert TOKEN.encode() not in p.read_bytes(), p


def _cli(root, *args, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gguf_trainer.cli", *args, "--project", str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def test_cli_download_ctrl_c_keeps_a_partial_that_resumes(project, hub_server):
    root, files = project
    dest = root / "materials" / "t5-v1_1-xxl-encoder-bf16"
    hub_server.pause(BIG, PAUSE_AT)
    proc = _cli(root, "download")
    _wait(lambda: _partial_size(dest) >= CHUNK, what="the first chunk on disk")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "student_tokenizer: ready" in out
    hub_server.release(BIG)
    proc = _cli(root, "download", "--required-only")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out  # the student GGUF is a local file nobody set yet
    assert "teacher: ready at" in out and "student: missing" in out
    assert (dest / BIG).read_bytes() == files[BIG]
    assert int(hub_server.get_requests("/" + BIG)[-1]["range"][6:-1]) >= CHUNK
    proc = _cli(root, "materials", "--json")
    rows = {r["id"]: r for r in json.loads(proc.communicate(timeout=60)[0])}
    assert rows["teacher"]["state"] == rows["student_tokenizer"]["state"] == "ready"
