"""Validation / eval metrics over a whole set, weighted globally (pure torch).

Owns the metric definitions shared by train (val) and evaluate. Knows nothing of packs,
projects or files: callers hand in the supervised rows, already selected and flattened.
Every number is a ratio of sums over ALL rows (or samples) seen, never a mean of per-batch
means, so splitting the same rows into different batches changes nothing but float rounding
(the earlier trainer over-weighted its small last batch).

Usage:
    m, offset = RowMetrics(mu=train_mean, centered=True), 0   # LLaDA: centred headline
    for pred, target, mask in batches:                        # (B, L, D), (B, L, D), (B, L)
        m.update(masked_rows(pred, mask), masked_rows(target, mask), sample_index(mask, offset))
        offset += mask.shape[0]
    eval_json.update(m.result())
"""

from __future__ import annotations

import math

import torch

RMS_EPS = 1e-5  # as in the DiT-side rms_norm: x * rsqrt(mean(x^2) + 1e-5)
_OWN_KEYS = {"raw", "rms", "centered"}  # tag names that would collide with cos_<key>


def row_cos(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Cosine along the last dim, (N, D) x (N, D) -> (N,) float64.

    Products are taken in the inputs' dtype, sums in float64. A row whose norm product is
    below `eps` (an all-zero row) has cosine 0.0: "no direction" scores as orthogonal.
    """
    dot = (a * b).sum(-1, dtype=torch.float64)
    na = (a * a).sum(-1, dtype=torch.float64).sqrt()
    nb = (b * b).sum(-1, dtype=torch.float64).sqrt()
    return dot / (na * nb).clamp_min(eps)


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + 1e-5) per row: what the DiT applies to the conditioning."""
    ms = (x * x).mean(-1, keepdim=True, dtype=torch.float64)
    return x * torch.rsqrt(ms + RMS_EPS).to(x.dtype)


def masked_rows(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Real rows of a padded batch: x (B, L, D), mask (B, L) -> (N, D), sample-major order."""
    return x[mask.bool()]


def sample_index(mask: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """Global sample id of each row masked_rows() returns: (B, L) -> (N,) long, offset + b."""
    n_samples, length = mask.shape
    ids = torch.arange(n_samples, device=mask.device).unsqueeze(1).expand(n_samples, length)
    return ids[mask.bool()] + offset


class RowMetrics:
    """Streaming, globally weighted metrics over supervised rows.

    "Row-weighted" = every supervised row counts once over the whole set (slot-weighted for
    PixArt, token-weighted for MageFlow). The "headline cosine" of a row is cos(pred, target),
    or cos(pred - mu, target - mu) when `centered=True` (LLaDA: a shared per-dim offset makes
    the plain cosine of even a zero prediction read ~0.99). Keys of result():

    * cos            row-weighted mean headline cosine.
    * cos_raw        row-weighted mean plain cos(pred, target), whatever `centered` says.
    * cos_rms        headline cosine of rms_norm()ed rows. Cosine is scale-invariant, so this
                     EQUALS cos (up to rounding); kept only because the README names it.
    * cos_centered   row-weighted mean cos(pred - mu, target - mu)            [mu given]
    * rel_mse        sum (pred - target)^2 / sum target^2 over all rows (nan if targets are 0).
    * cos_<tag>      cos over the rows whose tag is True; omitted when no row had it.
    * worst_row_cos     min headline cosine over rows.
    * worst_sample_cos  min over samples of the sample's row-weighted mean headline cosine.
    * roundtrip_cos  row-weighted mean headline cosine of (pred, ref), i.e. centred by mu
                     when centered=True, over rows whose batch passed `ref`.  [ref given]
    * baseline_cos, baseline_cos_centered, baseline_rel_mse: the same metrics for the
                     per-dimension mean baseline, pred = mu on every row (the number to beat).
                     Its centred prediction is the zero row, so baseline_cos_centered = 0.0
                     by the zero-row rule of row_cos().                          [mu given]
    * baseline_cos_<tag>  cos_<tag> of the mean baseline: its headline cosine over the rows
                     whose tag is True (plain cos(mu, target); 0.0 when centered), so each
                     cos_<tag> has the number it must beat (MageFlow: cos_vis, cos_txt).
                                                      [mu given; omitted like cos_<tag>]
    * rows, samples  supervised rows and distinct sample ids seen.
    """

    def __init__(self, mu: torch.Tensor | None = None, centered: bool = False):
        assert mu is None or mu.dim() == 1, "mu is one mean per dimension, shape (D,)"
        assert mu is not None or not centered, "centered=True needs mu"
        self.mu, self.is_centered = mu, centered
        self.sums: dict[str, float] = {}  # key -> float64 sum over rows
        self.counts: dict[str, int] = {}  # key -> rows in that sum
        self.worst_row = math.inf
        self.sample_parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def _add(self, key: str, values: torch.Tensor) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + float(values.sum(dtype=torch.float64))
        self.counts[key] = self.counts.get(key, 0) + values.numel()

    def update(self, pred: torch.Tensor, target: torch.Tensor, sample_ids: torch.Tensor,
               tags: dict[str, torch.Tensor] | None = None,
               ref: torch.Tensor | None = None) -> None:
        """Add rows: pred, target, ref (N, D); sample_ids (N,) long; tags name -> bool (N,)."""
        assert pred.shape == target.shape and pred.dim() == 2, (pred.shape, target.shape)
        assert sample_ids.shape == pred.shape[:1], sample_ids.shape
        if pred.shape[0] == 0:
            return
        # bf16/f16 inputs are computed in float32, float64 inputs stay float64.
        dtype = torch.promote_types(pred.dtype, torch.float32)
        p, t = pred.to(dtype), target.to(dtype)
        mu = None if self.mu is None else self.mu.to(p.device, dtype)
        cos_raw = row_cos(p, t)
        self._add("cos_raw", cos_raw)
        self._add("sq_err", (p - t).pow(2).sum(-1, dtype=torch.float64))
        self._add("sq_tgt", (t * t).sum(-1, dtype=torch.float64))
        if mu is not None:
            pc, tc = p - mu, t - mu
            cos_c = row_cos(pc, tc)
            self._add("cos_centered", cos_c)
            base_cos = row_cos(mu.expand_as(t), t)
            self._add("baseline_cos", base_cos)
            self._add("baseline_sq_err", tc.pow(2).sum(-1, dtype=torch.float64))
        a, b, head = (pc, tc, cos_c) if self.is_centered else (p, t, cos_raw)
        self._add("cos", head)
        self._add("cos_rms", row_cos(rms_norm(a), rms_norm(b)))
        self.worst_row = min(self.worst_row, float(head.min()))
        for name, sel in (tags or {}).items():
            assert name not in _OWN_KEYS, f"tag name {name!r} collides with cos_{name}"
            assert sel.shape == head.shape and sel.dtype == torch.bool, (name, sel.shape)
            self._add(f"cos_{name}", head[sel])
            if mu is not None:  # the baseline's headline: a centred mean prediction is the zero row
                base = torch.zeros_like(head) if self.is_centered else base_cos
                self._add(f"baseline_cos_{name}", base[sel])
        if ref is not None:
            assert ref.shape == pred.shape, (ref.shape, pred.shape)
            r = ref.to(dtype)
            self._add("roundtrip_cos", row_cos(a, r - mu) if self.is_centered else row_cos(p, r))
        self._add_samples(sample_ids, head)

    def _add_samples(self, sample_ids: torch.Tensor, head: torch.Tensor) -> None:
        """Keep this batch's per-sample (id, cosine sum, row count); merged in result()."""
        ids, inv = torch.unique(sample_ids, return_inverse=True)
        per_sum = torch.zeros(len(ids), dtype=torch.float64, device=head.device)
        per_cnt = torch.zeros(len(ids), dtype=torch.float64, device=head.device)
        per_sum.index_add_(0, inv, head)
        per_cnt.index_add_(0, inv, torch.ones_like(head))
        self.sample_parts.append((ids.cpu(), per_sum.cpu(), per_cnt.cpu()))

    def _sample_means(self) -> torch.Tensor:
        """Each sample's mean headline cosine, merging rows of one sample across batches."""
        ids = torch.cat([part[0] for part in self.sample_parts])
        uniq, inv = torch.unique(ids, return_inverse=True)
        sums = torch.zeros(len(uniq), dtype=torch.float64).index_add_(
            0, inv, torch.cat([part[1] for part in self.sample_parts])
        )
        cnts = torch.zeros(len(uniq), dtype=torch.float64).index_add_(
            0, inv, torch.cat([part[2] for part in self.sample_parts])
        )
        return sums / cnts

    def result(self) -> dict[str, float]:
        """The keys listed in the class docstring; only rows/samples (0) before any update."""
        rows = self.counts.get("cos", 0)
        if rows == 0:
            return {"rows": 0, "samples": 0}
        mean = {k: self.sums[k] / n for k, n in self.counts.items() if n > 0}
        sq_tgt = self.sums["sq_tgt"]
        sample_means = self._sample_means()
        out = {k: mean[k] for k in ("cos", "cos_raw", "cos_rms", "cos_centered") if k in mean}
        out["rel_mse"] = self.sums["sq_err"] / sq_tgt if sq_tgt > 0 else math.nan
        out.update({k: v for k, v in mean.items() if k.startswith("cos_") and k not in out})
        out["worst_row_cos"] = self.worst_row
        out["worst_sample_cos"] = float(sample_means.min())
        if "roundtrip_cos" in mean:
            out["roundtrip_cos"] = mean["roundtrip_cos"]
        if self.mu is not None:
            out["baseline_cos"] = mean["baseline_cos"]
            out["baseline_cos_centered"] = 0.0
            out["baseline_rel_mse"] = (
                self.sums["baseline_sq_err"] / sq_tgt if sq_tgt > 0 else math.nan
            )
            out.update({k: v for k, v in mean.items() if k.startswith("baseline_cos_")})
        out["rows"], out["samples"] = rows, len(sample_means)
        return out
