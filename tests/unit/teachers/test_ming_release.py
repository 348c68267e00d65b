"""teachers/ming_release.py: the released Ming-Image-0.1-Design layout (mllm/ shards + index,
connector/, mlp/, three config.json; tiny/ming.py write_released_snapshot) read into the torch
port under the engine's names. The engine's own run on it: tests/engine/test_ming_teacher_engine.py.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

from gguf_trainer.base.errors import UserError


@pytest.fixture(scope="module")
def tiny():
    from gguf_trainer.tiny.ming import build_tiny_ming

    return build_tiny_ming()


@pytest.fixture(scope="module")
def released(tiny, tmp_path_factory):
    from gguf_trainer.tiny.ming import write_released_snapshot

    return write_released_snapshot(tmp_path_factory.mktemp("ming") / "Ming-Image-0.1-Design", tiny)


IDS = [[156893, 300, 301, 302, 156894], [156893, 5, 156894]]


def test_the_release_loads_to_the_same_weights_and_config(tiny, released):
    from gguf_trainer.teachers.ming_snapshot import embed_table, load_ming_teacher

    teacher = load_ming_teacher(released, "cpu", 1280)
    assert teacher.model.cfg == tiny.cfg
    want, got = tiny.state_dict(), teacher.model.state_dict()
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert torch.equal(embed_table(released), want["thinker.embed_tokens.weight"])
    a, b = tiny(IDS), teacher.model(IDS)
    assert torch.equal(a.caption, b.caption)
    assert all(torch.equal(x, y) for x, y in zip(a.direct, b.direct, strict=True))


def test_a_bf16_release_loads_and_runs_in_bf16(tiny, tmp_path):
    from gguf_trainer.teachers.ming_snapshot import load_ming_teacher
    from gguf_trainer.tiny.ming import write_released_snapshot

    root = write_released_snapshot(tmp_path / "bf16", tiny, dtype=torch.bfloat16)
    teacher = load_ming_teacher(root, "cpu", 1280)
    want, got = tiny.state_dict(), teacher.model.state_dict()
    assert all(got[k].dtype == torch.bfloat16 for k in got)
    assert all(torch.equal(got[k], want[k].to(torch.bfloat16)) for k in want)
    out = teacher.model(IDS)
    # Not compared with fp32: the tiny random MoE is chaotic under rounding (measured: its
    # weights merely rounded to bf16, fp32 compute, flip 1-11 of 263 routings per layer and
    # leave the caption rows at cos 0.65), so closeness here would test the stand-in, not this.
    assert out.caption.dtype == torch.bfloat16 and torch.isfinite(out.caption).all()
    assert all(torch.isfinite(d).all() and d.shape == (len(i), tiny.cfg.diffusion_dim)
               for d, i in zip(out.direct, IDS, strict=True))


def test_connector_norm_l2_normalises_the_caption_rows(tiny, tmp_path, caplog):
    from gguf_trainer.teachers.ming_snapshot import load_ming_teacher
    from gguf_trainer.tiny.ming import write_released_snapshot

    root = write_released_snapshot(tmp_path / "norm", tiny, connector_norm=True)
    with caplog.at_level(logging.WARNING):
        teacher = load_ming_teacher(root, "cpu", 1280)
    assert "connector_norm" in caplog.text
    cap = teacher.model(IDS).caption
    assert torch.allclose(cap.norm(dim=-1), torch.ones(cap.shape[:2]), atol=1e-5)
    assert not torch.allclose(tiny(IDS).caption.norm(dim=-1), torch.ones(cap.shape[:2]))


def _edit(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("change, words", [
    ({"img_gen_scales": [4, 8, 16]}, "one query scale"),
    ({"selected_hidden_states_layers": [5, 12]}, "final norm"),
    ({"use_vlm_directvlm_condition": False}, "both the caption and the directvlm"),
])
def test_a_release_the_engine_cannot_run_is_one_sentence(released, tmp_path, change, words):
    import shutil

    from gguf_trainer.teachers.ming_snapshot import read_config

    root = tmp_path / "copy"
    shutil.copytree(released / "mlp", root / "mlp")
    for comp in ("mllm", "connector"):
        (root / comp).mkdir()
        shutil.copy(released / comp / "config.json", root / comp / "config.json")
    _edit(root / "mlp" / "config.json", **change)
    with pytest.raises(UserError) as err:
        read_config(root)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_missing_expert_shard_entry_is_one_sentence(released, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from gguf_trainer.teachers.ming_snapshot import load_ming_teacher

    root = tmp_path / "broken"
    shutil.copytree(released, root)
    index = json.loads((root / "mllm" / "model.safetensors.index.json").read_text())
    name = "model.model.layers.3.mlp.experts.7.up_proj.weight"
    shard = root / "mllm" / index["weight_map"].pop(name)
    state = load_file(str(shard))
    del state[name]
    save_file(state, str(shard))
    (root / "mllm" / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UserError, match=f"lacks {name}; "):
        load_ming_teacher(root, "cpu", 1280)
