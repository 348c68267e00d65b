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
from pathlib import Path

import pytest
from material_repos import (
    T5_REPO,
    TOK_REPO,
    VIDPROM_CSV,
    VIDPROM_REPO,
    tiny_t5_files,
    tokenizer_files,
    vidprom_files,
    vidprom_prompt,
)
from waiting import wait_for as _wait

from gguf_trainer.materials.prompt_presets import PRESETS, read_preset
from gguf_trainer.runner import downloads, jobs
from gguf_trainer.store.project import create_project, load_project

pytestmark = pytest.mark.slow

TOKEN = "hf_e2eSECRETtoken9876543210"
CHUNK = 10 * 1024 * 1024  # huggingface_hub writes the body in 10 MiB chunks
PAUSE_AT = CHUNK + 4096
N_ROWS = 160_000  # ~13 MB of CSV: more than one client chunk, so a kill leaves a partial
BIG = VIDPROM_CSV


@pytest.fixture
def project(hub_server, tmp_path, monkeypatch):
    """A PixArt project selecting VidProM, whose teacher, tokenizer and dataset live on the
    local Hub (the teacher is the tiny real T5 snapshot, so content checks pass too)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GGUF_TRAINER_MATERIALS", raising=False)
    monkeypatch.setattr("gguf_trainer.base.paths.PROJECTS_ROOT", tmp_path / "projects")
    monkeypatch.setenv("GGUF_TRAINER_PROJECTS", str(tmp_path / "projects"))
    files = vidprom_files(N_ROWS)
    hub_server.add_repo(T5_REPO, tiny_t5_files())
    hub_server.add_repo(TOK_REPO, tokenizer_files())
    hub_server.add_repo(VIDPROM_REPO, files, repo_type="dataset")
    root = tmp_path / "projects" / "t5"
    create_project(root, "t5xxl_pixart", overrides={"corpus.presets": ["vidprom"]})
    return root, files


def _status(root, material_id: str) -> dict:
    return next(r for r in downloads.material_statuses(root) if r["id"] == material_id)


def _partial_size(dest: Path) -> int:
    return sum(p.stat().st_size for p in (dest / ".cache").rglob("*.part"))


VIDPROM = PRESETS["vidprom"]  # material id "prompts_vidprom"


def _vidprom_dest(root: Path) -> Path:
    return root / "materials" / "datasets" / "VidProM"


def test_killed_download_resumes_to_identical_bytes(project, hub_server):
    root, files = project
    dest = _vidprom_dest(root)
    assert _status(root, VIDPROM.id)["state"] == "missing"
    hub_server.pause(BIG, PAUSE_AT)
    started = downloads.start_download(root, [VIDPROM.id])
    assert [r["action"] for r in started] == ["started"]
    pid = started[0]["pid"]
    _wait(lambda: _partial_size(dest) >= CHUNK, what="the first chunk on disk")
    st = _status(root, VIDPROM.id)
    assert st["state"] == "downloading" and st["pid"] == pid and st["files_total"] == 1
    os.kill(pid, signal.SIGKILL)
    _wait(lambda: not jobs.is_running(downloads.job_folder(dest), "download"), what="the kill")
    st = _status(root, VIDPROM.id)
    assert st["state"] == "partial" and "interrupted" in st["note"]
    assert st["bytes_partial"] >= CHUNK and not (dest / BIG).exists()
    hub_server.release(BIG)

    again = downloads.start_download(root, [VIDPROM.id])
    assert again[0]["action"] == "started"
    done = jobs.wait(downloads.job_folder(dest), "download", timeout_s=300)
    assert done["status"] == "done", done
    assert (dest / BIG).read_bytes() == files[BIG]
    ranges = [h.get("range") for h in hub_server.get_requests("/" + BIG)]
    assert ranges[0] is None and int(ranges[-1][len("bytes="):-1]) >= CHUNK  # resumed
    assert not (dest / "VidProM_embed.hdf5").exists()  # only the preset's data file
    st = _status(root, VIDPROM.id)
    assert st["state"] == "ready" and st["files_done"] == st["files_total"] == 1
    assert load_project(root).material_path(VIDPROM.id) == dest.resolve()
    prompts = list(read_preset(dest, VIDPROM))
    assert len(prompts) == N_ROWS and prompts[-1] == vidprom_prompt(N_ROWS - 1)


def test_two_concurrent_starts_download_once(project, hub_server):
    root, files = project
    dest = _vidprom_dest(root)
    hub_server.pause(BIG, PAUSE_AT)
    results, barrier = [], threading.Barrier(2)

    def click():
        barrier.wait()
        results.extend(downloads.start_download(root, [VIDPROM.id]))

    threads = [threading.Thread(target=click) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(r["action"] for r in results) == ["running", "started"], results
    assert len({r["pid"] for r in results}) == 1
    # A foreground CLI download at the same time finds the job instead of starting another.
    lines = []
    assert downloads.download_foreground(root, [VIDPROM.id], on_line=lines.append) == 0
    assert lines == [f"{VIDPROM.id}: downloading (pid {results[0]['pid']})"]
    _wait(lambda: _partial_size(dest) >= CHUNK, what="the first chunk on disk")
    assert downloads.stop_download(root, VIDPROM.id) == "stopped"  # mid-read, server stalled
    st = _status(root, VIDPROM.id)
    assert st["state"] == "partial" and "interrupted" in st["note"], st
    hub_server.release(BIG)
    assert downloads.start_download(root, [VIDPROM.id])[0]["action"] == "started"
    assert jobs.wait(downloads.job_folder(dest), "download", timeout_s=300)["status"] == "done"
    assert [h.get("range") is None for h in hub_server.get_requests("/" + BIG)] == [True, False]
    assert (dest / BIG).read_bytes() == files[BIG]


def test_token_reaches_the_hub_but_no_file_or_payload(project, hub_server, monkeypatch, tmp_path):
    root, _files = project
    hub_server.add_repo(T5_REPO, tiny_t5_files(), gated=True)
    failed = downloads.start_download(root, ["teacher"])[0]
    dest = root / "materials" / "t5-v1_1-xxl-encoder-bf16"
    st = jobs.wait(downloads.job_folder(dest), "download", timeout_s=300)
    assert st["status"] == "failed" and "hf auth login" in st["error"], (failed, st)
    row = _status(root, "teacher")
    assert row["state"] == "failed" and "gated" in row["error"]

    hub_server.tokens.add(TOKEN)
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # the job gets it through its environment only
    payloads = downloads.start_download(root, ["teacher"])
    assert jobs.wait(downloads.job_folder(dest), "download", timeout_s=300)["status"] == "done"
    payloads += downloads.material_statuses(root)
    assert _status(root, "teacher")["state"] == "ready"
    # the job's content check
    assert "teacher: checked: " in (root / downloads.DOWNLOAD_LOG).read_text()
    auth = {h.get("authorization") for h in hub_server.get_requests("/model.safetensors")}
    assert auth == {f"Bearer {TOKEN}"}
    assert TOKEN not in json.dumps(payloads)
    for p in tmp_path.rglob("*"):
        if p.is_file():
            assert TOKEN.encode() not in p.read_bytes(), p


# A suite started in the background (`cmd &`, nohup, some CI runners) hands its children SIGINT
# ignored, and Python then installs no KeyboardInterrupt handler: the CLI gets the handler a
# terminal's Ctrl-C finds, whatever started the suite.
_CLI_AS_FROM_A_TERMINAL = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'gguf-trainer'; runpy.run_module('gguf_trainer.cli', run_name='__main__')"
)


def _cli(root, *args, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _CLI_AS_FROM_A_TERMINAL, *args, "--project", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


def test_cli_download_ctrl_c_keeps_a_partial_that_resumes(project, hub_server):
    root, files = project
    dest = _vidprom_dest(root)
    hub_server.pause(BIG, PAUSE_AT)
    proc = _cli(root, "download")
    _wait(lambda: _partial_size(dest) >= CHUNK, what="the first chunk on disk")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "student_tokenizer: ready" in out and "teacher: ready" in out
    hub_server.release(BIG)
    proc = _cli(root, "download")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out  # the student GGUF is a local file nobody set yet
    assert f"{VIDPROM.id}: ready at" in out and "student: missing" in out
    assert (dest / BIG).read_bytes() == files[BIG]
    assert int(hub_server.get_requests("/" + BIG)[-1]["range"][len("bytes=") : -1]) >= CHUNK
    proc = _cli(root, "materials", "--json")
    rows = {r["id"]: r for r in json.loads(proc.communicate(timeout=300)[0])}
    assert {rows[i]["state"] for i in ("teacher", "student_tokenizer", VIDPROM.id)} == {"ready"}
