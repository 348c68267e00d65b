"""data/bank_rows.py: the bank's shard tensors and batch (the rows the DiT gets, pads weighing
one row together, the student rows under the body through bank_in), its statistics, its loss at
the mean start, and model/export.fold_bank."""

from __future__ import annotations

import torch

from gguf_trainer.data.bank_rows import collate_bank, shard_tensors, start_bank
from gguf_trainer.model.export import fold_bank
from gguf_trainer.teachers.qwen35_bank import BankRows


class _Shard:
    def __init__(self, t, students):
        self.t, self._students = t, students

    def student(self, i):
        return self._students[i]


def test_batch_reads_the_rows_the_dit_gets():
    dim, in_dim = 6, 4
    banks = [BankRows(torch.randn(11, dim), 10, 2), BankRows(torch.randn(80, dim), 80, 72)]
    t = shard_tensors(banks, 80)
    assert t["bank_len"].tolist() == [11, 80] and int(t["bank_moment_n"][0]) == 91
    t["student_rows"] = torch.zeros(1, in_dim)
    students = [torch.randn(2, in_dim), torch.randn(75, in_dim)]
    b = collate_bank(_Shard(t, students), [0, 1])
    w = b.weight
    assert torch.equal(w[0, :10], torch.ones(10))
    assert torch.allclose(w[0, 10:].sum(), torch.ones(()))  # the pads weigh one row
    assert torch.allclose(b.target[0, 79], banks[0].rows[10].bfloat16().float())  # the pad row
    assert torch.equal(w[1], torch.ones(80))  # 80 real rows: no pad
    assert torch.equal(b.hidden[0, 3:5], students[0]) and b.hidden[0, 5:].abs().sum() == 0
    assert torch.equal(b.hidden[1, 3:75], students[1][:72]) and b.hidden[1, :3].abs().sum() == 0


def test_fold_bank_gives_the_teachers_scale():
    lin = torch.nn.Linear(3, 5)
    mu, sig = torch.randn(5), torch.rand(5) + 0.5
    state = fold_bank({"out_bank.weight": lin.weight.data, "out_bank.bias": lin.bias.data,
                       "out_proj.weight": torch.ones(2, 3)}, mu, sig)
    x = torch.randn(7, 3)
    got = x @ state["out_bank.weight"].T + state["out_bank.bias"]
    assert torch.allclose(got, lin(x).detach() * sig + mu, atol=1e-5)
    assert torch.equal(state["out_proj.weight"], torch.ones(2, 3))


def test_start_bank_predicts_the_mean():
    from gguf_trainer.model.adapters import AdapterConfig, build_adapter

    cfg = AdapterConfig(kind="qwen35_bridge", in_dim=8, out_dim=6, width=64, depth=1,
                        num_queries=12, seed_vocab=20, seed_rank=4, vis_dim=4, n_bank=80,
                        bank_dim=10, bank_align=True)
    m = build_adapter(cfg)
    start_bank(m)
    out = m(torch.randn(1, 3, 8), seed_ids=torch.tensor([[1, 2, 3]]), want_bank=True,
            bank_hidden=torch.randn(1, 80, 8))
    assert out.shape == (1, 80, 10) and out.abs().max() == 0


def test_only_the_bridge_has_a_flux3_bank():
    """Ming keeps its 256 caption queries in n_bank: no bank statistics are asked of its shards
    (asking them stopped every ming_image run with "the shards hold no FLUX.3 bank targets")."""
    from types import SimpleNamespace

    from gguf_trainer.data.bank_rows import bank_stats_for

    ming = SimpleNamespace(kind="ming_image", n_bank=256)
    assert bank_stats_for(ming, [], 0.03) is None
    bridge = SimpleNamespace(kind="qwen35_bridge", n_bank=0)
    assert bank_stats_for(bridge, [], 0.03) is None
