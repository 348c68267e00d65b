"""A quantized export (export.dtype q8_0 or bf16) measured against the f16 file of the same
checkpoint on the val shards: the centred cosine of each against the teacher over the rows the
DiT reads (data/dit_rows.py: `tokens`, and `pads` where the family pads, each centred on its
own val mean — a mean over all rows, the attention-sink row among them, would score every
ordinary row ~0.999 whatever the file), the drop, the cosine between the two files' rows and
both sizes -> eval.json["quantized"].

The f16 file is written as the export writes it (model.export.engine_state, the same fold)
into a temporary folder and deleted afterwards: it is the reference the quantized file
is measured against, not an output. Must not: write anything in the project.

    record["quantized"] = compare_with_f16(project, gguf, ck, stats, device)
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from gguf_trainer.data.dit_rows import DitFigures, SetMeans
from gguf_trainer.data.lead import CENTRED_ON, lead_value
from gguf_trainer.data.scoring import forward, score_batches
from gguf_trainer.data.shards import iter_batches, shard_files

log = logging.getLogger(__name__)


def file_dtype(gguf: Path) -> str:
    from gguf_trainer.model.adapter_file import read_adapter, weight_type

    return weight_type(read_adapter(gguf))


def compare_with_f16(project, gguf: Path, ck: dict, stats, device) -> dict | None:
    """None for an f16 file; else {"dtype", "bytes", "f16_bytes", "size_ratio",
    "cos_centered", "cos_centered_f16", "cos_centered_drop", "cos_to_f16", "centred_on"}: the
    `tokens` lead figure (data/dit_rows.py) of each file, their drop and the mean cosine of
    the two files' rows over every val row; for a family that pads, "pads_cos_centered",
    "pads_cos_centered_f16" and "pads_cos_centered_drop" beside them."""
    from gguf_trainer.model.adapters import AdapterConfig, load_gguf
    from gguf_trainer.model.export import engine_state, write_adapter_gguf

    dtype = file_dtype(gguf)
    if dtype not in ("q8_0", "bf16"):
        return None
    cfg = AdapterConfig.from_dict(ck["config"])
    state, cfg, _ = engine_state(ck["model"], cfg, project.settings.train.seed_rank)
    fold = {"mu": ck["mu"], "sigma_f": ck["sigma_f"]} if ck.get("standardized") and not \
        ck.get("folded") else {}
    val_files = shard_files(project.paths.shard_dir("val"))
    batch_size, fixed = project.settings.train.batch_size, project.pack.fixed_rows
    with tempfile.TemporaryDirectory(prefix="gguf-trainer-f16-") as folder:
        ref_path = Path(folder) / "reference-f16.gguf"
        write_adapter_gguf(ref_path, state, cfg, metadata={}, dtype="f16", **fold)
        f16_bytes = ref_path.stat().st_size
        ref_model = load_gguf(ref_path, device=device).eval()
    model = load_gguf(gguf, device=device).eval()
    rows = lambda m: lambda b: forward(m, b).float()
    # each row set centred on its own val mean, per tap for a stack (as eval's lead)
    means, taps = SetMeans.of(val_files, batch_size, fixed), model.config.taps or ()
    lead = {name: DitFigures(stats.mu, means, max(1, len(taps)), taps) for name in ("q", "f16")}
    quant = score_batches(iter_batches(val_files, batch_size, fixed), rows(model), stats, True,
                          device, ref_predict=rows(ref_model), also=(lead["q"],))
    score_batches(iter_batches(val_files, batch_size, fixed), rows(ref_model), stats, True,
                  device, also=(lead["f16"],))
    q, f = lead["q"].result(), lead["f16"].result()
    size = Path(gguf).stat().st_size
    out = {"dtype": dtype, "bytes": size, "f16_bytes": f16_bytes, "size_ratio": size / f16_bytes,
           "centred_on": CENTRED_ON}
    for name, prefix in (("tokens", ""), ("pads", "pads_")):
        cq, cf = lead_value(q, name), lead_value(f, name)
        if cq is None or cf is None:
            continue
        out.update({f"{prefix}cos_centered": cq, f"{prefix}cos_centered_f16": cf,
                    f"{prefix}cos_centered_drop": cf - cq})
    out["cos_to_f16"] = quant["roundtrip_cos"]
    figs = "; ".join(
        f"{name} centred cosine {out[p + 'cos_centered']:.5f} vs "
        f"{out[p + 'cos_centered_f16']:.5f} (drop {out[p + 'cos_centered_drop']:.2e})"
        for name, p in (("tokens", ""), ("pads", "pads_")) if p + "cos_centered" in out)
    log.info("eval: %s against f16: %s; rows' cosine to f16 %.6f, %.1f MB vs %.1f MB (%.0f%%)",
             dtype, figs, out["cos_to_f16"], size / 1e6, f16_bytes / 1e6,
             100 * out["size_ratio"])
    return out
