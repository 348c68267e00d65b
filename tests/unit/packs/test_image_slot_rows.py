"""Image-slot rows the DiT never reads (pack.dit_reads_vision_rows False: Qwen Image 2.1, whose
DiT puts img_in(reference latent) at the slots, conditioner.hpp 3782-3797, qwen_image_2_1.hpp
74-122 and 279-288) stay in the adapter's input but leave the loss, every figure and the target
moments; MageFlow's DiT reads them, so they stay supervised there.

precompute_shard.build_shard runs for real on a stand-in teacher and student (fixed rows), the shard
is written and read back, and the batch goes through the training loss and the eval scoring."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gguf_trainer.data.scoring import score_batches
from gguf_trainer.data.shards import Shard, Stats, collate, linear_fit, load_stats, write_shard
from gguf_trainer.model.ridge import RidgeAccumulator
from gguf_trainer.packs import get_pack
from gguf_trainer.stages import precompute_shard
from gguf_trainer.stages.train import compute_loss
from gguf_trainer.teachers.base import TargetRows, VisionSegment

DIM = 8  # student, target and vision widths
# (sample length, [(first pad, pads)] per image): an edit with two images, a text prompt
SAMPLES = ((20, [(5, 4), (12, 3)]), (9, []))


class _Teacher:
    def targets(self, records, ids, vis):
        g = torch.Generator().manual_seed(len(ids[0]))
        return [TargetRows(torch.randn(len(i), DIM, generator=g), sup_start=2) for i in ids]


class _Student:
    def hidden(self, ids, keep, splices=(), position_ids=None):
        return torch.randn(*ids.shape, DIM)


def _shard(tmp_path, pack_id: str) -> Shard:
    big = 1 << 20
    ctx = SimpleNamespace(
        pack=get_pack(pack_id), vision_proj=torch.randn(DIM, DIM), teacher=_Teacher(),
        student=_Student(), device=torch.device("cpu"),
        budgets=SimpleNamespace(teacher_batch=8, tok_budget=big, student_batch=8,
                                student_tok_budget=big))
    g = torch.Generator().manual_seed(0)
    samples = [precompute_shard._Sample(k, None, list(range(n)),
                                  [VisionSegment(a, torch.randn(m, DIM, generator=g))
                                   for a, m in segs])
               for k, (n, segs) in enumerate(SAMPLES)]
    tensors = precompute_shard.build_shard(
        ctx, samples, SimpleNamespace(stop_requested=lambda: False), lambda f: None,
        lengths=[n for n, _ in SAMPLES])
    path = tmp_path / f"{pack_id}.safetensors"
    write_shard(path, tensors, {"fingerprint": "fp"})
    return Shard(path)


SLOTS = [(0, p) for a, m in SAMPLES[0][1] for p in range(a, a + m)]  # (sample, row) at pads


@pytest.mark.parametrize("pack_id, reads", [("qwen3vl_qwen_image_2_1", False),
                                            ("qwen3vl_mageflow", True)])
def test_the_loss_and_the_figures_read_the_image_slots_only_where_the_dit_does(
        tmp_path, pack_id, reads):
    assert get_pack(pack_id).dit_reads_vision_rows is reads
    shard = _shard(tmp_path, pack_id)
    batch = collate(shard, [0, 1], 0)
    slots = torch.zeros_like(batch.mask)
    for b, r in SLOTS:
        slots[b, r] = True
    assert torch.equal(batch.vis_mask, slots)  # the rows still reach the adapter's input
    # the vision_start / vision_end rows around each run are text rows: always supervised
    assert torch.equal(batch.row_mask, batch.mask & ~slots if not reads else batch.mask)

    stats = load_stats([shard.path], 1e-3)
    text = shard.t["target_rows"].double()[~torch.cat([slots[0, :20], slots[1, :9]])]
    assert stats.n == (len(text) if not reads else 29)
    if not reads:  # the moments (μ, σ: whitening and the mean baseline) are the kept rows'
        assert torch.allclose(stats.mu.double(), text.mean(0), atol=1e-6)

    # the loss: a change of the targets at the slots moves it exactly where the DiT reads them
    pred = torch.randn(batch.target.shape)
    loss, _ = compute_loss(pred, batch, stats, False, 0.5)
    batch.target[slots] += 3.0
    moved, _ = compute_loss(pred, batch, stats, False, 0.5)
    assert (float(moved) != float(loss)) is reads

    # the eval figures: no vision figure where the DiT does not read those rows
    res = score_batches([collate(shard, [0, 1], 0)], lambda b: pred, stats, False, "cpu")
    assert res["rows"] == int(batch.row_mask.sum())
    assert ("cos_vis" in res) is reads and res["cos_slice"] is not None

    # the linear start fits the kept rows only
    keep = shard.target_keep(0).tolist() + shard.target_keep(1).tolist()
    acc = RidgeAccumulator(DIM, DIM)
    acc.add(shard.t["student_rows"].float()[keep], shard.t["target_rows"].float()[keep])
    for got, want in zip(linear_fit([shard.path]), acc.solve(bias=True)):
        assert torch.equal(got, want)


def test_a_shard_without_target_keep_supervises_every_real_row(tmp_path):
    """Shards of every other pack (and the text-only case) keep their old meaning."""
    shard = _shard(tmp_path, "qwen3vl_mageflow")
    assert "target_keep" not in shard.t
    assert bool(shard.target_keep(0).all()) and shard.target_keep(0).shape == (20,)
    assert isinstance(load_stats([shard.path], 1e-3), Stats)
