"""The figures eval.json, validation, `status`, `render`, the GUI chart and the health line lead
with: the centred cosine of the rows the DiT reads, each row set centred on its own mean.

A plain cosine of a pre-norm tap stays high for almost any prediction, and a mean taken over
all rows, the attention-sink row among them, makes every ordinary row score ~0.999 whatever the
adapter (shared/reference/real-activations-probe.md). So the rows are judged in sets, each
centred on its own mean:

  tokens  real rows from the DiT's start row on, less the template's constant lead (the ids
          every prompt shares; the sink row is one): data/recipe.py's TOKEN class. A resampler's
          rows (its queries, a T5 window's real slots) are all tokens.
  pads    the appended pad rows the DiT reads (SeFi, FLUX.2 klein, Ovis, FLUX.3), as the shards
          store them: every one, or the K a `train.pad_weight` "one" project stores
          (data/recipe.py stored_pad_rows), each then standing for n_pad / K of the sample's
          pads (set_weights); a pack without pads has none.

Each set is centred on the mean of its own val rows (one pass over the val targets, no model:
`SetMeans.of`), then figured per length bucket (`short`: < 77 real rows from the start row on,
`long`: the rest; `all`: both) and, for a layerwise stack, per tap (each tap's block of the row,
centred on its block of the mean; the set's figure is the mean over taps, as no tap may own it):

  centred_cos           mean over rows of cos(p − μ_set, y − μ_set)
  rel_mse               Σ|p − y|² / Σ|y − μ_set|²  (predicting μ_set scores 1)
  cos                   mean plain cos(p, y): secondary, kept beside the centred one
  baseline_centred_cos  the same figures of the adapter at step 0, which predicts the train
  baseline_rel_mse      mean μ (train.build_model) on every row: the figures to beat
  rows                  rows judged

    means = SetMeans.of(val_files, batch_size, pack.fixed_rows)
    figs = DitFigures(stats.mu, means, n_taps, taps)
    for batch in batches: figs.update(batch, predict(batch))     # raw rows (B, R, D)
    lead = figs.result()
    lead["sets"]["tokens"]["all"]["centred_cos"]
Must not: know projects or packs; callers hand in batches and a predict function.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gguf_trainer.data.lead import BUCKETS, CENTRED_ON, METRIC, SETS, SHORT_BELOW
from gguf_trainer.data.recipe import PAD, TOKEN, row_classes, shared_prefix

_FIGS = ("centred_cos", "rel_mse", "cos", "baseline_centred_cos", "baseline_rel_mse")


def row_sets(batch, n_const: int) -> dict[str, torch.Tensor]:
    """{"tokens": (B, R) bool, "pads": (B, R) bool} over the batch's supervised rows."""
    m = batch.row_mask.bool()
    if batch.n_real is None:  # a resampler: every supervised row varies with the prompt
        return {"tokens": m, "pads": torch.zeros_like(m)}
    cls = row_classes(batch, n_const)
    return {"tokens": m & (cls == TOKEN), "pads": m & (cls == PAD)}


def set_weights(batch, sets: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, R) how many of the sample's rows each row stands for: 1, but a stored pad of a
    shard that keeps K of a sample's pads (data/recipe.py stored_pad_rows) stands for n_pad / K
    of them, so the pads figure is the same whichever rows the shards store (exactly so where
    the pads are one row repeated, FLUX.3's)."""
    w = torch.ones(batch.row_mask.shape, dtype=torch.float64, device=batch.row_mask.device)
    pads = sets["pads"]
    if batch.n_real is None or not pads.any():
        return w
    n_pad = (batch.mask.sum(1) - batch.n_real.to(pads.device)).double()
    stored = pads.sum(1).double()
    per = torch.where(stored > 0, n_pad / stored.clamp_min(1), torch.ones_like(n_pad))
    return torch.where(pads, per[:, None].expand_as(w), w)


def sample_lengths(batch) -> torch.Tensor:
    """(B,) the real rows from the start row on (student tokens for a resampler): the bucket."""
    if batch.n_real is None:
        return batch.mask.sum(1)
    start = batch.sup_start if batch.sup_start is not None else torch.zeros_like(batch.n_real)
    return (batch.n_real.to(start.device) - start).clamp_min(0)


@dataclass
class SetMeans:
    """Each row set's mean target over the val rows (None for a set with no rows), and the
    template's constant lead (the id prefix every val prompt shares)."""

    tokens: torch.Tensor | None
    pads: torch.Tensor | None
    n_const: int

    @classmethod
    def of(cls, files, batch_size: int, fixed_rows: int = 0) -> SetMeans:
        """One pass over the val shards' targets (no model). The constant lead is the id
        prefix the first shard's prompts share, as data/recipe.py's class_moments finds it."""
        from gguf_trainer.data.shards import Shard, iter_batches

        n_const = 0
        if files:
            first = Shard(files[0])
            if "sup_start" in first.t:  # token-aligned: rows are template ids
                n_const = shared_prefix(first.student_ids(i).tolist() for i in range(first.n))
        return cls.of_batches(iter_batches(files, batch_size, fixed_rows), n_const)

    @classmethod
    def of_batches(cls, batches, n_const: int) -> SetMeans:
        sums: dict[str, torch.Tensor] = {}
        counts = dict.fromkeys(SETS, 0)
        for b in batches:
            sets = row_sets(b, n_const)
            w = set_weights(b, sets)
            for name, sel in sets.items():
                if sel.any():
                    rows, ws = b.target[sel].double(), w[sel]
                    sums[name] = sums.get(name, 0) + (ws[:, None] * rows).sum(0)
                    counts[name] += float(ws.sum())
        mean = {k: (sums[k] / counts[k] if counts[k] else None) for k in SETS}
        return cls(mean["tokens"], mean["pads"], n_const)

    def get(self, name: str):
        return getattr(self, name)


class _Acc:
    """Sums of one (set, bucket, tap): every figure is a ratio of sums over all rows."""

    def __init__(self):
        self.v = [0.0] * 6  # cc, cos, base cc, sq err, base sq err, centred sq target
        self.n = 0.0  # rows, each weighted by the rows it stands for (set_weights)
        self.rows = 0  # rows judged

    def add(self, p, y, mu_set, mu_base, w):
        cc = torch.nn.functional.cosine_similarity
        pc, yc, bc = p - mu_set, y - mu_set, (mu_base - mu_set).expand_as(y)
        for k, x in enumerate((cc(pc, yc, dim=-1, eps=1e-12), cc(p, y, dim=-1, eps=1e-12),
                               cc(bc, yc, dim=-1, eps=1e-12), (p - y).pow(2).sum(-1),
                               (bc - yc).pow(2).sum(-1), yc.pow(2).sum(-1))):
            self.v[k] += float((x * w).sum())
        self.n += float(w.sum())
        self.rows += p.shape[0]

    def result(self) -> dict:
        v, n = self.v, self.n if self.n > 0 else 1.0
        den = v[5] if v[5] > 0 else float("nan")
        return {"centred_cos": v[0] / n, "rel_mse": v[3] / den, "cos": v[1] / n,
                "baseline_centred_cos": v[2] / n, "baseline_rel_mse": v[4] / den,
                "rows": self.rows}


class DitFigures:
    """The lead block, accumulated batch by batch: `update(batch, pred)` with the batch on the
    device and its raw prediction (B, R, D); `result()` (module docstring) is
    {"metric", "centred_on", "taps", "short_below", "sets": {set: {bucket: figures (+
    "per_tap" for a stack)}}}, a set or bucket with no rows left out."""

    def __init__(self, mu, means: SetMeans, n_taps: int = 1, taps=()):
        self.mu, self.means, self.n_taps, self.taps = mu.double(), means, n_taps, list(taps)
        w = mu.shape[0] // n_taps
        self.cols = [slice(k * w, (k + 1) * w) for k in range(n_taps)]
        self.acc: dict[tuple[str, str, int], _Acc] = {}

    def update(self, batch, pred) -> None:
        dev = pred.device
        mu = self.mu.to(dev)
        short = (sample_lengths(batch).to(dev) < SHORT_BELOW)[:, None].expand_as(batch.row_mask)
        sets = row_sets(batch, self.means.n_const)
        weight = set_weights(batch, sets)
        for name, sel in sets.items():
            mu_set = self.means.get(name)
            if mu_set is None or not sel.any():
                continue
            mu_set = mu_set.to(dev)
            # the set's rows only, in float64 (never the whole padded batch: SeFi's is 1,024
            # rows of 10,240 a sample)
            p, t, w, s = (pred[sel].double(), batch.target[sel].double(), weight[sel],
                          short[sel])
            for bucket, rows in (("all", None), ("short", s), ("long", ~s)):
                if rows is not None and not rows.any():
                    continue
                pb, tb, wb = (p, t, w) if rows is None else (p[rows], t[rows], w[rows])
                for k, c in enumerate(self.cols):
                    self.acc.setdefault((name, bucket, k), _Acc()).add(
                        pb[:, c], tb[:, c], mu_set[c], mu[c], wb)

    def result(self) -> dict:
        sets: dict = {}
        for name, bucket, _k in sorted(self.acc):
            if bucket in sets.get(name, {}):
                continue
            per = [self.acc[(name, bucket, k)].result() for k in range(self.n_taps)]
            fig = {f: sum(x[f] for x in per) / self.n_taps for f in _FIGS}
            fig["rows"] = per[0]["rows"]
            if self.n_taps > 1:
                fig["per_tap"] = per
            sets.setdefault(name, {})[bucket] = fig
        return {"metric": METRIC, "centred_on": CENTRED_ON, "taps": self.taps,
                "short_below": SHORT_BELOW,
                "sets": {n: {b: sets[n][b] for b in BUCKETS if b in sets[n]} for n in SETS
                         if n in sets}}
