"""Scoring an adapter on shard batches: the forward, raw predictions, per-row tags, metrics.

One place for how a model is run on a `Batch` and how its rows are scored, shared by the
train stage (validation), the eval stage (GGUF and checkpoint) and snapshots. Must not:
know projects or stages; it takes a model, batches and the pack's scoring flags.

    res = validate(model, val_files, pack, stats, batch_size, device)   # {"val_cos": ..., ...}
    res["val_cc_tokens"], res["lead"]    # the centred cosine of the DiT's token rows, the block
"""

from __future__ import annotations

import torch

from gguf_trainer.data.dit_rows import DitFigures, SetMeans
from gguf_trainer.data.lead import lead_value
from gguf_trainer.data.metrics import RowMetrics, masked_rows
from gguf_trainer.data.shards import Batch, Stats, iter_batches


def forward(model, batch: Batch) -> torch.Tensor:
    return model(batch.hidden, mask=batch.mask, seed_ids=batch.seed_ids, **batch.vision_kwargs())


def forward_rows(model, batch: Batch) -> torch.Tensor:
    """The training forward: the supervised rows only, (N, out) in masked_rows order, each
    equal to `forward`'s; the adapter skips the rest of its last block and out_proj."""
    return model(batch.hidden, mask=batch.mask, seed_ids=batch.seed_ids, **batch.vision_kwargs(),
                 rows=batch.row_mask)


def raw_prediction(pred, stats: Stats, standardized: bool) -> torch.Tensor:
    """Rows in the teacher's scale: standardized kinds predict (t − μ)/σ_f."""
    return pred * stats.sigma_f + stats.mu if standardized else pred


def row_tags(batch: Batch) -> dict[str, torch.Tensor]:
    """Per-row tags of a batch, flattened like `masked_rows(.., batch.row_mask)`."""
    m = batch.row_mask
    tags = {}
    if batch.seed_ids is not None:  # the EOS slot is the last real slot of each sample
        last = m.sum(1) - 1
        tags["eos"] = torch.arange(m.shape[1], device=m.device)[None, :] == last[:, None]
    if batch.sup_start is not None:  # rows the DiT consumes
        tags["slice"] = (
            torch.arange(m.shape[1], device=m.device)[None, :] >= batch.sup_start[:, None]
        )
    if batch.vis_mask is not None:  # image tokens (cos_vis) and the rest (cos_txt)
        tags["vis"], tags["txt"] = batch.vis_mask, ~batch.vis_mask
    return {k: masked_rows(v.unsqueeze(-1).float(), m).squeeze(-1).bool() for k, v in tags.items()}


def score_batches(batches, predict, stats: Stats, centered: bool, device, ref_predict=None,
                  also=()) -> dict:
    """RowMetrics over every batch (global weighting). `predict(batch) -> raw rows [B, R, D]`.
    `also`: accumulators (dit_rows.DitFigures) that get every (batch, prediction) too, so one
    forward feeds every figure."""
    metrics = RowMetrics(mu=stats.mu.to(device).double(), centered=centered)
    offset = 0
    for batch in batches:
        batch = batch.to(device)
        with torch.no_grad():
            pred = predict(batch)
            ref = None if ref_predict is None else masked_rows(ref_predict(batch), batch.row_mask)
        for acc in also:
            acc.update(batch, pred)
        m = batch.row_mask
        sample_ids = (torch.arange(m.shape[0], device=device)[:, None] + offset).expand_as(m)[m]
        metrics.update(
            masked_rows(pred, m),
            masked_rows(batch.target, m),
            sample_ids,
            tags=row_tags(batch),
            ref=ref,
        )
        offset += m.shape[0]
    return metrics.result()


def validate(model, val_files, pack, stats: Stats, batch_size: int, device,
             standardized: bool | None = None, means: SetMeans | None = None,
             n_taps: int = 1) -> dict:
    """The pack's metrics of `model` over every val shard; "val_cos" is the pack's headline
    (best.pt's pick), "lead" the centred cosines of the rows the DiT reads (dit_rows.py) and
    "val_cc_tokens" / "val_cc_pads" their lead figures, "val_cc_tokens_short" / "_long" (and the
    pads') those of short and long prompts apart (None without rows of that set or bucket).
    `standardized`: the space the model predicts in (the recipe's; None: the pack's); `means`:
    the val row sets' means (SetMeans.of; computed here when not given)."""
    if standardized is None:
        standardized = pack.standardized
    if means is None:
        means = SetMeans.of(val_files, batch_size, pack.fixed_rows)
    lead = DitFigures(stats.mu, means, n_taps, getattr(pack, "taps", ()) if n_taps > 1 else ())
    model.eval()
    try:
        predict = lambda b: raw_prediction(forward(model, b).float(), stats, standardized)
        res = score_batches(
            iter_batches(val_files, batch_size, pack.fixed_rows),
            predict,
            stats,
            pack.centered,
            device,
            also=(lead,),
        )
    finally:
        model.train()
    res["val_cos"] = res[pack.headline]
    res["lead"] = lead.result()
    for name in ("tokens", "pads"):  # all rows, then short and long prompts apart
        res[f"val_cc_{name}"] = lead_value(res["lead"], name)
        for bucket in ("short", "long"):
            res[f"val_cc_{name}_{bucket}"] = lead_value(res["lead"], name, bucket)
    return res


def score_taps(batches, predict, stats: Stats, taps, device) -> dict:
    """Layerwise adapters: the figures of each tap's D-wide column block of the rows the DiT
    consumes (rows >= sup_start; every supervised row without one), beside the whole-stack
    figures: {"taps": [...], "cos": [...], "rel_mse": [...], "baseline_cos": [...]} with one
    entry per tap in the engine's ascending stack order; the baseline predicts that tap's
    per-dimension mean on every row."""
    n = len(taps)
    mus = stats.mu.to(device).double().chunk(n)
    per_tap = [RowMetrics(mu=mu) for mu in mus]
    offset = 0
    for batch in batches:
        batch = batch.to(device)
        with torch.no_grad():
            pred = predict(batch)
        m = batch.row_mask
        if batch.sup_start is not None:
            m = m & (torch.arange(m.shape[1], device=m.device)[None, :] >= batch.sup_start[:, None])
        sample_ids = (torch.arange(m.shape[0], device=device)[:, None] + offset).expand_as(m)[m]
        rows_p, rows_t = masked_rows(pred, m), masked_rows(batch.target, m)
        for k, (p, t) in enumerate(zip(rows_p.chunk(n, -1), rows_t.chunk(n, -1))):
            per_tap[k].update(p, t, sample_ids)
        offset += m.shape[0]
    res = [r.result() for r in per_tap]
    return {
        "taps": list(taps),
        "cos": [r.get("cos") for r in res],
        "rel_mse": [r.get("rel_mse") for r in res],
        "baseline_cos": [r.get("baseline_cos") for r in res],
    }
