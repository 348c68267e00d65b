"""The qwen35_bridge pack's declarations: the student reads the raw prompt as one piece (no weight
syntax, empty -> the Qwen pad), the slots are the engine's Qwen3.5 ids of the MOSS template, the
mock teacher's rows and seed ids have the real shapes, the adapter config is the engine's
bridge, and the seed table is a PCA of the teacher's table at train.seed_rank."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.template_ids import Piece
from gguf_trainer.packs import get_pack

PACK = get_pack("qwen35_bridge")


def test_student_reads_the_raw_prompt():
    assert PACK.student_pieces(Sample("(a cat:1.2)")) == (Piece("(a cat:1.2)"),)
    assert PACK.student_ids(lambda t: [ord(c) for c in t], Sample("")) == [151643]


def test_mock_teacher_rows_and_slots():
    teacher = PACK.build_mock_teacher(None)
    samples = [Sample("a sheep in sunglasses"), Sample("")]
    rows = teacher.targets(samples, [[1], [1]])
    for s, r in zip(samples, rows):
        ids = PACK.slot_ids_for_text(s.text)
        assert ids[:3] == [248045, 846, 198] and ids[-2:] == [248068, 198]
        assert r.rows.shape == (len(ids), 4096) and torch.isfinite(r.rows).all()
        assert r.seed_ids == ids + [-1] * (PACK.num_queries - len(ids))
    assert teacher.lengths(samples, [[1], [1]]) == [len(r.rows) for r in rows]


def test_adapter_config_is_the_engines_bridge():
    train = SimpleNamespace(width=128, depth=2, seed_rank=32)
    cfg = PACK.adapter_config(train, in_dim=64, out_dim=64)
    assert cfg.kind == "qwen35_bridge" and cfg.validate() == []
    assert (cfg.num_queries, cfg.seed_vocab, cfg.seed_rank, cfg.vis_dim) == (1536, 248320, 32, 4096)
    unset = SimpleNamespace(width=128, depth=2, seed_rank=0)
    assert PACK.adapter_config(unset, 64).seed_rank == 384


def test_bank_slots_configure_the_flux3_bank():
    import pytest

    from gguf_trainer.base.errors import UserError

    assert PACK.configured(SimpleNamespace(train=SimpleNamespace(bank_slots=0))) is PACK
    pack = PACK.configured(SimpleNamespace(train=SimpleNamespace(bank_slots=240)))
    assert pack.n_bank == 240 and pack.shard_contract == "qwen35_bridge/1+bank240"
    assert [m.id for m in pack.teacher_materials] == ["teacher", "bank_teacher"]
    assert pack.teacher_materials[1].repo == "Qwen/Qwen3-VL-4B-Instruct"
    cfg = pack.adapter_config(SimpleNamespace(width=128, depth=2, seed_rank=32), 64, 64)
    assert (cfg.n_bank, cfg.bank_dim, cfg.bank_align) == (240, 20480, True) and not cfg.validate()
    assert pack.bytes_per_sample > PACK.bytes_per_sample and PACK.n_bank == 0
    with pytest.raises(UserError, match="multiple of 80"):
        PACK.configured(SimpleNamespace(train=SimpleNamespace(bank_slots=100)))


def test_seed_table_is_a_pca_of_the_mock_teachers_table():
    mock = SimpleNamespace(precompute=SimpleNamespace(mock_teacher=True))
    project = SimpleNamespace(settings=mock)
    table = PACK.seed_table(project, 8)
    assert table.shape == (248320, 8) and abs(float(table.pow(2).mean().sqrt()) - 1) < 1e-5
    tok = PACK.export_tokenizer(project)
    assert tok["pre"] == "qwen35" and len(tok["tokens"]) == 248320 and tok["tokens"][248046] == (
        "<|im_end|>"
    )


def test_check_judges_a_bridge_file_by_its_pack():
    """check compares a bridge's dump (tests/unit/check/test_check_slots.py): a file naming no
    pack is the kind's shipped pack's."""
    from gguf_trainer.check import _pack_for

    module = SimpleNamespace(config=SimpleNamespace(kind="qwen35_bridge"))
    assert _pack_for(module) == "qwen35_bridge"
