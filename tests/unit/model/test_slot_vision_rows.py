"""A slot kind's references in training's compact form (model/slot_resampler.seeded_slots
`vis_at`: each sample's vision rows first in `vis`, True at the slots they sit on) are the
engine's form (vis + vis_slot, zeros off the image slots, conditioner.hpp 4401-4418): in a
padded batch of a two-reference sample, a one-reference sample and a text-only one, each
sample's rows equal its own unpadded run in the engine's form, and the training forward of the
supervised rows equals the full forward's."""

from __future__ import annotations

import torch

from gguf_trainer.model.adapters import AdapterConfig, build_adapter

IN, VIS, OUT = 24, 20, 12


def _model():
    torch.manual_seed(0)
    cfg = AdapterConfig("qwen35_bridge", IN, OUT, 64, 2, num_queries=80, seed_vocab=300,
                        seed_rank=8, vis_dim=VIS)
    m = build_adapter(cfg)
    with torch.no_grad():  # queries and vis_q off their small init, so the rows differ
        m.slot_query.normal_()
        m.vis_q.weight.normal_(std=0.3)
    return m.eval()


# (student length, slot count, [(first slot, rows)] per reference)
SAMPLES = [(7, 40, [(4, 9), (15, 6)]), (5, 30, [(4, 12)]), (9, 22, [])]


def test_compact_references_are_the_engines_layout_sample_by_sample():
    m = _model()
    g = torch.Generator().manual_seed(1)
    b, lmax, smax = len(SAMPLES), max(s[0] for s in SAMPLES), max(s[1] for s in SAMPLES)
    vmax = max(sum(n for _, n in s[2]) for s in SAMPLES)
    hidden = torch.zeros(b, lmax, IN)
    mask = torch.zeros(b, lmax, dtype=torch.bool)
    seed = torch.full((b, 80), -1, dtype=torch.long)
    vis = torch.zeros(b, vmax, VIS)
    vis_at = torch.zeros(b, smax, dtype=torch.bool)
    alone = []
    for k, (n_in, n_slots, refs) in enumerate(SAMPLES):
        h = torch.randn(1, n_in, IN, generator=g)
        ids = torch.randint(0, 300, (1, n_slots), generator=g)
        rows = [torch.randn(n, VIS, generator=g) for _, n in refs]
        hidden[k, :n_in], mask[k, :n_in], seed[k, :n_slots] = h[0], True, ids[0]
        kw = {}
        if refs:
            flat = torch.cat(rows)
            vis[k, : flat.shape[0]] = flat
            vis_slot = torch.zeros(1, n_slots, VIS)
            for (a, n), r in zip(refs, rows):
                vis_at[k, a : a + n] = True
                vis_slot[0, a : a + n] = r
            kw = {"vis": flat[None], "vis_slot": vis_slot}
        with torch.no_grad():
            alone.append(m(h, seed_ids=ids, **kw)[0])
    with torch.no_grad():
        batch = m(hidden, mask=mask, seed_ids=seed, vis=vis, vis_at=vis_at)
        rows_mask = seed[:, :smax] >= 0
        supervised = m(hidden, mask=mask, seed_ids=seed, vis=vis, vis_at=vis_at, rows=rows_mask)
    for k, want in enumerate(alone):
        got = batch[k, : want.shape[0]]
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (k, (got - want).abs().max())
    torch.testing.assert_close(supervised, batch[rows_mask])
    with torch.no_grad():  # the pictures reach the rows (so the comparison above saw them)
        blind = m(hidden, mask=mask, seed_ids=seed)
    assert (blind[0, :40] - batch[0, :40]).abs().max() > 1e-2
