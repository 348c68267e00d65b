"""The Wan pack's teacher material from a Hub repo in the layout of Wan-AI/Wan2.2-TI2V-5B-Diffusers
(a local Hub server; the tiny real UMT5 stands in for the weights): `download` fetches only
`text_encoder/*` and `tokenizer/spiece.model`, and the downloaded folder passes the pack's
header-only check (the diffusers layout: encoder in text_encoder/, tokenizer in tokenizer/)."""

from __future__ import annotations

import pytest

from gguf_trainer.packs import get_pack
from gguf_trainer.runner import downloads, material_status
from gguf_trainer.store.project import create_project, load_project
from gguf_trainer.tiny.umt5 import build_tiny_umt5

WAN_REPO = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"


@pytest.fixture(scope="module")
def wan_files(tmp_path_factory):
    root = build_tiny_umt5(tmp_path_factory.mktemp("umt5") / "snap")
    files = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
             if p.is_file() and p.parent != root}  # text_encoder/*, tokenizer/* (not the marker)
    # the rest of the pipeline repo, which the pack must not fetch
    unwanted = {"model_index.json": b"{}", "transformer/config.json": b"{}",
                "vae/config.json": b"{}", "tokenizer/tokenizer.json": b"{}"}
    return files, unwanted


def test_download_fetches_the_encoder_and_spiece_only_and_checks_them(hub_server, tmp_path,
                                                                       monkeypatch, wan_files):
    files, unwanted = wan_files
    material_status._listing_cache.clear()
    hub_server.add_repo(WAN_REPO, {**files, **unwanted})
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GGUF_TRAINER_MATERIALS", raising=False)
    root = tmp_path / "projects" / "wan"
    create_project(root, "umt5xxl_wan")
    lines = []
    assert downloads.download_foreground(root, ["teacher"], on_line=lines.append) == 0, lines
    dest = load_project(root).material_path("teacher")
    got = {
        str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file() and ".cache" not in p.parts
    }
    assert got == set(files), got  # nothing of the pipeline beyond the text encoder
    summary = get_pack("umt5xxl_wan").check_teacher({"teacher": dest})
    assert "tokenizer 256384 pieces" in summary and any(summary in line for line in lines)
    row = next(r for r in downloads.material_statuses(root, False) if r["id"] == "teacher")
    assert row["state"] == "ready", (row["error"], row["note"], row["missing_files"])
