"""The training recipe: which target rows the loss reads, how much each weighs, which rows the
statistics come from, and in which space the adapter predicts.

Real teachers carry massive activations: the attention-sink row of a chat template reaches
~25,000 in a few dims where ordinary rows hold 2-10 (SmolLM2-135M; ~11,000 in Qwen3-VL-4B),
and padded families append hundreds of pad rows that are just as large. Whitened by statistics
those rows own, every ordinary row is fitted badly; a raw head cannot even reach them. The
recipe keys (`train.*`, README "Recipes on real activations") say what to do about it; the
measured winners are each pack's defaults, and a project.json without the keys keeps the
recipe it was trained with (`Recipe.from_settings`: a missing key is today's old value).

Row classes, per target row of a token-aligned sample (a resampler's rows are all tokens):
  prefix  rows before the DiT's start row (`sup_start`): the engine drops them after the adapter
  const   rows from the start row on whose ids every prompt shares (the template's lead, the
          attention-sink row among them): constants in a causal teacher, read by the DiT
  pad     the family's appended pad rows (the trailing run of the pad id in the student ids)
  token   every other row (the rows that vary with the prompt)

    recipe = Recipe.from_settings(settings.train, pack)
    w = row_weights(batch, recipe)                 # (B, R) float, 0 where the loss reads nothing
    stats = recipe_stats(files, recipe, n_taps)    # fold statistics + per-class scales
Must not: read a project or a pack's files; it sees settings values and shard tensors only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from gguf_trainer.engine.template_padding import unpadded_length

PREFIX, TOKEN, PAD, CONST = 0, 1, 2, 3
# sink "tempered": the constant rows (the attention sink among them) weigh (sigma_f / sigma_t)
# ** SINK_TEMPER per dim where the token rows weigh (sigma_f / sigma_t) ** 1. Measured on SmolLM2
# (README "Recipes on real activations"): at 1 (`token`) the sink's error, 235x the fold's scale
# in its massive dim, owns the first hundreds of steps; at 0.5 the sink is given up (relative
# error 0.67); 0.7 keeps it within 0.10 at 150 steps and exact at 600, and fits the token rows
# as well as `token` does at 600 steps and better before.
SINK_TEMPER = 0.7


@dataclass(frozen=True)
class Recipe:
    """One training recipe. Every field is a `train.*` setting of the same name."""

    target_space: str = "raw"  # "raw" | "standardized" (folded into out_proj/skip at export)
    cosine: str = "row"  # "row": over the whole output row | "tap": mean of per-tap cosines
    sigma_floor: float = 0.03
    sigma_floor_mode: str = "absolute"  # "absolute" | "relative" (x each tap's median sigma)
    pad_weight: str = "row"  # "row": each pad a row | "one": a sample's pads weigh one row
    prefix_rows: str = "in"  # "in" | "out": rows before the start row in the loss and stats
    stats_rows: str = "all"  # "all" stored rows | "loss": weighted as the loss weighs them
    # "none": one whitening (the fold's sigma) | "token": every row whitened by the token rows'
    # sigma | "tempered": as token, the constant rows' weight tempered (SINK_TEMPER) | "apart":
    # each row class by its own sigma
    sink: str = "none"

    @classmethod
    def from_settings(cls, train, pack) -> Recipe:
        """The recipe of a project's `train` settings; `target_space` "pack" (a project.json
        written before the recipe keys) is the pack's old fixed space."""
        space = train.target_space
        if space == "pack":
            space = "standardized" if pack.standardized else "raw"
        return cls(space, train.cosine, train.sigma_floor, train.sigma_floor_mode,
                   train.pad_weight, train.prefix_rows, train.stats_rows, train.sink)

    @property
    def standardized(self) -> bool:
        return self.target_space == "standardized"

    @property
    def needs_classes(self) -> bool:
        """Whether any row is weighed or whitened apart (else the old all-rows path)."""
        return (self.pad_weight != "row" or self.prefix_rows != "in" or self.sink != "none"
                or self.stats_rows != "all" or self.sigma_floor_mode != "absolute")

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self).items())


# ---------------------------------------------------------------- row classes and weights


def row_classes(batch, n_const: int = 0) -> torch.Tensor:
    """(B, R) int8: PREFIX, CONST, TOKEN or PAD for every target row of the batch; `n_const`
    is the length of the id prefix every prompt shares (const_rows)."""
    b, r = batch.row_mask.shape
    idx = torch.arange(r, device=batch.row_mask.device).expand(b, r)
    out = torch.full((b, r), TOKEN, dtype=torch.int8, device=batch.row_mask.device)
    if batch.n_real is not None:
        out[idx >= batch.n_real[:, None]] = PAD
        out[(idx < n_const) & (idx < batch.n_real[:, None])] = CONST
    if batch.sup_start is not None:
        out[idx < batch.sup_start[:, None]] = PREFIX
    return out


def _weights(classes: torch.Tensor, keep: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """(B, R) float weights of rows already kept (0 elsewhere)."""
    w = keep.float()
    if recipe.prefix_rows == "out":
        w = w * (classes != PREFIX)
    if recipe.pad_weight == "one":
        pads = (classes == PAD) & keep
        n_pad = pads.sum(1, keepdim=True).clamp_min(1)
        w = torch.where(pads, w / n_pad, w)
    return w


def row_weights(batch, recipe: Recipe) -> torch.Tensor:
    """(B, R) the loss weight of every target row: 0 where nothing is supervised."""
    return _weights(row_classes(batch), batch.row_mask.bool(), recipe)


# ---------------------------------------------------------------- statistics


@dataclass(frozen=True)
class ClassScales:
    """Per-class whitening (sink "token" or "apart"): a row's error is divided by its class's
    floored sigma instead of the fold's, i.e. multiplied by sigma_f / sigma_class_f, per dim."""

    token: torch.Tensor  # (D,)
    pad: torch.Tensor  # (D,)
    prefix: torch.Tensor  # (D,)
    const: torch.Tensor  # (D,)
    n_const: int = 0  # the shared id prefix's length (row_classes)

    def per_row(self, classes: torch.Tensor) -> torch.Tensor:
        """(N, D) or (B, R, D) scales for rows of the given classes."""
        table = torch.stack([self.prefix, self.token, self.pad, self.const])  # by class
        return table[classes.long()]

    def to(self, device) -> ClassScales:
        return ClassScales(self.token.to(device), self.pad.to(device), self.prefix.to(device),
                           self.const.to(device), self.n_const)


def floored(sigma: torch.Tensor, recipe: Recipe, n_taps: int) -> torch.Tensor:
    """sigma floored as the recipe says: at sigma_floor, or at sigma_floor x the median sigma
    of each tap (a layerwise stack's taps lie ~30x apart, so one absolute floor fits none)."""
    if recipe.sigma_floor_mode == "absolute":
        return sigma.clamp_min(recipe.sigma_floor)
    taps = sigma.view(n_taps, -1)
    floor = recipe.sigma_floor * taps.median(dim=1, keepdim=True).values
    return torch.maximum(taps, floor).reshape(-1)


def shard_classes(shard, i: int, n_const: int = 0) -> torch.Tensor:
    """(R,) classes of sample i's target rows, as `shard.target(i)` lays them (token-aligned
    shards carry sup_start: one row per template id, stored or not)."""
    if "sup_start" not in shard.t:
        return torch.full((int(shard.t_off[i + 1] - shard.t_off[i]),), TOKEN, dtype=torch.int8)
    out = torch.full((int(shard.s_off[i + 1] - shard.s_off[i]),), TOKEN, dtype=torch.int8)
    n_real = unpadded_length(shard.student_ids(i).tolist())
    out[n_real:] = PAD
    out[: min(n_const, n_real)] = CONST
    out[: int(shard.t["sup_start"][i])] = PREFIX
    return out


def shared_prefix(id_lists) -> int:
    """The length of the id prefix every sample shares (0 for fewer than two samples): the
    template's constant lead in a causal teacher."""
    common, seen = None, 0
    for ids in id_lists:
        ids, seen = list(ids), seen + 1
        if common is None:
            common = ids
            continue
        n = 0
        while n < min(len(common), len(ids)) and common[n] == ids[n]:
            n += 1
        common = common[:n]
    return len(common) if seen > 1 else 0


class _Moments:
    def __init__(self):
        self.s = self.s2 = None
        self.n = 0.0

    def add(self, rows: torch.Tensor, w: torch.Tensor) -> None:
        rows = rows.double()
        a, b = (w.double()[:, None] * rows).sum(0), (w.double()[:, None] * rows * rows).sum(0)
        self.s, self.s2 = (a, b) if self.s is None else (self.s + a, self.s2 + b)
        self.n += float(w.sum())

    def mu_sigma(self):
        if self.s is None or self.n <= 0:
            return None
        mu = self.s / self.n
        return mu, (self.s2 / self.n - mu * mu).clamp_min(0.0).sqrt()


def _accumulate(samples, recipe: Recipe):
    """The loss-weighted moments (all classes) and each class's own, as (mu, sigma) float64
    pairs (None for a class with no rows), over `samples`: (rows (R, D), classes (R,),
    keep (R,) bool) per sample."""
    weighted, per = _Moments(), [_Moments() for _ in (PREFIX, TOKEN, PAD, CONST)]
    n_const = 0
    for rows, cls, keep in samples:
        w = _weights(cls[None], keep[None], recipe)[0]
        weighted.add(rows, w if recipe.stats_rows == "loss" else keep.double())
        for c in (PREFIX, TOKEN, PAD, CONST):
            sel = keep & (cls == c)
            if sel.any():
                per[c].add(rows[sel], torch.ones(int(sel.sum()), dtype=torch.float64))
        at = (cls == CONST).nonzero()
        n_const = max(n_const, int(at[-1]) + 1 if len(at) else 0)
    return weighted.mu_sigma(), [m.mu_sigma() for m in per], weighted.n, n_const


def class_moments(files: list[Path], recipe: Recipe):
    """One pass over the train shards: `_accumulate` over every stored sample."""
    from gguf_trainer.data.shards import Shard

    # the shared lead is the template's: the first shard's hundreds of prompts name it (reading
    # every shard twice for it would double the pass over a real project's hundreds of GB)
    first = Shard(files[0])
    n_const = shared_prefix(first.student_ids(i).tolist() for i in range(first.n))

    def samples():
        for path in files:
            shard = first if path == files[0] else Shard(path)
            for i in range(shard.n):
                yield shard.target(i), shard_classes(shard, i, n_const), shard.target_keep(i)

    return _accumulate(samples(), recipe)


def _stats_and_scales(moments, recipe: Recipe, n_taps: int):
    from gguf_trainer.data.shards import Stats

    (mu, sigma), per, n, n_const = moments
    sigma_f = floored(sigma, recipe, n_taps)
    stats = Stats(mu.float(), sigma.float(), sigma_f.float(), round(n))
    if recipe.sink == "none":
        return stats, None

    def scale(c: int) -> torch.Tensor:
        if per[c] is None:
            return torch.ones_like(stats.mu)
        return (sigma_f / floored(per[c][1], recipe, n_taps)).float()

    # token: every row by the varying rows' sigma (the constant rows, the sink among them, keep
    # their exact fit while no longer setting the ordinary rows' scale). tempered: the same,
    # the constant rows' scale raised to SINK_TEMPER (between the fold's whitening and the
    # token rows'), so fitting the sink does not crowd out the token rows. apart: each class by
    # its own; the constant rows' own sigma is ~0, so they keep the fold's whitening.
    token, ones = scale(TOKEN), torch.ones_like(stats.mu)
    if recipe.sink == "token":
        return stats, ClassScales(token, token, token, token, n_const)
    if recipe.sink == "tempered":
        return stats, ClassScales(token, token, token, token.pow(SINK_TEMPER), n_const)
    return stats, ClassScales(token, scale(PAD), ones, ones, n_const)


def recipe_stats(files: list[Path], recipe: Recipe, n_taps: int):
    """(Stats, ClassScales or None) for training with `recipe`. The recipe every project
    trained with before the recipe keys reads the shards' stored moments, as it always did."""
    from gguf_trainer.data.shards import load_stats

    if not recipe.needs_classes:
        return load_stats(files, recipe.sigma_floor), None
    return _stats_and_scales(class_moments(files, recipe), recipe, n_taps)


def recipe_stats_of_rows(samples, recipe: Recipe, n_taps: int):
    """`recipe_stats` of in-memory rows (benchmarks/bench_recipe_real.py): `samples` yields
    (rows (R, D), classes (R,), keep (R,) bool) per sample. The legacy recipe gets what the
    shards' stored moments hold (every kept row once, sigma floored absolutely)."""
    return _stats_and_scales(_accumulate(samples, recipe), recipe, n_taps)


def legacy_recipe(pack, sigma_floor: float) -> Recipe:
    """The recipe every pack trained with before the recipe keys existed."""
    return Recipe(target_space="standardized" if pack.standardized else "raw",
                  sigma_floor=sigma_floor)


def recipe_inputs(recipe: Recipe, pack) -> dict:
    """The train fingerprint's recipe entry: nothing for the legacy recipe (so a project.json
    written before the keys keeps its fingerprint and its checkpoints), else the recipe."""
    if recipe == legacy_recipe(pack, recipe.sigma_floor):
        return {}
    return {"recipe": {k: v for k, v in asdict(recipe).items() if k != "sigma_floor"}}


# ---------------------------------------------------------------- the rows the shards store


def stored_pad_rows(recipe: Recipe, pack) -> int:
    """Pad rows the shards store per sample: 0 = every one (the teacher's rows as they are),
    else the pack's K (`pad_rows_stored`) when the recipe weighs a sample's pads as one row:
    training reads no other pad row, so none other is written (SeFi pads to 1,024 rows)."""
    return pack.pad_rows_stored if recipe.pad_weight == "one" else 0


def stores_from_start(recipe: Recipe, pack) -> bool:
    """Whether the shards leave out the target rows before each sample's start row: when the
    recipe neither trains on them (`prefix_rows` "out" weighs them 0) nor takes statistics
    over them (`stats_rows` "loss" weighs the moments as the loss does; the per-class scales of
    `sink` never use the prefix's own sigma), nothing reads them — the lead figures start at
    the start row too. The student's states of every row stay: the adapter reads them all.
    Only a family with a fixed start row (layerwise.py `start`; every one is token-aligned)
    drops rows; one whose start varies by sample (MageFlow's) stores every row."""
    return (recipe.prefix_rows == "out" and recipe.stats_rows == "loss"
            and getattr(pack, "start", 0) > 0)


@dataclass(frozen=True)
class StoredRows:
    """The target rows the shards store per sample: every row (the default, every shard
    written before), or the rows from the start row on (`from_start`) and/or the real rows and
    K evenly spaced pads (`pads`)."""

    pads: int = 0  # K pad rows a sample; 0: every pad
    from_start: bool = False  # no target row before the sample's start row (sup_start)

    @property
    def every(self) -> bool:
        return not self.pads and not self.from_start

    @property
    def label(self) -> str:
        """How a shard's metadata and the precompute fingerprint name them ("all" for shards
        written before; a pads-only label reads as it did before the start rows could go)."""
        parts = (["from the start row"] if self.from_start else []) + (
            [f"{self.pads} pad row{'s' if self.pads > 1 else ''} per sample"] if self.pads else [])
        return ", ".join(parts) or "all"


def stored_rows(recipe: Recipe, pack) -> StoredRows:
    """The rows the shards store for a project training with `recipe`."""
    return StoredRows(stored_pad_rows(recipe, pack), stores_from_start(recipe, pack))


def describe_stored_rows(label: str) -> str:
    """A shard label (StoredRows.label) in words, for `status`."""
    if label == "all":
        return "every target row"
    start = label.startswith("from the start row")
    pads = label.split(", ", 1)[1] if start and ", " in label else ("" if start else label)
    real = "the real rows from the start row on" if start else "the real rows"
    return f"{real} and {pads}" if pads else "the target rows from the start row on"


def kept_pad_rows(n_real: int, n_rows: int, k: int) -> list[int]:
    """The template rows of the K pads a sample keeps: the midpoints of K equal runs of its
    n_rows - n_real pads (all of them when it has K or fewer)."""
    n_pad = n_rows - n_real
    if n_pad <= k:
        return list(range(n_real, n_rows))
    return [n_real + (2 * j + 1) * n_pad // (2 * k) for j in range(k)]


# ---------------------------------------------------------------- the loss over weighted rows


@dataclass
class RowFit:
    """The recipe applied to one batch: row weights, row classes and the per-class scales."""

    weights: torch.Tensor  # (B, R)
    classes: torch.Tensor  # (B, R) int8
    scales: ClassScales | None
    n_taps: int
    cosine: str

    @classmethod
    def for_batch(cls, batch, recipe: Recipe, scales: ClassScales | None, n_taps: int) -> RowFit:
        """Weights the batch's rows; rows that weigh nothing leave its row_mask, so the
        forward does not compute them."""
        classes = row_classes(batch, 0 if scales is None else scales.n_const)
        w = _weights(classes, batch.row_mask.bool(), recipe)
        batch.row_mask = batch.row_mask & (w > 0)
        return cls(w, classes, scales, n_taps, recipe.cosine)

    @property
    def weight_sum(self) -> float:
        return float(self.weights.sum())

    def loss(self, pred, t, err, m, rows: bool, cos_weight: float):
        """Weighted whitened MSE + cos_weight·(1 − cos); pred/t/err are (N, D) supervised rows
        (rows=True) or padded (B, R, D)."""
        mb = m.bool()
        w = self.weights[mb] if rows else self.weights * mb
        cls = self.classes[mb] if rows else self.classes
        if self.scales is not None:
            err = err * self.scales.per_row(cls)
        sq = err.pow(2).sum(-1)
        if self.cosine == "tap":  # each tap's cosine, then their mean: no tap owns the figure
            shape = (*pred.shape[:-1], self.n_taps, pred.shape[-1] // self.n_taps)
            cos = torch.nn.functional.cosine_similarity(
                pred.reshape(shape), t.reshape(shape), dim=-1, eps=1e-8).mean(-1)
        else:
            cos = torch.nn.functional.cosine_similarity(pred, t, dim=-1, eps=1e-8)
        total = w.sum().clamp_min(1e-12)
        mse = (sq * w).sum() / (total * pred.shape[-1])
        cos = (cos * w).sum() / total
        return mse + cos_weight * (1.0 - cos), {"mse": float(mse.detach()),
                                                "cos": float(cos.detach())}
