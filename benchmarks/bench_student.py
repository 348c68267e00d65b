"""Student forward throughput: `load_student(...).hidden` vs a plain transformers Qwen3Model.

Both hold the same weights (the student is read back from an F32 GGUF written from the plain
model) and run the same right-padded batch under no_grad, interleaved in one run so drift hits
both alike. The figure is the median over pairs of student / plain tokens/s; ~1.0 means the
loader adds nothing after load (target >= 0.98). Times are never asserted.

Usage: python benchmarks/bench_student.py [--quick] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from gguf_trainer.model.student import load_student, pad_batch
from gguf_trainer.tiny import qwen_tokenizer_dir
from gguf_trainer.tiny.student import build_tiny_qwen3, write_student_gguf

# ---- settings
FULL = {
    "dims": {"hidden": 256, "layers": 4, "heads": 2, "kv_heads": 1, "intermediate": 768,
             "vocab": 8192},
    "batch": 4, "seq": 128, "burn_in": 3, "iters": 40,
}
QUICK = {
    "dims": {"hidden": 64, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 128,
             "vocab": 1024},
    "batch": 2, "seq": 32, "burn_in": 1, "iters": 5,
}
SEED = 0


def make_batch(batch: int, seq: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids: the first half of the batch full length, the rest 3/4 of it."""
    gen = torch.Generator().manual_seed(SEED)
    lengths = [seq if i < (batch + 1) // 2 else max(1, seq * 3 // 4) for i in range(batch)]
    rows = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    return pad_batch(rows, pad_id=0)  # pig_clip's PAD_ID is outside a tiny vocab


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_pairs(student, plain, ids, keep, burn_in: int, iters: int) -> dict[str, list[float]]:
    """Seconds per run of student.hidden and of the plain forward, interleaved (order
    alternating) so a burst of load on a shared machine hits both sides of a pair."""
    runs = {
        "student": lambda: student.hidden(ids, keep),
        "plain": lambda: plain(input_ids=ids, attention_mask=keep, use_cache=False),
    }
    spent: dict[str, list[float]] = {"student": [], "plain": []}
    with torch.no_grad():
        for _ in range(burn_in):
            for run in runs.values():
                run()
        for step in range(iters):
            for name in ("student", "plain") if step % 2 == 0 else ("plain", "student"):
                _sync(student.device)
                start = time.perf_counter()
                runs[name]()
                _sync(student.device)
                spent[name].append(time.perf_counter() - start)
    return spent


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a few seconds")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    device = torch.device(args.device)
    plain = build_tiny_qwen3(SEED, **settings["dims"])
    with tempfile.TemporaryDirectory() as tmp:
        path = write_student_gguf(plain, Path(tmp) / "student.gguf", dtype="F32")
        student = load_student(path, qwen_tokenizer_dir(), device=device)
    plain = plain.to(device=device, dtype=student.dtype)
    ids, keep = make_batch(settings["batch"], settings["seq"], settings["dims"]["vocab"])
    ids, keep = ids.to(device), keep.to(device)
    spent = time_pairs(student, plain, ids, keep, settings["burn_in"], settings["iters"])
    tokens = int(keep.sum())
    # median of per-pair ratios: robust to load bursts on a shared machine
    ratio = statistics.median(p / s for s, p in zip(spent["student"], spent["plain"], strict=True))
    result = {
        "bench": "student_forward", "device": str(device), "dtype": str(student.dtype),
        "quick": args.quick, "tokens_per_run": int(keep.sum()),
        "student_tokens_per_s": round(tokens / statistics.median(spent["student"]), 1),
        "plain_tokens_per_s": round(tokens / statistics.median(spent["plain"]), 1),
        "ratio": round(ratio, 4),
    }
    print(f"student {result['student_tokens_per_s']:.0f} tok/s, plain Qwen3Model "
          f"{result['plain_tokens_per_s']:.0f} tok/s, ratio {result['ratio']:.3f} (target >= 0.98)")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
