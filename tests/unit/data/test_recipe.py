"""The training recipe (data/recipe.py): row classes and weights, statistics by row class, the
weighted loss, and that a project written before the recipe keys keeps its recipe exactly."""

from __future__ import annotations

import json

import pytest
import torch

from gguf_trainer.data.recipe import (
    PAD,
    PREFIX,
    TOKEN,
    Recipe,
    RowFit,
    floored,
    legacy_recipe,
    recipe_inputs,
    row_classes,
    row_weights,
)
from gguf_trainer.data.shards import Batch, Stats
from gguf_trainer.packs import get_pack
from gguf_trainer.stages.train import compute_loss

LAYERWISE = "qwen3vl_flux3"  # a padded layerwise family (pads to a multiple of 80)


def batch(n_rows=(6, 4), sup_start=(2, 1), n_real=(4, 4), dim=8, seed=0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    b, r = len(n_rows), max(n_rows)
    mask = torch.zeros(b, r, dtype=torch.bool)
    for i, n in enumerate(n_rows):
        mask[i, :n] = True
    target = torch.randn(b, r, dim, generator=g) * mask[..., None]
    return Batch(torch.zeros(b, r, 4), mask.clone(), target, mask.clone(), None,
                 torch.tensor(sup_start), [(0, i) for i in range(b)], n_real=torch.tensor(n_real))


def test_rows_fall_in_prefix_token_and_pad_classes():
    c = row_classes(batch())
    assert c[0].tolist() == [PREFIX, PREFIX, TOKEN, TOKEN, PAD, PAD]
    assert c[1, :4].tolist() == [PREFIX, TOKEN, TOKEN, TOKEN]


def test_prefix_out_weighs_nothing_and_a_samples_pads_weigh_one_row():
    w = row_weights(batch(), Recipe(prefix_rows="out", pad_weight="one"))
    assert w[0].tolist() == [0, 0, 1, 1, 0.5, 0.5]  # two pads share one row's weight
    assert w[1].tolist() == [0, 1, 1, 1, 0, 0]  # the padding of the batch is no row
    w = row_weights(batch(), Recipe())
    assert w[0].tolist() == [1] * 6


def test_the_legacy_recipe_takes_the_old_path_bit_for_bit():
    """fit None is the arithmetic every project trained with; a RowFit of the legacy recipe
    (all weights 1, no scales, whole-row cosine) gives the same loss."""
    b = batch()
    stats = Stats(torch.zeros(8), torch.ones(8), torch.full((8,), 0.5), 10)
    pred = torch.randn(int(b.row_mask.sum()), 8, generator=torch.Generator().manual_seed(1))
    old, _ = compute_loss(pred, b, stats, False, 0.5)
    fit = RowFit.for_batch(b, Recipe(), None, 1)
    new, _ = compute_loss(pred, b, stats, False, 0.5, fit)
    assert torch.allclose(old, new, rtol=1e-6)
    assert not Recipe().needs_classes


def test_a_per_tap_cosine_is_not_owned_by_the_large_tap():
    """Two taps, the second 100x larger: a whole-row cosine sees only the large tap, the
    per-tap mean sees the small tap's error too."""
    t = torch.cat([torch.randn(5, 4), 100 * torch.randn(5, 4)], 1)
    pred = torch.cat([-t[:, :4], t[:, 4:]], 1)  # small tap exactly wrong, large tap right
    b = Batch(torch.zeros(1, 5, 4), torch.ones(1, 5, dtype=torch.bool), t[None],
              torch.ones(1, 5, dtype=torch.bool), None, None, [(0, 0)])
    stats = Stats(torch.zeros(8), torch.ones(8), torch.ones(8), 5)
    _, whole = compute_loss(pred, b, stats, False, 0.5, RowFit.for_batch(b, Recipe(), None, 2))
    _, tap = compute_loss(pred, b, stats, False, 0.5,
                          RowFit.for_batch(b, Recipe(cosine="tap"), None, 2))
    assert whole["cos"] > 0.99 and tap["cos"] < 0.01


def test_a_relative_floor_follows_each_taps_scale():
    sigma = torch.tensor([1.0, 1.0, 0.0, 100.0, 100.0, 0.0])  # two taps, 100x apart
    rel = floored(sigma, Recipe(sigma_floor=0.05, sigma_floor_mode="relative"), 2)
    assert rel.tolist() == pytest.approx([1, 1, 0.05, 100, 100, 5])
    assert floored(sigma, Recipe(sigma_floor=0.03), 2).tolist() == pytest.approx(
        [1, 1, 0.03, 100, 100, 0.03])


def test_an_old_project_keeps_its_recipe_and_its_fingerprint():
    """A project.json without the recipe keys reads the old values (LLaDA's old space is
    standardized), and the legacy recipe adds nothing to the train fingerprint."""
    from gguf_trainer.store.project_schema import TrainSettings

    old = TrainSettings()
    for pack_id, space in (("t5xxl_pixart", "raw"), ("llada_image", "standardized"),
                           (LAYERWISE, "raw")):
        pack = get_pack(pack_id)
        r = Recipe.from_settings(old, pack)
        assert r.target_space == space and r == legacy_recipe(pack, old.sigma_floor)
        assert recipe_inputs(r, pack) == {}
    changed = Recipe.from_settings(TrainSettings(target_space="standardized"), get_pack(LAYERWISE))
    assert recipe_inputs(changed, get_pack(LAYERWISE))["recipe"]["target_space"] == "standardized"


def test_a_new_project_stores_its_packs_measured_recipe(tmp_path):
    from gguf_trainer.store.project import create_project

    create_project(tmp_path / "p", LAYERWISE)
    train = json.loads((tmp_path / "p" / "project.json").read_text())["train"]
    assert {k: train[k] for k in ("target_space", "cosine", "pad_weight", "sink")} == {
        "target_space": "standardized", "cosine": "tap", "pad_weight": "one", "sink": "none"}
    create_project(tmp_path / "q", "t5xxl_pixart")  # published raw run: stays raw, explicitly
    assert json.loads((tmp_path / "q" / "project.json").read_text())["train"][
        "target_space"] == "raw"


def test_class_scales_pick_each_rows_class():
    from gguf_trainer.data.recipe import CONST, ClassScales

    s = ClassScales(torch.tensor([2.0, 3.0]), torch.tensor([5.0, 7.0]), torch.ones(2),
                    torch.tensor([11.0, 13.0]))
    got = s.per_row(torch.tensor([PREFIX, TOKEN, PAD, CONST], dtype=torch.int8))
    assert got.tolist() == [[1, 1], [2, 3], [5, 7], [11, 13]]


def test_the_shared_template_lead_is_its_own_class():
    """Rows every prompt shares (the sink among them) are constants: counted apart from the
    varying token rows, so whitening by the token rows' sigma is not the sink's sigma."""
    from gguf_trainer.data.recipe import CONST, shared_prefix

    assert shared_prefix([[1, 2, 3, 9], [1, 2, 3, 4, 5], [1, 2, 7]]) == 2
    assert shared_prefix([[1, 2]]) == 0
    c = row_classes(batch(sup_start=(0, 0)), n_const=3)
    assert c[0].tolist() == [CONST, CONST, CONST, TOKEN, PAD, PAD]


def test_token_whitening_ignores_the_constant_rows_scale():
    """A sink-like constant row (1000 in dim 0) sets the fold's sigma; sink = token scales
    every row's error by sigma_fold / sigma_token, so the ordinary rows' variation counts."""
    from gguf_trainer.data.recipe import CONST, recipe_stats_of_rows

    g = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(20):
        rows = torch.randn(5, 2, generator=g)
        rows[0] = torch.tensor([1000.0, 0.0])
        cls = torch.tensor([CONST, TOKEN, TOKEN, TOKEN, TOKEN], dtype=torch.int8)
        samples.append((rows, cls, torch.ones(5, dtype=torch.bool)))
    recipe = Recipe(target_space="standardized", sink="token", stats_rows="loss")
    stats, scales = recipe_stats_of_rows(samples, recipe, 1)
    assert stats.sigma_f[0] > 300  # the constant row owns the fold's sigma in dim 0
    assert scales.token[0] > 100 and abs(float(scales.token[1]) - 1) < 0.3
    assert scales.n_const == 1


def test_tempered_whitening_weighs_the_constant_rows_less_than_token_whitening():
    """sink = tempered: the token and pad rows as `token` scales them; the constant rows (the
    sink) by that scale raised to SINK_TEMPER, between the fold's whitening (1) and token's."""
    from gguf_trainer.data.recipe import CONST, SINK_TEMPER, recipe_stats_of_rows

    g = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(20):
        rows = torch.randn(5, 2, generator=g)
        rows[0] = torch.tensor([1000.0, 0.0])
        cls = torch.tensor([CONST, TOKEN, TOKEN, TOKEN, TOKEN], dtype=torch.int8)
        samples.append((rows, cls, torch.ones(5, dtype=torch.bool)))
    token = recipe_stats_of_rows(samples, Recipe(target_space="standardized", sink="token",
                                                  stats_rows="loss"), 1)[1]
    _, temp = recipe_stats_of_rows(samples, Recipe(target_space="standardized",
                                                  sink="tempered", stats_rows="loss"), 1)
    assert torch.equal(temp.token, token.token) and torch.equal(temp.pad, token.pad)
    assert torch.allclose(temp.const, token.token.pow(SINK_TEMPER))
    assert 1 < float(temp.const[0]) < float(temp.token[0]) / 4  # 0.7 of ~400x: ~66x
    cls = torch.tensor([CONST, TOKEN, PAD], dtype=torch.int8)
    assert torch.equal(temp.per_row(cls), torch.stack([temp.const, temp.token, temp.pad]))
