"""teachers/ming_vision_export.py and teachers/ming_vision.py on a tiny released-layout snapshot:
the companion's names (the release's vision.* / linear_proj.*, what ggk reads under
text_encoders.llm.), types, the 4-D patch kernel, the rebuild rule, and the tower loaded strictly
from the shards. The engine's own run on the file: tests/engine/test_ming_vision_engine.py."""

from __future__ import annotations

import os

import pytest
import torch

from gguf_trainer.base.errors import UserError


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    from gguf_trainer.tiny.ming import write_released_snapshot

    return write_released_snapshot(tmp_path_factory.mktemp("mv") / "Ming-Image-0.1-Design")


def test_the_companion_holds_the_tower_under_the_releases_names(snapshot, tmp_path):
    import gguf

    from gguf_trainer.teachers.ming_vision_export import vision_file_for, write_ming_vision_gguf
    from gguf_trainer.tiny.ming import build_tiny_ming_vision

    dest = vision_file_for(tmp_path / "pig_ming_adapter-f16.gguf")
    assert dest.name == "pig_ming_vision-f16.gguf"
    info = write_ming_vision_gguf(snapshot, dest)
    want = build_tiny_ming_vision().state_dict()
    reader = gguf.GGUFReader(dest)
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == set(want) and info["n_tensors"] == len(want)
    for name, t in tensors.items():
        f16 = t.tensor_type == gguf.GGMLQuantizationType.F16
        assert f16 == (want[name].ndim >= 2), name
    patch = tensors["vision.patch_embed.proj.weight"]  # [128, 3, 2, 14, 14] as ne [14,14,2,384]
    assert [int(x) for x in patch.shape] == [14, 14, 2, 3 * 128]
    flat = torch.from_numpy(patch.data.copy()).float().reshape(-1)
    assert torch.equal(flat, want["vision.patch_embed.proj.weight"].half().float().reshape(-1))
    assert info["rebuilt"] and not write_ming_vision_gguf(snapshot, dest)["rebuilt"]
    later = dest.stat().st_mtime + 5
    for shard in (snapshot / "mllm").glob("*.safetensors"):
        os.utime(shard, (later, later))
    assert write_ming_vision_gguf(snapshot, dest)["rebuilt"]


def test_the_tower_loads_strictly_and_gives_unit_rows(snapshot):
    from gguf_trainer.teachers.ming_vision import load_ming_vision
    from gguf_trainer.tiny.ming import build_tiny_ming_vision

    tower = load_ming_vision(snapshot)
    image = torch.randn(3, 56, 84, generator=torch.Generator().manual_seed(1))
    rows = tower.encode(image)
    assert rows.shape == (2 * 3, 64)
    assert torch.allclose(rows.norm(dim=-1), torch.ones(6), atol=1e-5)
    assert torch.equal(rows, build_tiny_ming_vision().encode(image))


def test_a_tower_the_engine_runs_otherwise_is_one_sentence():
    from gguf_trainer.teachers.ming_vision import vision_config
    from gguf_trainer.tiny.ming import TINY_VISION

    with pytest.raises(UserError, match="num_heads 12; ggk 0.9.7 runs the Ming tower with 16"):
        vision_config({**TINY_VISION, "num_heads": 12})
    with pytest.raises(UserError, match="attends fully at blocks"):
        vision_config({**TINY_VISION, "fullatt_block_indexes": [3]})


def test_a_snapshot_without_a_tower_has_no_companion(tmp_path):
    from gguf_trainer.teachers.ming_vision_export import write_ming_vision_gguf
    from gguf_trainer.tiny.ming import build_tiny_ming, released_files

    files = released_files(build_tiny_ming())  # no tower
    (tmp_path / "mllm").mkdir()
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in files["mllm"].items()},
              str(tmp_path / "mllm" / "model.safetensors"))
    with pytest.raises(UserError, match="holds no vision tower"):
        write_ming_vision_gguf(tmp_path, tmp_path / "v.gguf")


def _project(teacher, mock=False):
    from types import SimpleNamespace

    settings = SimpleNamespace(precompute=SimpleNamespace(mock_teacher=mock))
    return SimpleNamespace(settings=settings, material_path=lambda mid: teacher)


def test_the_pack_writes_the_companion_beside_the_adapter(snapshot, tmp_path, caplog):
    import logging

    from gguf_trainer.packs import get_pack
    from gguf_trainer.tiny.ming import copy_tiny_ming

    pack = get_pack("ming_image")
    adapter = tmp_path / "pig_ming_adapter-f16.gguf"
    asked = []
    (written,) = pack.write_companions(_project(snapshot), adapter, may_write=asked.append)
    assert written == tmp_path / "pig_ming_vision-f16.gguf" and written.is_file()
    assert asked == [written]
    with caplog.at_level(logging.INFO):
        assert pack.write_companions(_project(copy_tiny_ming(tmp_path / "demo")), adapter) == []
        assert pack.write_companions(_project(snapshot, mock=True), adapter) == []
    assert "no pig_ming_vision companion" in caplog.text
