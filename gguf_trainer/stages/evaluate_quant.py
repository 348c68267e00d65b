"""A quantized export (export.dtype q8_0 or bf16) measured against the f16 file of the same
checkpoint on the val shards: the centred cosine of each against the teacher, the drop, the
cosine between the two files' rows and both sizes -> eval.json["quantized"].

The f16 file is written as the export writes it (model.export.engine_state, the same fold)
into a temporary folder and deleted afterwards: it is the reference the quantized file
is measured against, not an output. Must not: write anything in the project.

    record["quantized"] = compare_with_f16(project, gguf, ck, stats, device)
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from gguf_trainer.data.scoring import forward, score_batches
from gguf_trainer.data.shards import iter_batches, shard_files

log = logging.getLogger(__name__)


def file_dtype(gguf: Path) -> str:
    from gguf_trainer.model.adapter_file import read_adapter, weight_type

    return weight_type(read_adapter(gguf))


def compare_with_f16(project, gguf: Path, ck: dict, stats, device) -> dict | None:
    """None for an f16 file; else {"dtype", "bytes", "f16_bytes", "size_ratio",
    "cos_centered", "cos_centered_f16", "cos_centered_drop", "cos_to_f16"} over every val row
    (global weighting, data.metrics)."""
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
    quant = score_batches(iter_batches(val_files, batch_size, fixed), rows(model), stats, True,
                          device, ref_predict=rows(ref_model))
    ref = score_batches(iter_batches(val_files, batch_size, fixed), rows(ref_model), stats, True,
                        device)
    size = Path(gguf).stat().st_size
    out = {
        "dtype": dtype, "bytes": size, "f16_bytes": f16_bytes, "size_ratio": size / f16_bytes,
        "cos_centered": quant["cos_centered"], "cos_centered_f16": ref["cos_centered"],
        "cos_centered_drop": ref["cos_centered"] - quant["cos_centered"],
        "cos_to_f16": quant["roundtrip_cos"],
    }
    log.info("eval: %s against f16: centred cosine %.5f vs %.5f (drop %.2e), rows' cosine to "
             "f16 %.6f, %.1f MB vs %.1f MB (%.0f%%)", dtype, out["cos_centered"],
             out["cos_centered_f16"], out["cos_centered_drop"], out["cos_to_f16"], size / 1e6,
             f16_bytes / 1e6, 100 * out["size_ratio"])
    return out

