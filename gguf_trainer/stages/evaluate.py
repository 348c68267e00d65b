"""Eval stage: the exported GGUF, read back the way the engine reads it, and the checkpoint
it came from, scored on the whole val set -> `<project>/eval.json`.

The metrics (gguf_trainer.data.metrics) use global weighting over all val rows. eval.json
leads with `lead` (data/dit_rows.py: the centred cosine of the rows the DiT reads, `tokens` and
`pads` apart, each centred on its own val mean, per length bucket and, for a stack, per tap),
then holds the pack's metrics of the GGUF, the same for the checkpoint (whose headline equals
best.json's `val_cos` for that step), `roundtrip_cos` (GGUF vs checkpoint), the
per-dimension mean baseline an adapter must beat, and says MOCK for mock runs.

    STAGE   the eval stage object (done when eval.json is newer than the exported GGUF, or
            records its size and sha256: a project moved without its files' times)
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from gguf_trainer.base import atomic, places
from gguf_trainer.base.jsonvals import finite
from gguf_trainer.base.paths import BEST, TINY_MARKER
from gguf_trainer.base.safe_delete import file_record
from gguf_trainer.data.checkpoints import checkpoint_path, load_checkpoint, model_from_checkpoint
from gguf_trainer.data.dit_rows import DitFigures, SetMeans
from gguf_trainer.data.lead import lead_line
from gguf_trainer.data.scoring import forward, raw_prediction, score_batches, score_taps
from gguf_trainer.data.shards import Stats, iter_batches, shard_files
from gguf_trainer.machine import hardware
from gguf_trainer.stages.evaluate_quant import compare_with_f16
from gguf_trainer.stages.stage_list import Stage

log = logging.getLogger(__name__)

MOCK_NOTE = "MOCK teacher: synthetic targets; a smoke test of the machinery, never a usable adapter"


def evaluate_gguf(project, gguf: Path, which: str = "best", device: str | torch.device = "cpu",
                  ck: dict | None = None) -> dict:
    """Score `gguf` and checkpoint `which` (or the already loaded `ck`) on the val shards."""
    from gguf_trainer.model.adapters import load_gguf

    pack = project.pack
    device = torch.device(device)
    ck = ck or load_checkpoint(checkpoint_path(project.paths.checkpoints, which))
    stats = Stats(ck["mu"].to(device), ck["sigma_f"].to(device), ck["sigma_f"].to(device), 0)
    ckpt_model = model_from_checkpoint(ck).to(device)
    gguf_model = load_gguf(gguf, device=device).eval()
    val_files = shard_files(project.paths.shard_dir("val"))
    batch_size = project.settings.train.batch_size
    fixed = pack.fixed_rows

    def ckpt_predict(b):
        # the space the checkpoint was trained in (its recipe), not the pack's default
        return raw_prediction(forward(ckpt_model, b).float(), stats, bool(ck.get("standardized")))

    def gguf_predict(b):
        return forward(gguf_model, b).float()

    res_ckpt = score_batches(
        iter_batches(val_files, batch_size, fixed),
        ckpt_predict,
        stats,
        pack.centered,
        device,
        ref_predict=gguf_predict,
    )
    # the lead figures: the centred cosine of the rows the DiT reads, tokens and pads apart,
    # each centred on its own val mean (data/dit_rows.py), per length bucket and tap
    taps = gguf_model.config.taps or ()
    lead = DitFigures(stats.mu, SetMeans.of(val_files, batch_size, fixed), max(1, len(taps)),
                      taps)
    res_gguf = score_batches(
        iter_batches(val_files, batch_size, fixed), gguf_predict, stats, pack.centered, device,
        also=(lead,),
    )
    baseline = {k: v for k, v in res_gguf.items() if k.startswith("baseline_")}
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith("baseline_")}
    record = {
        "pack": pack.id,
        "kind": pack.adapter_kind,
        # where the GGUF is, as exports.json records it (relative inside the project: a moved
        # project's eval never names the old folder), and what it was (EvalStage.is_done)
        "gguf": places.record_key(gguf, project.dir.resolve()),
        **{f"gguf_{k}": v for k, v in file_record(gguf).items()},
        "checkpoint": which,
        "trained_steps": int(ck["step"]),
        "planned_steps": int(ck["planned_steps"]),
        "lead": lead.result(),
        "headline": pack.headline,
        "val_cos": res_gguf[pack.headline],
        "metrics": strip(res_gguf),
        "checkpoint_metrics": {**strip(res_ckpt), "val_cos": res_ckpt[pack.headline]},
        "roundtrip_cos": res_ckpt["roundtrip_cos"],
        "baseline": baseline,
        "beats_baseline": res_gguf[pack.headline] > baseline.get(f"baseline_{pack.headline}", -1.0),
        "mock": bool(ck.get("mock")),
        # the recipe the checkpoint trained with (a checkpoint from before the recipe keys
        # names only its target space)
        "recipe": ck.get("recipe") or {
            "target_space": "standardized" if ck.get("standardized") else "raw"},
        "time": time.time(),
    }
    if gguf_model.config.taps:  # layerwise: each tap's figures beside the whole stack's
        record["per_tap"] = score_taps(
            iter_batches(val_files, batch_size, fixed),
            gguf_predict,
            stats,
            gguf_model.config.taps,
            device,
        )
    if ck.get("bank_mu") is not None and gguf_model.config.n_bank:  # the bridge's FLUX.3 bank
        from gguf_trainer.data.bank_rows import BankStats, score_bank

        bank = BankStats(ck["bank_mu"].to(device), ck["bank_sigma_f"].to(device),
                         ck["bank_sigma_f"].to(device), 0)
        record["bank"] = score_bank(gguf_model, iter_batches(val_files, batch_size, fixed), bank,
                                    device, standardized=False)
    # export.dtype q8_0 / bf16: the file against the f16 one of the same checkpoint
    record["quantized"] = compare_with_f16(project, gguf, ck, stats, device)
    if record["mock"]:
        record["note"] = MOCK_NOTE
    else:  # real teacher: healthy / weak / broken against the pack's reference figures
        record["health"] = pack.health_line(
            {**record["metrics"], "trained_steps": record["trained_steps"]}, record["lead"]
        )
        teacher = project.material_path("teacher")
        if record["health"] and teacher is not None and (teacher / TINY_MARKER).exists():
            record["health"] = (
                "n/a: a tiny demo teacher; the reference figures are for the real teacher"
            )
        if pack.reference:
            # the recipe's published run, to compare with
            record["reference"] = dict(pack.reference)
    return record


def run_eval(project, report) -> None:
    record = evaluate_gguf(
        project, project.final_gguf, BEST, hardware.resolve_device(project.settings.train.device)
    )
    atomic.write_json(project.paths.eval_json, finite(record))
    lead = lead_line(record["lead"])
    if lead:
        log.info("eval: %s", lead)
    log.info(
        "eval: %s %.4f (checkpoint %.4f, roundtrip %.6f, mean baseline %s)%s",
        record["headline"],
        record["val_cos"],
        record["checkpoint_metrics"]["val_cos"],
        record["roundtrip_cos"],
        record["baseline"].get(f"baseline_{record['headline']}"),
        " [MOCK]" if record["mock"] else "",
    )
    if record.get("per_tap"):
        log.info("eval: %s", format_taps(record["per_tap"]))
    if record.get("health"):
        log.info("eval: health %s", record["health"])
    report.progress(1, 1, "files", val_cos=record["val_cos"])


def format_taps(per_tap: dict) -> str:
    """One line: each tap's cosine against its mean baseline, in stack order."""

    def f(x):
        return "n/a" if x is None else f"{x:.4f}"

    return "per tap cos (mean baseline): " + ", ".join(
        f"L{t} {f(c)} ({f(b)})"
        for t, c, b in zip(per_tap["taps"], per_tap["cos"], per_tap["baseline_cos"])
    )


class EvalStage(Stage):
    name = "eval"

    def skipped_because(self, project) -> str | None:
        return None if project.settings.export.run_eval else "export.run_eval is off"

    def is_done(self, project, run) -> bool:
        """eval.json scores the GGUF that is there: written after it, or (a project moved or
        copied without its files' times) recording its very size and sha256."""
        gguf, ev = project.final_gguf, project.paths.eval_json
        if not (ev.is_file() and gguf.is_file()):
            return False
        if ev.stat().st_mtime_ns >= gguf.stat().st_mtime_ns:
            return True
        try:
            rec = atomic.read_json(ev, inside=project.paths.root)
        except (ValueError, OSError):
            return False
        if not isinstance(rec, dict) or rec.get("gguf_size") != gguf.stat().st_size:
            return False
        return rec.get("gguf_sha256") == file_record(gguf)["sha256"]

    def run(self, project, report, run) -> str:
        run_eval(project, report)
        return "done"

    def clear(self, paths) -> None:
        paths.eval_json.unlink(missing_ok=True)


STAGE = EvalStage()
