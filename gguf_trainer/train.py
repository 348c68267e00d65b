"""Train stage: the adapter on the precomputed shards, with exact resume.

Read `run_train` top to bottom: setup (device, threads, stats, model, optimizer, stream,
resume), then the loop: LR -> forward and loss -> backward -> clip -> step -> report ->
validate -> checkpoint -> control files -> end test. Helpers are pure functions above it.

Resume state (`last.pt`): model, optimizer, step, stream position, RNG, best score. On
resume the checkpoint wins for all of them; `train.steps` comes from project.json (the
count in force), so raising it after the end continues the run (warm restart of the lr).
On CPU with the pinned thread count a resumed run is bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from . import atomic
from .errors import UserError
from .metrics import RowMetrics, masked_rows
from .project import read_steps
from .shards import Batch, ShardStream, Stats, StreamPos, iter_batches, load_stats, shard_files, student_dim

log = logging.getLogger(__name__)

LAST, BEST = "last", "best"


def lr_at(step: int, steps: int, warmup: int, lr: float) -> float:
    """Linear warmup, then cosine down to 10% of lr over the steps in force."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = min((step - warmup) / max(1, steps - warmup), 1.0)
    return lr * (0.1 + 0.45 * (1.0 + math.cos(math.pi * t)))


def forward(model, batch: Batch) -> torch.Tensor:
    return model(batch.hidden, mask=batch.mask, seed_ids=batch.seed_ids)


def compute_loss(pred, batch: Batch, stats: Stats, standardized: bool, cos_weight: float):
    """Whitened MSE + cos_weight·(1 − cos) over the supervised rows.

    standardized kinds predict (t−μ)/σ_f; the others predict raw rows and the error is
    whitened by the same σ_f. Either way the MSE term is ((pred_raw − t)/σ_f)².
    """
    m = batch.row_mask
    t = (batch.target - stats.mu) / stats.sigma_f if standardized else batch.target
    err = (pred - t) if standardized else (pred - t) / stats.sigma_f
    n_rows = m.sum().clamp_min(1)
    mse = (err.pow(2).sum(-1) * m).sum() / (n_rows * pred.shape[-1])
    cos = (torch.nn.functional.cosine_similarity(pred, t, dim=-1, eps=1e-8) * m).sum() / n_rows
    return mse + cos_weight * (1.0 - cos), {"mse": float(mse.detach()), "cos": float(cos.detach())}


def raw_prediction(pred, stats: Stats, standardized: bool) -> torch.Tensor:
    return pred * stats.sigma_f + stats.mu if standardized else pred


def row_tags(batch: Batch) -> dict[str, torch.Tensor]:
    """Per-row tags of a batch, flattened like `masked_rows(.., batch.row_mask)`."""
    m = batch.row_mask
    tags = {}
    if batch.seed_ids is not None:  # the EOS slot is the last real slot of each sample
        last = m.sum(1) - 1
        tags["eos"] = torch.arange(m.shape[1], device=m.device)[None, :] == last[:, None]
    if batch.sup_start is not None:  # rows the DiT consumes
        tags["slice"] = torch.arange(m.shape[1], device=m.device)[None, :] >= batch.sup_start[:, None]
    return {k: masked_rows(v.unsqueeze(-1).float(), m).squeeze(-1).bool() for k, v in tags.items()}


def score_batches(batches, predict, stats: Stats, centered: bool, device, ref_predict=None) -> dict:
    """RowMetrics over every batch (global weighting). `predict(batch) -> raw rows [B, R, D]`."""
    metrics = RowMetrics(mu=stats.mu.to(device).double(), centered=centered)
    offset = 0
    for batch in batches:
        batch = batch.to(device)
        with torch.no_grad():
            pred = predict(batch)
            ref = None if ref_predict is None else masked_rows(ref_predict(batch), batch.row_mask)
        m = batch.row_mask
        sample_ids = (torch.arange(m.shape[0], device=device)[:, None] + offset).expand_as(m)[m]
        metrics.update(masked_rows(pred, m), masked_rows(batch.target, m), sample_ids,
                       tags=row_tags(batch), ref=ref)
        offset += m.shape[0]
    return metrics.result()


def validate(model, val_files, pack, stats: Stats, batch_size: int, device) -> dict:
    model.eval()
    try:
        predict = lambda b: raw_prediction(forward(model, b).float(), stats, pack.standardized)  # noqa: E731
        res = score_batches(iter_batches(val_files, batch_size, pack.fixed_rows),
                            predict, stats, pack.centered, device)
    finally:
        model.train()
    res["val_cos"] = res[pack.headline]
    return res


@dataclass
class TrainProgress:
    """Everything a resume restores. The checkpoint wins for each field."""

    step: int = 0
    stream: StreamPos = None  # type: ignore[assignment]
    best_val_cos: float = -1.0

    def __post_init__(self):
        self.stream = self.stream or StreamPos()


def checkpoint_path(folder: Path, which: str) -> Path:
    return folder / f"{which}.pt"


def save_checkpoint(folder: Path, which: str, model, opt, prog: TrainProgress, extra: dict) -> None:
    state = {
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": opt.state_dict(), "step": prog.step, "stream": prog.stream.as_dict(),
        "best_val_cos": prog.best_val_cos, "rng": torch.get_rng_state(), **extra,
    }
    with atomic.atomic_path(checkpoint_path(folder, which), suffix=".pt") as tmp:
        torch.save(state, tmp)
    side = {"step": prog.step, "steps": extra["planned_steps"], "val_cos": extra.get("val_cos"),
            "best_val_cos": prog.best_val_cos, "time": time.time(), "mock": extra.get("mock", False)}
    atomic.write_json(folder / f"{which}.json", _finite(side))


def load_checkpoint(path: Path) -> dict:
    """Checkpoints hold only tensors and plain values: loaded with weights_only=True."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError) as e:  # a truncated or foreign file
        raise UserError(f"{path} is damaged ({type(e).__name__}); delete it to restart training "
                        "from the other checkpoint or from scratch.") from None


def _finite(d: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def build_model(pack, cfg, seed: int, stats: Stats, vision_proj=None):
    """A fresh adapter. Kinds trained on raw targets start with out_proj = (0, train mean),
    so step 0 predicts exactly the per-dimension mean baseline and training improves on it
    instead of first having to find it (standardized kinds already start near 0 = the mean)."""
    from .adapters import build_adapter, set_vision_proj

    torch.manual_seed(seed)
    model = build_adapter(cfg)
    if not pack.standardized:
        with torch.no_grad():
            model.out_proj.weight.zero_()
            model.out_proj.bias.copy_(stats.mu)
    if vision_proj is not None:
        set_vision_proj(model, vision_proj)
    return model


def model_from_checkpoint(ckpt: dict):
    from .adapters import AdapterConfig, build_adapter

    model = build_adapter(AdapterConfig.from_dict(ckpt["config"]))
    model.load_state_dict(ckpt["model"])
    return model.eval()


def _use_grad_checkpointing(setting: str, device: torch.device) -> bool:
    if setting == "auto":
        return device.type == "cuda" and torch.cuda.get_device_properties(device).total_memory < 12e9
    return setting == "on"


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
        log.info("snapshot request: validated and saved last.pt at step %d; training continues", step)


def run_train(project, report, train_fp: str) -> str:
    """Train to `train.steps`; returns "done" or "stopped"."""
    from .adapters import trainable_parameters
    from .precompute import resolve_device

    s, pack, paths = project.settings.train, project.pack, project.paths
    device = resolve_device(s.device)
    train_files, val_files = shard_files(paths.shard_dir("train")), shard_files(paths.shard_dir("val"))
    stats = load_stats(train_files, s.sigma_floor)
    in_dim = student_dim(train_files[0])
    cfg = pack.adapter_config(s, in_dim)
    model = build_model(pack, cfg, s.seed, stats).to(device)
    stats = _stats_to(stats, device)
    if _use_grad_checkpointing(s.grad_checkpoint, device):
        _enable_grad_checkpointing(model)
    opt = torch.optim.AdamW(trainable_parameters(model), lr=s.lr, betas=(0.9, 0.95), weight_decay=s.weight_decay)
    folder = paths.checkpoints
    folder.mkdir(parents=True, exist_ok=True)
    prog = TrainProgress()
    if checkpoint_path(folder, LAST).exists():
        ck = load_checkpoint(checkpoint_path(folder, LAST))
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        torch.set_rng_state(ck["rng"])
        prog = TrainProgress(ck["step"], StreamPos(**ck["stream"]), ck["best_val_cos"])
        log.info("resuming from last.pt at step %d (planned then %d, now %d)", prog.step, ck["planned_steps"], s.steps)
    report.truncate_metrics(prog.step)
    steps = s.steps
    n_params = sum(p.numel() for p in trainable_parameters(model))
    log.info("train: %s adapter, %.1fM trainable params, %d train rows, %d dims floored at sigma %.3g, "
             "batch %d, %d steps, device %s", cfg.kind, n_params / 1e6, stats.n, stats.n_floored,
             s.sigma_floor, s.batch_size, steps, device)
    stream = ShardStream(train_files, s.seed, s.batch_size, pack.fixed_rows, prog.stream)
    extra = lambda val=None: {  # noqa: E731
        "config": cfg.to_dict(), "mu": stats.mu, "sigma_f": stats.sigma_f, "planned_steps": steps,
        "train_fp": train_fp, "pack": pack.id, "mock": project.settings.precompute.mock_teacher,
        "standardized": pack.standardized, "val_cos": None if val is None else val["val_cos"],
        "val": None if val is None else _finite(val)}
    snapshot = _Snapshot(paths.snapshot_request)
    autocast = torch.autocast("cuda", torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    t_last, step_last = time.monotonic(), prog.step
    report.progress(prog.step, steps, "steps", step=prog.step, steps=steps, best_val_cos=_val(prog.best_val_cos))
    while prog.step < steps:
        lr = lr_at(prog.step, steps, s.warmup, s.lr)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = stream.next_batch().to(device)
        with autocast:
            pred = forward(model, batch)
        loss, parts = compute_loss(pred.float(), batch, stats, pack.standardized, s.cos_weight)
        if not torch.isfinite(loss):
            raise UserError(f"the loss became {float(loss.detach())} at step {prog.step + 1}; the run stopped and "
                            "last.pt keeps the last good step. Lower train.lr and start again.")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable_parameters(model), s.grad_clip)
        opt.step()
        prog.step, prog.stream = prog.step + 1, stream.pos
        if prog.step % s.log_every == 0:
            rate = (prog.step - step_last) / max(time.monotonic() - t_last, 1e-9)
            t_last, step_last = time.monotonic(), prog.step
            report.metrics(prog.step, {"loss": float(loss.detach()), "mse": parts["mse"], "cos": parts["cos"],
                                       "lr": lr, "steps_per_s": round(rate, 3)})
            new = read_steps(paths)
            if new is not None and new != steps:
                log.info("planned steps changed: %d -> %d%s", steps, new,
                         " (finishing at this step)" if new <= prog.step else "")
                steps = max(new, prog.step)
            report.progress(prog.step, steps, "steps", step=prog.step, steps=steps, loss=float(loss.detach()), lr=lr)
        is_snapshot = snapshot.requested()
        is_scheduled = prog.step % s.val_every == 0 or prog.step == steps
        val = None
        if is_scheduled or is_snapshot:
            val = validate(model, val_files, pack, stats, s.batch_size, device)
            report.metrics(prog.step, {"val_cos": val["val_cos"], "val_rel_mse": val["rel_mse"]})
            # Only scheduled validations pick best.pt: a snapshot leaves the run's result unchanged.
            if is_scheduled and val["val_cos"] > prog.best_val_cos:
                prog.best_val_cos = val["val_cos"]
                save_checkpoint(folder, BEST, model, opt, prog, extra(val))
            report.fields(val_cos=val["val_cos"], best_val_cos=prog.best_val_cos)
        is_stop = report.stop_requested()
        if prog.step % s.save_every == 0 or is_stop or is_snapshot or prog.step == steps:
            save_checkpoint(folder, LAST, model, opt, prog, extra(val))
        if is_snapshot:
            snapshot.done(prog.step)
        if is_stop and prog.step < steps:
            log.info("stop requested: saved last.pt at step %d", prog.step)
            report.progress(prog.step, steps, "steps", step=prog.step, steps=steps)
            return "stopped"
    if not checkpoint_path(folder, BEST).exists():
        save_checkpoint(folder, BEST, model, opt, prog, extra())
    report.progress(prog.step, steps, "steps", step=prog.step, steps=steps)
    return "done"


def _val(v: float):
    return None if v <= -1.0 else v


def _stats_to(stats: Stats, device) -> Stats:
    return Stats(stats.mu.to(device), stats.sigma.to(device), stats.sigma_f.to(device), stats.n)


def train_done(project) -> bool:
    """The train stage is done when last.json's step reached the planned steps in force."""
    side = atomic.read_json(project.paths.checkpoints / "last.json", {}) or {}
    return bool(side) and side.get("step", 0) >= project.settings.train.steps
