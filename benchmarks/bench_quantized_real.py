"""export.dtype on a real pretrained model's activations: each kind's shipped recipe trained
by bench_recipe_real (SmolLM2-135M-Instruct's states, the product's adapter, step and
statistics), then exported by the product's export in f16, q8_0 and bf16 and each file read
back the way ggk 0.9.7 runs it: load_gguf's dequantized weights, and for a Q8_0 Linear its
input rounded to Q8_0 blocks as ggml's Q8_0 dot product rounds it (the engine tier,
tests/engine/test_quantized_engine.py, holds that reading to the engine's output at 3e-7).

    python benchmarks/bench_quantized_real.py [--quick] [--kinds K ...] [--json FILE]

Printed per kind, length bucket and row set the DiT reads: the centred cosine of each file
(the tap mean for a stack), the drop against f16, and each file's size as a ratio of f16's,
measured side by side in one run; then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_recipe_real as recipe_bench

DTYPES = ("f16", "q8_0", "bf16")
DEFAULT_KINDS = ("token_aligned_norm", "layerwise")


def q8_rounded(x: torch.Tensor) -> torch.Tensor:
    """x as ggml's Q8_0 dot product reads it: Q8_0 blocks of 32 along the input width."""
    import gguf

    q8 = gguf.GGMLQuantizationType.Q8_0
    a = x.detach().float().contiguous().numpy()
    return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(a, q8), q8)
                            .reshape(a.shape))


def engine_reading(path: Path):
    """The file as ggk runs it: dequantized weights, Q8_0 Linears fed Q8_0-rounded inputs."""
    from gguf_trainer.model.adapter_file import read_adapter
    from gguf_trainer.model.adapters import load_gguf

    model = load_gguf(path)
    modules = dict(model.named_modules())
    for name, (_, ty) in read_adapter(path).tensors.items():
        if ty == "q8_0":
            linear = modules[name.removeprefix("adapter.").removesuffix(".weight")]
            linear.register_forward_pre_hook(lambda m, args: (q8_rounded(args[0]), *args[1:]))
    return model


def measure(kind: str, quick: bool, data: dict) -> list[dict]:
    from gguf_trainer.model.export import write_adapter_gguf

    recipe = dict(recipe_bench.options(kind))["shipped"]
    train_set, val_set = recipe_bench.samples_of(data, kind, quick)
    taps = recipe_bench.KINDS[kind]["taps"]
    steps = recipe_bench.SIZES["quick" if quick else "full"][4]
    model, cfg, stats = recipe_bench.train(kind, recipe, train_set, steps)
    means = recipe_bench.set_means(train_set, len(taps))
    fold = {"mu": stats.mu, "sigma_f": stats.sigma_f} if recipe.standardized else {}
    raw = replace(recipe, target_space="raw")  # a GGUF predicts teacher-scale rows
    figs, sizes = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        for dtype in DTYPES:
            path = Path(folder) / f"adapter-{dtype}.gguf"
            write_adapter_gguf(path, model.state_dict(), cfg, metadata={}, dtype=dtype, **fold)
            sizes[dtype] = path.stat().st_size
            figs[dtype], _ = recipe_bench.judge(engine_reading(path), raw, stats, val_set, means,
                                                taps)
    out = []
    for key in sorted(figs["f16"], key=str):
        bucket, rows, tap = key
        if len(taps) > 1 and tap != "mean":
            continue
        ref = figs["f16"][key]["centred_cos"]
        rec = {"kind": kind, "prompts": bucket, "rows": rows, "tap": tap, "f16": ref}
        for dtype in DTYPES[1:]:
            rec[dtype] = figs[dtype][key]["centred_cos"]
            rec[f"{dtype}_drop"] = ref - rec[dtype]
            rec[f"{dtype}_size_ratio"] = sizes[dtype] / sizes["f16"]
        out.append(rec)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="bench_recipe_real's quick sizes")
    ap.add_argument("--kinds", nargs="*", default=list(DEFAULT_KINDS))
    ap.add_argument("--json", help="write the figures as one JSON array")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.time()
    data = recipe_bench.load_all(a.quick, a.kinds, log=lambda _: None)
    records = [r for kind in a.kinds for r in measure(kind, a.quick, data)]
    print("| kind | prompts | rows | f16 cc | q8_0 cc (drop) | bf16 cc (drop) | q8_0 / f16 size |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in records:
        print(f"| {r['kind']} | {r['prompts']} | {r['rows']} | {r['f16']:.5f} | "
              f"{r['q8_0']:.5f} ({r['q8_0_drop']:+.1e}) | {r['bf16']:.5f} "
              f"({r['bf16_drop']:+.1e}) | {r['q8_0_size_ratio']:.3f} |")
    print(f"SmolLM2-135M-Instruct activations, {time.time() - t0:.0f} s")
    print(json.dumps({"bench": "quantized_real", "records": records}))
    if a.json:
        Path(a.json).write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
