"""Train stage: the adapter on the precomputed shards, with exact resume.

Read `run_train` top to bottom: setup (device, threads, stats, model, optimizer, stream,
resume), then the loop: LR -> forward and loss -> backward -> clip -> step -> report ->
validate -> checkpoint -> control files -> end test. Helpers are pure functions above it;
`train_step` is the step itself (benchmarks/bench_train_step.py times it against a plain
PyTorch step at the same shapes).

Resume state (`last.pt`, gguf_trainer.data.checkpoints): model, optimizer, step, stream position,
RNG, best score. On resume the checkpoint wins for all of them; `train.steps` comes from
project.json (the count in force), so raising it after the end continues the run (warm
restart of the lr). On CPU with the pinned thread count a resumed run is bit-identical to an
uninterrupted one.

    STAGE   the train stage object
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from gguf_trainer.base import project_file, safe_delete
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.jsonvals import finite
from gguf_trainer.base.paths import BEST, CHECKPOINTS_DIR, LAST, STALE_PREFIX, tool_files_in
from gguf_trainer.data.bank_rows import bank_loss, bank_stats_for, score_bank
from gguf_trainer.data.checkpoints import (
    TrainProgress,
    checkpoint_path,
    does_not_fit,
    load_checkpoint,
    read_side,
    recorded_fingerprint,
    save_checkpoint,
)
from gguf_trainer.data.dit_rows import SetMeans
from gguf_trainer.data.kept_steps import KeptSteps, Schedule
from gguf_trainer.data.recipe import Recipe, RowFit, recipe_inputs, recipe_stats
from gguf_trainer.data.scoring import forward_rows, validate
from gguf_trainer.data.shards import (
    Batch,
    ShardStream,
    Stats,
    StreamPos,
    dims,
    iter_batches,
    shard_files,
)
from gguf_trainer.machine import distributed, hardware
from gguf_trainer.model.vision import load_vision_proj
from gguf_trainer.stages.stage_list import Stage
from gguf_trainer.store.project import read_steps

log = logging.getLogger(__name__)


# the lead figures a train stage reports (data/scoring.validate): all rows, short, long prompts
LEAD_FIELDS = tuple(f"val_cc_{n}{b}" for n in ("tokens", "pads") for b in ("", "_short", "_long"))


def lr_at(step: int, steps: int, warmup: int, lr: float) -> float:
    """Linear warmup, then cosine down to 10% of lr over the steps in force."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = min((step - warmup) / max(1, steps - warmup), 1.0)
    return lr * (0.1 + 0.45 * (1.0 + math.cos(math.pi * t)))


def compute_loss(pred, batch: Batch, stats: Stats, standardized: bool, cos_weight: float,
                 fit: RowFit | None = None):
    """Whitened MSE + cos_weight·(1 − cos) over the supervised rows.

    standardized recipes predict (t−μ)/σ_f; raw ones predict raw rows and the error is
    whitened by the same σ_f. Either way the MSE term is ((pred_raw − t)/σ_f)².
    `pred` is the padded output (B, R, out) or the supervised rows alone (N, out) in
    masked_rows order (scoring.forward_rows, what the train step computes). `fit` (the
    recipe's row weights, per-class whitening and per-tap cosine) is None for the recipe
    every project trained with before the recipe keys: the same arithmetic, bit for bit.
    """
    m = batch.row_mask
    rows = pred.dim() == 2
    target = batch.target[m.bool()] if rows else batch.target
    t = (target - stats.mu) / stats.sigma_f if standardized else target
    err = (pred - t) if standardized else (pred - t) / stats.sigma_f
    if fit is not None:
        return fit.loss(pred, t, err, m, rows, cos_weight)
    n_rows = m.sum().clamp_min(1)
    sq = err.pow(2).sum(-1)
    cos = torch.nn.functional.cosine_similarity(pred, t, dim=-1, eps=1e-8)
    if not rows:
        sq, cos = sq * m, cos * m
    mse = sq.sum() / (n_rows * pred.shape[-1])
    cos = cos.sum() / n_rows
    return mse + cos_weight * (1.0 - cos), {"mse": float(mse.detach()), "cos": float(cos.detach())}


def build_model(pack, cfg, seed: int, stats: Stats, vision_proj=None, skip=None,
                standardized: bool | None = None, seed_table=None):
    """A fresh adapter whose step 0 predicts exactly the per-dimension mean baseline, for
    every kind (adapters.start_output: out_proj 0, bias = the mean in the space the kind
    predicts, a token-aligned skip 0), or the linear `skip` map when given; training then
    improves on it instead of first having to find it. Vision kinds get the project's
    frozen vision_proj, which the export writes as it is."""
    from gguf_trainer.model.adapters import build_adapter, set_vision_proj, start_output

    torch.manual_seed(seed)
    model = build_adapter(cfg)
    if standardized is None:
        standardized = pack.standardized
    start_output(model, torch.zeros_like(stats.mu) if standardized else stats.mu, skip)
    if vision_proj is not None:
        set_vision_proj(model, vision_proj)
    if seed_table is not None:  # a slot kind: the teacher's frozen PCA seed (slot_resampler.py)
        from gguf_trainer.model.slot_resampler import set_seed_table

        set_seed_table(model, seed_table)
    if getattr(model, "out_bank", None) is not None:  # the bridge's FLUX.3 bank: its mean too
        from gguf_trainer.data.bank_rows import start_bank

        start_bank(model)
    return model


def train_step(
    model,
    opt,
    params: list,
    batch: Batch,
    stats: Stats,
    standardized: bool,
    cos_weight: float,
    grad_clip: float,
    autocast,
    ranks=None,
    recipe: Recipe | None = None,
    scales=None,
    n_taps: int = 1,
    bank_stats: Stats | None = None,
) -> tuple[torch.Tensor, dict]:
    """One optimisation step: forward and loss -> backward -> clip -> step. A non-finite loss
    returns before anything is updated (the caller stops the run). With `ranks`
    (distributed.TrainRanks) `batch` is this rank's slice of the global batch: the loss and
    the gradients are those of the global batch on every rank. `bank_stats`: the Qwen3.5
    bridge's FLUX.3 bank head is trained too, its loss added (data/bank_rows.py)."""
    fit = None if recipe is None else RowFit.for_batch(batch, recipe, scales, n_taps)
    with autocast:
        pred = forward_rows(model, batch)  # the rows the loss reads, nothing else
    loss, parts = compute_loss(pred.float(), batch, stats, standardized, cos_weight, fit)
    bank = None
    if bank_stats is not None and batch.bank is not None:
        with autocast:
            bank, bank_parts = bank_loss(model, batch, bank_stats, cos_weight)
        loss, parts = loss + bank, {**parts, **bank_parts}
    shown = loss
    if ranks is not None:
        n_rows = None if fit is None else fit.weight_sum
        loss, parts, shown = ranks.share_loss(loss, parts, batch, cos_weight, n_rows, bank)
    if not math.isfinite(parts["mse"]) or not math.isfinite(parts["cos"]):
        return shown, parts
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if ranks is not None:
        ranks.sum_gradients(params)
    torch.nn.utils.clip_grad_norm_(params, grad_clip, foreach=True)
    opt.step()
    return shown, parts


def make_optimizer(params: list, lr: float, weight_decay: float, device: torch.device):
    return torch.optim.AdamW(
        params,
        lr=lr,
        betas=(0.9, 0.95),
        weight_decay=weight_decay,
        **hardware.adamw_options(device),
    )


def _enable_grad_checkpointing(model) -> None:
    from torch.utils.checkpoint import checkpoint

    for block in model.blocks:
        inner = block.forward
        block.forward = lambda *a, _f=inner, **k: checkpoint(_f, *a, use_reentrant=False, **k)


class _Snapshot:
    """A snapshot request file: validate and save last.pt now, keep training."""

    def __init__(self, path: Path):
        self.path = path

    def requested(self) -> bool:
        return self.path.exists()

    def done(self, step: int) -> None:
        self.path.unlink(missing_ok=True)
        log.info(
            "snapshot request: validated and saved last.pt at step %d; training continues", step
        )


def _resume(folder: Path, model, opt, steps: int) -> TrainProgress:
    if not checkpoint_path(folder, LAST).exists():
        return TrainProgress()
    ck = load_checkpoint(checkpoint_path(folder, LAST))
    try:
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        torch.set_rng_state(ck["rng"])
    except (RuntimeError, ValueError, TypeError, KeyError) as e:  # another geometry, or edited
        raise does_not_fit(ck, e) from None
    log.info(
        "resuming from last.pt at step %d (planned then %d, now %d)",
        ck["step"],
        ck["planned_steps"],
        steps,
    )
    return TrainProgress(ck["step"], StreamPos(**ck["stream"]), ck["best_val_cos"])


def run_train(project, report, train_fp: str, skip=None) -> str:
    """Train to `train.steps`; returns "done" or "stopped". `skip` is a token-aligned skip's
    start map (build_model); the stage never passes one (zero + mean measured better, README
    "Training and evaluation"): benchmarks/bench_skip_start.py passes the ridge fit."""
    from gguf_trainer.model.adapters import trainable_parameters

    s, pack, paths = project.settings.train, project.pack, project.paths
    device = distributed.rank_device(hardware.resolve_device(s.device))
    ranks = distributed.train_ranks(project)  # None when this process trains alone
    main = ranks is None or ranks.is_main  # validates, saves, writes metrics
    train_files, val_files = (
        shard_files(paths.shard_dir("train")),
        shard_files(paths.shard_dir("val")),
    )
    recipe = Recipe.from_settings(s, pack)
    cfg = pack.adapter_config(s, **dims(train_files[0]))  # the adapter's dims come from the shards
    n_taps = max(1, len(cfg.taps))
    stats, scales = recipe_stats(train_files, recipe, n_taps)
    bstats = bank_stats_for(cfg, train_files, s.sigma_floor)  # None without a bank
    fit_recipe = recipe if recipe.needs_classes or recipe.cosine != "row" else None
    proj = load_vision_proj(paths.vision_proj) if pack.vis_dim and cfg.vis_dim else None
    # A slot kind's frozen seed table (None for the others); a resume takes it from last.pt, so
    # the teacher's table (248320 x 4096 for the 9B) is read and its PCA taken only at step 0.
    resuming = checkpoint_path(paths.checkpoints, LAST).exists()
    table = None if resuming else pack.seed_table(project, cfg.seed_rank)
    model = build_model(pack, cfg, s.seed, stats, proj, skip, recipe.standardized,
                        seed_table=table).to(device)
    stats = _stats_to(stats, device)
    bstats = None if bstats is None else _stats_to(bstats, device)
    scales = None if scales is None else scales.to(device)
    log.info("train: recipe %s", recipe.describe())
    if hardware.use_grad_checkpointing(s.grad_checkpoint, device):
        _enable_grad_checkpointing(model)
    params = list(trainable_parameters(model))
    opt = make_optimizer(params, s.lr, s.weight_decay, device)
    folder = project_file.make_dir(paths.root, paths.checkpoints)  # a real folder inside
    prog = _resume(folder, model, opt, s.steps)
    distributed.resume_ranks(checkpoint_path(folder, LAST), ranks, prog.step)
    report.truncate_metrics(prog.step)
    steps = s.steps
    log.info(
        "train: %s adapter, %.1fM trainable params, %d train rows, %d dims floored at sigma %.3g, "
        "batch %d, %d steps, device %s",
        cfg.kind,
        sum(p.numel() for p in params) / 1e6,
        stats.n,
        stats.n_floored,
        s.sigma_floor,
        s.batch_size,
        steps,
        device,
    )
    stream = (
        ShardStream(train_files, s.seed, s.batch_size, pack.fixed_rows, prog.stream)
        if ranks is None
        else ranks.stream(train_files, s.seed, s.batch_size, pack.fixed_rows, prog.stream)
    )
    extra = lambda val=None: {
        "config": cfg.to_dict(),
        "mu": stats.mu.cpu(),
        "sigma_f": stats.sigma_f.cpu(),
        "planned_steps": steps,
        "train_fp": train_fp,
        "pack": pack.id,
        "mock": project.settings.precompute.mock_teacher,
        "standardized": recipe.standardized,
        "recipe": asdict(recipe),
        "val_cos": None if val is None else val["val_cos"],
        "val": None if val is None else finite(val),
        **({} if bstats is None else {"bank_mu": bstats.mu.cpu(),
                                      "bank_sigma_f": bstats.sigma_f.cpu()}),
    }
    snapshot = _Snapshot(paths.snapshot_request)
    kept = KeptSteps(paths, Schedule.from_settings(s))  # train.history: weights-only copies
    means = None  # dit_rows.SetMeans, read at the first validation
    autocast = hardware.autocast(device)
    t_last, step_last = time.monotonic(), prog.step
    report.progress(
        prog.step, steps, "steps", step=prog.step, steps=steps, best_val_cos=_val(prog.best_val_cos)
    )
    while prog.step < steps:
        lr = lr_at(prog.step, steps, s.warmup, s.lr)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = stream.next_batch().to(device)
        loss, parts = train_step(
            model,
            opt,
            params,
            batch,
            stats,
            recipe.standardized,
            s.cos_weight,
            s.grad_clip,
            autocast,
            ranks,
            fit_recipe,
            scales,
            n_taps,
            bstats,
        )
        if not torch.isfinite(loss):
            raise UserError(
                f"the loss became {float(loss.detach())} at step {prog.step + 1}; "
                "the run stopped and "
                "last.pt keeps the last good step. Lower train.lr and start again."
            )
        prog.step, prog.stream = prog.step + 1, stream.pos
        if prog.step % s.log_every == 0:
            rate = (prog.step - step_last) / max(time.monotonic() - t_last, 1e-9)
            t_last, step_last = time.monotonic(), prog.step
            report.metrics(
                prog.step,
                {
                    "loss": float(loss.detach()),
                    "mse": parts["mse"],
                    "cos": parts["cos"],
                    "lr": lr,
                    "steps_per_s": round(rate, 3),
                    **{k: parts[k] for k in ("bank_cos", "bank_mse") if k in parts},
                },
            )
            new = read_steps(paths)
            if new is not None and new != steps:
                log.info(
                    "planned steps changed: %d -> %d%s",
                    steps,
                    new,
                    " (finishing at this step)" if new <= prog.step else "",
                )
                steps = max(new, prog.step)
            report.progress(
                prog.step,
                steps,
                "steps",
                step=prog.step,
                steps=steps,
                loss=float(loss.detach()),
                lr=lr,
            )
        is_snapshot = snapshot.requested()
        is_stop = report.stop_requested()
        if ranks is not None:  # rank 0 decides for all ranks, at the same step
            is_stop, is_snapshot, steps = ranks.agree(is_stop, is_snapshot, steps)
        is_scheduled = prog.step % s.val_every == 0 or prog.step == steps
        is_kept = main and kept.is_due(prog.step, steps, is_stop or is_snapshot
                                       or prog.step == steps)
        val = None
        if (is_scheduled or is_snapshot or is_kept) and main:
            if means is None:  # the val row sets' means: the val shards never change in a run
                means = SetMeans.of(val_files, s.batch_size, pack.fixed_rows)
            val = validate(model, val_files, pack, stats, s.batch_size, device,
                           recipe.standardized, means, n_taps)
            if bstats is not None:  # both heads: best.pt picks by their mean cosine
                val.update(score_bank(model, iter_batches(val_files, s.batch_size,
                                                          pack.fixed_rows), bstats, device))
                val["val_cos"] = 0.5 * (val["val_cos"] + val["bank_cos"])
            # the centred cosine of the DiT's token (and pad) rows leads the chart and the
            # health line; val_cos (the pack's headline) stays best.pt's pick
            report.metrics(prog.step, {"val_cos": val["val_cos"], "val_rel_mse": val["rel_mse"],
                                       **{k: val[k] for k in ("val_cc_tokens", "val_cc_pads")
                                          if val[k] is not None},
                                       **{f"val_{k}": val[k] for k in ("bank_cos",
                                                                       "bank_baseline_cos")
                                          if k in val}})
            # Only scheduled validations pick best.pt: a snapshot leaves the run's result unchanged.
            if is_scheduled and val["val_cos"] > prog.best_val_cos:
                prog.best_val_cos = val["val_cos"]
                save_checkpoint(folder, BEST, model, opt, prog, extra(val))
            report.fields(val_cos=val["val_cos"], best_val_cos=prog.best_val_cos,
                          **{k: val[k] for k in LEAD_FIELDS})
        if prog.step % s.save_every == 0 or is_stop or is_snapshot or prog.step == steps:
            every_rank = ranks.rank_states(prog.stream) if ranks is not None else {}
            if main:
                save_checkpoint(folder, LAST, model, opt, prog, extra(val) | every_rank)
        if is_kept:  # after last.pt: a kept step never delays the resume point
            kept.keep(prog.step, steps, model, extra(val), prog.best_val_cos,
                      _keep_reason(is_stop, is_snapshot, prog.step == steps))
        if is_snapshot and main:
            snapshot.done(prog.step)
        if is_stop and prog.step < steps:
            log.info("stop requested: saved last.pt at step %d", prog.step)
            report.progress(prog.step, steps, "steps", step=prog.step, steps=steps)
            return "stopped"
    if main and not checkpoint_path(folder, BEST).exists():
        save_checkpoint(folder, BEST, model, opt, prog, extra())
    report.progress(prog.step, steps, "steps", step=prog.step, steps=steps)
    return "done"


def _keep_reason(is_stop: bool, is_snapshot: bool, is_final: bool) -> str:
    return "stop" if is_stop else "snapshot" if is_snapshot else "final" if is_final \
        else "schedule"


def _val(v: float):
    return None if v <= -1.0 else v


def _stats_to(stats: Stats, device) -> Stats:
    return Stats(stats.mu.to(device), stats.sigma.to(device), stats.sigma_f.to(device), stats.n)


def train_done(project) -> bool:
    """The train stage is done when last.json's step reached the planned steps in force."""
    side = read_side(project.paths.checkpoints, LAST)
    step = side.get("step", 0)
    return isinstance(step, int) and step >= project.settings.train.steps


def move_checkpoints_aside(paths) -> Path | None:
    """checkpoints/ -> checkpoints.stale-<time>/ (never deleted: hours of training). Only the
    tool's files move (paths.TOOL_FILES), as reset deletes only those: a folder that holds
    someone else's file stays, with that file, and the log names it. A checkpoints/ that is
    a link (or not a folder) is never followed: a sentence."""
    folder = paths.checkpoints
    reason = safe_delete.check_owned(folder, paths.root, "dir")
    if reason:
        raise UserError(
            f"{folder} {reason.removesuffix('; left alone')}, so the train stage "
            "cannot be redone there; move it away and start again."
        )
    if not folder.is_dir() or not any(folder.iterdir()):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest, n = paths.root / f"{STALE_PREFIX}{stamp}", 1
    while dest.exists() or dest.is_symlink():
        dest, n = paths.root / f"{STALE_PREFIX}{stamp}-{n}", n + 1
    tool = tool_files_in(CHECKPOINTS_DIR)
    foreign = safe_delete.foreign_file(folder, tool)
    if foreign is None:
        os.replace(folder, dest)
        return dest
    mine = safe_delete.tool_paths(folder, tool)
    for p in mine:
        target = dest / p.relative_to(folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(p, target)
    log.warning(
        "%s holds %s, which gguf-trainer did not write: it and the folder are kept, "
        "only the tool's checkpoints were moved aside.",
        folder,
        foreign,
    )
    return dest if mine else None


class TrainStage(Stage):
    name = "train"
    distributed = True  # train.processes ranks share each global batch
    own_ranks_only = True  # the other ranks take no part in its collectives
    manifest_first = True  # checkpoints resume: the manifest names the inputs from the first step

    def inputs(self, project, upstream, recorded):
        pack, t = project.pack, project.settings.train
        return {
            "precompute_train": upstream["precompute_train"],
            "precompute_val": upstream["precompute_val"],
            "kind": pack.adapter_kind,
            "out_dim": pack.out_dim,
            "num_queries": pack.num_queries,
            "seed_vocab": pack.seed_vocab,
            "vis_dim": pack.vis_dim,
            "width": t.width,
            "depth": t.depth,
            "lr": t.lr,
            "warmup": t.warmup,
            "weight_decay": t.weight_decay,
            "grad_clip": t.grad_clip,
            "cos_weight": t.cos_weight,
            "sigma_floor": t.sigma_floor,
            "batch_size": t.batch_size,
            "seed": t.seed,
            # only a recipe other than the one every project trained with before the recipe
            # keys enters the fingerprint, so such a project resumes on its checkpoints
            **recipe_inputs(Recipe.from_settings(t, pack), pack),
        }

    def folder(self, paths):
        return paths.checkpoints

    def recorded_fingerprints(self, project) -> set[str]:
        got = (recorded_fingerprint(project.paths.checkpoints, which) for which in (LAST, BEST))
        return {fp for fp in got if fp is not None}

    def check(self, project, run) -> None:
        """The device exists, the adapter these settings describe can be built (on the meta
        device: no memory) and its training state fits the device's memory — all before old
        checkpoints are moved aside."""
        from gguf_trainer.model.adapters import build_adapter, trainable_parameters

        s = project.settings.train
        device = hardware.resolve_device(s.device)
        cfg = project.pack.adapter_config(s, project.pack.in_dim)
        try:
            with torch.device("meta"):
                model = build_adapter(cfg)
        except (ValueError, RuntimeError) as e:
            raise UserError(
                f"the adapter settings (train.width {s.width}, train.depth {s.depth}) "
                f"do not make an adapter: {e}; fix them in project.json."
            ) from None
        n_params = sum(p.numel() for p in trainable_parameters(model))
        hardware.check_training_fits(
            n_params,
            device,
            hardware.read_hardware(device),
            f"train.width {s.width}, train.depth {s.depth}",
        )

    def is_done(self, project, run) -> bool:
        return train_done(project)

    def run(self, project, report, run) -> str:
        return run_train(project, report, run.fingerprint)

    def clear(self, paths) -> None:
        dest = move_checkpoints_aside(paths)
        if dest:
            log.info("moved the old checkpoints to %s", dest.name)
        paths.eval_json.unlink(missing_ok=True)


STAGE = TrainStage()
