"""A material reads "ready" only when its files hold the bytes the saved Hub listing names.

Same size is not the same file: a downloaded file replaced later by other bytes of the same
size (edited, swapped, rotted) is not ready. The hashes verified at download time are
recorded with each file's size and mtime, so status never re-reads a file the download
checked; a file whose mtime changed is hashed again once, and the new record is kept.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from material_repos import TOK_REPO, tokenizer_files

from gguf_trainer.materials import folder_check
from gguf_trainer.runner import downloads, material_status
from gguf_trainer.store.project import create_project

MID = "student_tokenizer"


@pytest.fixture
def root(hub_server, tmp_path, monkeypatch) -> Path:
    material_status._listing_cache.clear()
    hub_server.add_repo(TOK_REPO, tokenizer_files())
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GGUF_TRAINER_MATERIALS", raising=False)
    monkeypatch.setattr("gguf_trainer.base.paths.PROJECTS_ROOT", tmp_path / "projects")
    root = tmp_path / "projects" / "p"
    create_project(root, "t5xxl_pixart")
    assert downloads.download_foreground(root, [MID], on_line=lambda _line: None) == 0
    return root


def _row(root, online=False) -> dict:
    return next(r for r in downloads.material_statuses(root, online) if r["id"] == MID)


@pytest.fixture
def hashes(monkeypatch) -> list[str]:
    """The files status reads to hash them."""
    read: list[str] = []
    real = folder_check.file_hash

    def counting(path, kind):
        read.append(Path(path).name)
        return real(path, kind)

    monkeypatch.setattr(folder_check, "file_hash", counting)
    folder_check._memo.clear()
    return read


@pytest.mark.parametrize("online", [False, True])
def test_other_bytes_of_the_same_size_are_not_ready(root, online):
    row = _row(root, online)
    assert row["state"] == "ready", row
    merges = Path(row["path"]) / "merges.txt"
    assert merges.read_bytes() == b"{}"
    merges.write_bytes(b"[]")  # same size, other bytes
    row = _row(root, online)
    assert row["state"] != "ready"
    assert any(m.startswith("merges.txt (not the listed bytes") for m in row["missing_files"])
    assert downloads.download_foreground(root, [MID], on_line=lambda _line: None) == 0
    assert merges.read_bytes() == b"{}" and _row(root, online)["state"] == "ready"


def test_status_compares_the_hashes_recorded_at_download_not_the_bytes(root, hashes):
    for _ in range(3):
        assert _row(root)["state"] == "ready"
    assert hashes == []  # every file was verified by the download, with its size and mtime


def test_a_touched_file_is_hashed_once_then_its_record_stands(root, hashes):
    folder = Path(_row(root)["path"])
    vocab = folder / "vocab.json"
    st = vocab.stat()
    os.utime(vocab, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same bytes, new mtime
    assert _row(root)["state"] == "ready" and hashes == ["vocab.json"]
    folder_check._memo.clear()  # a new process: the record on disk is what stands
    assert _row(root)["state"] == "ready" and hashes == ["vocab.json"]
    records = json.loads((folder / folder_check.MANIFEST_DIR / folder_check.HASHES_JSON)
                         .read_text())
    assert records["vocab.json"]["mtime_ns"] == vocab.stat().st_mtime_ns


def test_a_rewritten_file_is_read_whatever_its_record_says(root, hashes):
    """A record only stands for the file with its size and mtime: rewriting the file (new
    mtime) makes status read it again."""
    folder = Path(_row(root)["path"])
    (folder / "config.json").write_bytes(b"[]")
    assert _row(root)["state"] != "ready" and hashes == ["config.json"]
