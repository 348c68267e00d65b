"""packs/token_aligned_qwen.py says the loss reads rows from `start` on: for every shipped
token-aligned Qwen pack with rows before its start row, the recipe `new --pack` writes weighs
those rows 0, so `compute_loss` does not move when they change and moves when a row the DiT
reads changes."""

from __future__ import annotations

import pytest
import torch

from gguf_trainer.data.recipe import Recipe, RowFit
from gguf_trainer.data.shards import Batch, Stats
from gguf_trainer.packs import get_pack, pack_ids
from gguf_trainer.packs.token_aligned_qwen import QwenTokenAlignedPack
from gguf_trainer.stages.train import compute_loss
from gguf_trainer.store.project_schema import TrainSettings


def _shipped_with_prefix():
    out = []
    for i in pack_ids():
        p = get_pack(i)
        if (type(p).__module__.startswith("gguf_trainer.packs.")
                and isinstance(p, QwenTokenAlignedPack) and p.start > 0):
            out.append(i)
    return out


def _recipe(pack) -> Recipe:
    train = {k.split(".", 1)[1]: v for k, v in pack.all_defaults.items()
             if k.startswith("train.")}
    return Recipe.from_settings(TrainSettings(**train), pack)


def _loss(pack, target: torch.Tensor, pred: torch.Tensor) -> float:
    r, d = target.shape
    mask = torch.ones(1, r, dtype=torch.bool)
    b = Batch(torch.zeros(1, r, 4), mask.clone(), target[None].clone(), mask.clone(), None,
              torch.tensor([pack.start]), [(0, 0)], n_real=torch.tensor([r]))
    recipe = _recipe(pack)
    stats = Stats(torch.zeros(d), torch.ones(d), torch.ones(d), 1)
    fit = RowFit.for_batch(b, recipe, None, 1)
    rows = pred[b.row_mask[0]]  # the rows the train step's forward computes
    loss, _ = compute_loss(rows, b, stats, recipe.standardized, 0.5, fit)
    return float(loss)


def test_some_shipped_token_aligned_pack_has_rows_before_its_start():
    assert {"qwen3_ovis", "qwen3vl_qwen_image_2_1", "qwen3vl_lingbot"} <= set(
        _shipped_with_prefix())


@pytest.mark.parametrize("pack_id", _shipped_with_prefix())
def test_the_loss_reads_rows_from_start_on(pack_id):
    pack = get_pack(pack_id)
    assert _recipe(pack).prefix_rows == "out", (
        f"{pack_id}: the recipe keeps the rows before start in the loss; "
        "packs/token_aligned_qwen.py's docstring says it reads rows from start on")
    g = torch.Generator().manual_seed(0)
    r, d = pack.start + 6, 8
    target, pred = torch.randn(r, d, generator=g), torch.randn(r, d, generator=g)
    base = _loss(pack, target, pred)
    moved = target.clone()
    moved[: pack.start] += 100.0  # every row the engine drops before the DiT
    assert _loss(pack, moved, pred) == base
    moved = target.clone()
    moved[pack.start] += 1.0  # the DiT's first row
    assert _loss(pack, moved, pred) != base
