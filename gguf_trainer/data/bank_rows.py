"""The Qwen3.5 bridge's FLUX.3 bank as a second target set: its shard tensors, its batch, its
statistics, its loss and its figures (teachers/qwen35_bank.py computes the rows).

Shard tensors (written in the same shard as the slot targets, so one atomic write and the same
resume as every shard; absent when the bank is off):

    bank_rows   [Tb, 20480] bf16  per sample its n_real template rows, then one pad row when the
                                  DiT gets pads (every pad row of the 4B is the same state)
    bank_len    [S] int32         rows stored per sample
    bank_real   [S] int32         n_real: FLUX.3 template ids (prefix + body + suffix)
    bank_body   [S] int32         student rows under the body (bank row 3 + i reads row i)
    bank_slots  [1] int32         the adapter's n_bank
    bank_moment_sum, bank_moment_sq [20480] f64, bank_moment_n [1] f64   moments as the loss
                                  weighs the rows (each real row 1, a sample's pads 1 together)

The loss over a sample's bank reads the rows the DiT gets (teachers/qwen35_bank.dit_rows):
every real row weighs 1 and the pads weigh one row together (the FLUX.3 pack's measured
recipe, `train.pad_weight` "one", packs/layerwise.py): each pad row of the adapter is its own
query, so each is supervised, on the one pad state. Rows past the DiT's are never read.
Standardized like the slot head (whitened by the bank's own floored sigma, folded into
`out_bank` at export: model/export.fold_standardization).

    bank = collate_bank(shard, rows)             # BankBatch or None (no bank in the shard)
    stats = bank_stats(files, sigma_floor)       # Stats of the bank rows, or None
    loss, parts = bank_loss(model, batch, stats, cos_weight)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gguf_trainer.data.metrics import RowMetrics

PREFIX_ROWS = 3  # the student's ids of `<|im_start|>user\n` (teachers/qwen35_bank.PREFIX_IDS)
MULTIPLE = 80  # the rows the DiT gets: the next multiple of 80 (conditioner.hpp 4439)


def dit_rows(n_real: int, n_bank: int) -> int:
    """The bank rows the DiT gets: n_real padded to the next multiple of 80, at most n_bank."""
    return min(n_bank, -(-n_real // MULTIPLE) * MULTIPLE)


def shard_tensors(banks: list, n_bank: int) -> dict[str, torch.Tensor]:
    """The shard's bank tensors from one teachers.qwen35_bank.BankRows per sample."""
    rows = torch.cat([b.rows.float() for b in banks]).to(torch.bfloat16)
    stored = rows.double()  # each stored row weighs 1: a real row, or the sample's pads together
    w = torch.ones(stored.shape[0], dtype=torch.float64)
    return {
        "bank_rows": rows,
        "bank_len": torch.tensor([b.rows.shape[0] for b in banks], dtype=torch.int32),
        "bank_real": torch.tensor([b.n_real for b in banks], dtype=torch.int32),
        "bank_body": torch.tensor([b.n_body for b in banks], dtype=torch.int32),
        "bank_slots": torch.tensor([n_bank], dtype=torch.int32),
        "bank_moment_sum": (w[:, None] * stored).sum(0),
        "bank_moment_sq": (w[:, None] * stored * stored).sum(0),
        "bank_moment_n": w.sum().reshape(1),
    }


@dataclass
class BankBatch:
    """target (B, n_bank, D) the rows the DiT gets (0 past them); weight (B, n_bank) the loss
    weight of each row (0 past them); hidden (B, n_bank, in_dim) the student state under each
    body row, zeros elsewhere (the engine's bank_hidden)."""

    target: torch.Tensor
    weight: torch.Tensor
    hidden: torch.Tensor

    def to(self, device, non_blocking: bool = True) -> BankBatch:
        return BankBatch(*(t.to(device, non_blocking=non_blocking)
                           for t in (self.target, self.weight, self.hidden)))


def collate_bank(shard, rows: list[int]) -> BankBatch | None:
    """The bank of samples `rows` of a loaded shard (data/shards.Shard), None without one."""
    t = shard.t
    if "bank_rows" not in t:
        return None
    if not hasattr(shard, "b_off"):
        shard.b_off = [0] + torch.cumsum(t["bank_len"].long(), 0).tolist()
    n_bank = int(t["bank_slots"][0])
    dim, in_dim = t["bank_rows"].shape[1], t["student_rows"].shape[1]
    target = torch.zeros(len(rows), n_bank, dim)
    weight = torch.zeros(len(rows), n_bank)
    hidden = torch.zeros(len(rows), n_bank, in_dim)
    for b, i in enumerate(rows):
        stored = t["bank_rows"][shard.b_off[i]: shard.b_off[i + 1]].float()
        n_real, n_body = int(t["bank_real"][i]), int(t["bank_body"][i])
        n_out = dit_rows(n_real, n_bank)
        target[b, :n_real] = stored[:n_real]
        weight[b, :n_real] = 1.0
        if n_out > n_real:
            target[b, n_real:n_out] = stored[n_real]
            weight[b, n_real:n_out] = 1.0 / (n_out - n_real)
        hidden[b, PREFIX_ROWS: PREFIX_ROWS + n_body] = shard.student(i)[:n_body].float()
    return BankBatch(target, weight, hidden)


@dataclass(frozen=True)
class BankStats:
    """The bank rows' per-dimension statistics (the fields of data/shards.Stats, which this
    module cannot import: shards.collate imports it)."""

    mu: torch.Tensor
    sigma: torch.Tensor
    sigma_f: torch.Tensor
    n: int


def bank_stats(files: list[Path], sigma_floor: float) -> BankStats | None:
    """The bank rows' statistics over the train shards (None when they hold none)."""
    from safetensors import safe_open

    s = s2 = None
    n = 0.0
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            if "bank_moment_sum" not in set(f.keys()):
                return None
            a, b = f.get_tensor("bank_moment_sum"), f.get_tensor("bank_moment_sq")
            n += float(f.get_tensor("bank_moment_n")[0])
        s, s2 = (a, b) if s is None else (s + a, s2 + b)
    if s is None or n <= 0:
        return None
    mu = s / n
    sigma = (s2 / n - mu * mu).clamp_min(0.0).sqrt()
    return BankStats(mu.float(), sigma.float(), sigma.clamp_min(sigma_floor).float(), round(n))


def predict_bank(model, batch) -> torch.Tensor:
    """The adapter's bank (B, n_bank, D) as the engine's FLUX.3 pass computes it: the same
    slots (MOSS template seeds) and keys, the bank queries reading the student through
    bank_in."""
    return model(batch.hidden, mask=batch.mask, seed_ids=batch.seed_ids, **batch.vision_kwargs(),
                 want_bank=True, bank_hidden=batch.bank.hidden)


def bank_loss(model, batch, stats, cos_weight: float):
    """Weighted whitened MSE + cos_weight·(1 − cos) over the bank rows the DiT gets, the model
    predicting (t − μ)/σ_f."""
    pred = predict_bank(model, batch).float()
    t = (batch.bank.target - stats.mu) / stats.sigma_f
    w = batch.bank.weight
    total = w.sum().clamp_min(1e-12)
    mse = ((pred - t).pow(2).sum(-1) * w).sum() / (total * pred.shape[-1])
    cos = (torch.nn.functional.cosine_similarity(pred, t, dim=-1, eps=1e-8) * w).sum() / total
    loss = mse + cos_weight * (1.0 - cos)
    return loss, {"bank_mse": float(mse.detach()), "bank_cos": float(cos.detach())}


def score_bank(model, batches, stats, device, standardized: bool = True) -> dict:
    """The bank's figures over `batches` (data/shards.Batch with .bank), in the teacher's
    scale: cos, cos_centered, rel_mse and the mean baseline's (the per-dimension mean on every
    row) baseline_cos / baseline_rel_mse, every row the DiT gets counted once (pads included).
    `standardized` False: the model emits the teacher's scale already (an exported file)."""
    metrics = RowMetrics(mu=stats.mu.to(device).double())
    offset = 0
    model.eval()
    try:
        for batch in batches:
            batch = batch.to(device)
            with torch.no_grad():
                pred = predict_bank(model, batch).float()
                if standardized:
                    pred = pred * stats.sigma_f + stats.mu
            m = batch.bank.weight > 0
            ids = (torch.arange(m.shape[0], device=device)[:, None] + offset).expand_as(m)[m]
            metrics.update(pred[m], batch.bank.target[m], ids)
            offset += m.shape[0]
    finally:
        model.train()
    res = metrics.result()
    return {f"bank_{k}": v for k, v in res.items() if isinstance(v, (int, float)) or v is None}


def bank_stats_for(cfg, files: list[Path], sigma_floor: float):
    """The bank's Stats for training an adapter of `cfg` (None when it has no bank); one
    sentence when the shards hold no bank. Every rank of a split run reads the same moments
    (machine/distributed.TrainRanks.share_loss weighs the bank loss across ranks)."""
    from gguf_trainer.base.errors import UserError

    # Ming's config keeps its 256 caption queries in n_bank too (model/ming_adapter.py): those
    # are its own head, trained on the main targets, never a FLUX.3 bank.
    if cfg.kind != "qwen35_bridge" or not cfg.n_bank:
        return None
    stats = bank_stats(files, sigma_floor)
    if stats is None:
        raise UserError("the shards hold no FLUX.3 bank targets; run precompute again with "
                        "train.bank_slots set (gguf-trainer reset --project DIR precompute).")
    return stats


def start_bank(model) -> None:
    """The bank head's step 0 predicts the per-dimension mean (0 in the standardized space),
    as every head's start does (adapters.start_output)."""
    with torch.no_grad():
        model.out_bank.weight.zero_()
        model.out_bank.bias.zero_()
