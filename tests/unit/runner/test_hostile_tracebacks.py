"""The tracebacks of issue 29 item 6: each input is handled or refused in one sentence."""

from __future__ import annotations

import json
import struct
import zlib

import pytest

from gguf_trainer import cli
from gguf_trainer.base import atomic
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.materials import discovery
from gguf_trainer.runner import control
from gguf_trainer.stages import corpus_build
from gguf_trainer.stages.export import record_snapshot
from gguf_trainer.store.project import load_project

PACK = "t5xxl_pixart"


def test_a_symlink_loop_in_the_materials_root_is_skipped(tmp_path, monkeypatch, capsys):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    monkeypatch.setenv("GGUF_TRAINER_MATERIALS", str(tmp_path / "a"))
    root = tmp_path / "proj"
    control.new_project(root, PACK)
    assert tmp_path / "a" not in discovery.candidate_roots(root, tmp_path / "none")
    assert cli.main(["materials", "--project", str(root), "--link-found"]) == 0
    assert "internal error" not in capsys.readouterr().err


def test_a_300_character_project_name_is_a_sentence(tmp_path):
    with pytest.raises(UserError, match=r"characters\) cannot be opened as a project"):
        control.status(tmp_path / ("x" * 300))


def _png_header(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk
            + struct.pack(">I", zlib.crc32(chunk)))


def test_a_png_declaring_30000_squared_pixels_is_a_bad_image(tmp_path):
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(_png_header(30000, 30000))
    assert corpus_build._image_ok(bomb) is False


@pytest.mark.parametrize("snaps", [[1, "x", None, {"step": "7", "time": 1, "path": "a"}],
                                   {"not": "a list"}, "text", [[]]])
def test_snapshots_json_with_items_of_the_wrong_type_is_rebuilt(tmp_path, snaps):
    root = tmp_path / "proj"
    control.new_project(root, PACK)
    paths = ProjectPaths(root)
    atomic.write_json(paths.snapshots_json, {"snapshots": snaps})
    entry = {"step": 3, "time": 1.0, "path": str(tmp_path / "x-step3-f16.gguf")}
    record_snapshot(load_project(root), entry)
    kept = json.loads(paths.snapshots_json.read_text())["snapshots"]
    assert [e["step"] for e in kept] == [3]
    assert [e["step"] for e in control.list_snapshots(root) if isinstance(e, dict)] == [3]


@pytest.mark.parametrize("seed", [2**64, 2**63, int(1e300), 1e300, -1, True, "7"])
def test_a_render_seed_outside_ggks_64_bits_is_refused_before_a_job(tmp_path, seed):
    from gguf_trainer.runner import render_job

    root = tmp_path / "proj"
    control.new_project(root, PACK)
    with pytest.raises(UserError, match="the seed must be a whole number from 0 to"):
        render_job.start_render(root, "a fox", seed)
    assert not list(root.glob("render-job*"))


@pytest.mark.parametrize("token", ["hf_ab\x1b[31mcd", "hf_ab\x00cd", "hf_ab\u200bcd", "hf_é"])
def test_login_refuses_tokens_with_control_or_invisible_characters(tmp_path, monkeypatch, token):
    from gguf_trainer.materials import hub

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(UserError, match="letters, digits"):
        hub.store_token(token)
