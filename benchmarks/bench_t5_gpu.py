"""T5-XXL teacher on a GPU: bf16 precompute throughput and memory, resident vs streamed.

Standalone (torch + transformers; accelerate when installed): builds a full-size
T5-XXL v1.1-shaped encoder (24 blocks, d_model 4096, d_ff 10240, 64 heads, 4.76B params)
with random bf16 weights on the card, no download. Then, over 256 synthetic prompts with a
prompt-like length mix (T5 ids + EOS, 4..120 slots), sorted by length and batched with right
padding + the attention mask as precompute does:

* gpu      weights resident: prompts/s and peak GPU memory;
* offload  weights in RAM, each module copied to the card only for its forward (accelerate's
           cpu_offload, the pipeline's code path; a plain-torch per-block streamer when accelerate
           is missing): prompts/s and peak GPU memory;
* the batched-vs-per-prompt difference in bf16: real rows of the trimmed batch against each
  prompt run alone over the full 120-slot window (max |Δ|, max |Δ| / max |ref|, min cosine).

Prints one JSON line at the end. Times are figures to read, never asserted. Runs in ~2-3 min
on an H200 (most of it building 9.5 GB of weights and streaming them in offload).

Usage: python benchmarks/bench_t5_gpu.py [--prompts 256] [--modes gpu,offload] [--quick]
(--quick: tiny dims on the CPU in fp32, to check the script itself.)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time

import torch

XXL = {
    "d_model": 4096,
    "d_kv": 64,
    "num_heads": 64,
    "d_ff": 10240,
    "num_layers": 24,
    "vocab_size": 32128,
    "feed_forward_proj": "gated-gelu",
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "dropout_rate": 0.0,
    "is_encoder_decoder": False,
    "use_cache": False,
    "tie_word_embeddings": False,
}
TINY = {
    **XXL,
    "d_model": 64,
    "d_kv": 16,
    "num_heads": 4,
    "d_ff": 128,
    "num_layers": 2,
    "vocab_size": 256,
}
WINDOW = 120
BATCH, TOKENS = 64, 12288  # precompute's small-card budgets (teacher batch, teacher tokens)
SEED = 0


def prompt_windows(n: int, vocab: int, rng: random.Random) -> list[list[int]]:
    """T5 windows with a heavy-tailed length mix like real prompts (median ~30 slots, some cut)."""
    out = []
    for _ in range(n):
        n_pieces = min(WINDOW - 1, max(3, int(rng.lognormvariate(math.log(28), 0.6))))
        ids = [rng.randrange(3, min(vocab, 32000)) for _ in range(n_pieces)] + [1]
        out.append(ids + [0] * (WINDOW - len(ids)))
    return out


def real_len(window: list[int]) -> int:
    return sum(1 for i in window if i)


def batches(lengths: list[int]) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out, cur = [], []
    for i in order:
        if cur and (len(cur) + 1 > BATCH or (len(cur) + 1) * lengths[i] > TOKENS):
            out.append(cur)
            cur = []
        cur.append(i)
    return out + ([cur] if cur else [])


def encode(model, windows: list[list[int]], device, trim: bool = True) -> list[torch.Tensor]:
    lens = [real_len(w) for w in windows]
    width = max(lens) if trim else WINDOW
    ids = torch.tensor([w[:width] for w in windows], device=device)
    mask = (
        torch.arange(width, device=device)[None] < torch.tensor(lens, device=device)[:, None]
    ).long()
    with torch.inference_mode():
        h = model(input_ids=ids, attention_mask=mask).last_hidden_state
    return [h[i, :n].float().cpu() for i, n in enumerate(lens)]


def build_model(dims: dict, device: torch.device, dtype: torch.dtype):
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(SEED)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):  # random init on the card: no 9.5 GB on the host
            model = T5EncoderModel(T5Config(**dims))
    finally:
        torch.set_default_dtype(previous)
    return model.eval().requires_grad_(False)


def stream_blocks(model, device: torch.device):
    """Plain-torch streaming when accelerate is missing: the embedding and final norm stay on
    the card; each block's weights are copied in from pinned RAM for its forward only."""
    model.shared.to(device)
    model.encoder.final_layer_norm.to(device)
    for block in model.encoder.block:
        host = {n: p.data.cpu().pin_memory() for n, p in block.named_parameters()}
        params = dict(block.named_parameters())
        for n, p in params.items():
            p.data = host[n]

        def load(mod, args, host=host, params=params):
            for n, p in params.items():
                p.data = host[n].to(device, non_blocking=True)

        def drop(mod, args, out, host=host, params=params):
            for n, p in params.items():
                p.data = host[n]

        block.register_forward_pre_hook(load)
        block.register_forward_hook(drop)
    return "plain-torch per-block streaming"


def place_offload(model, device: torch.device) -> str:
    model.to("cpu")
    if device.type == "cuda":
        torch.cuda.empty_cache()
    try:
        from accelerate import cpu_offload
    except ImportError:
        return stream_blocks(model, device)
    cpu_offload(model, execution_device=device)
    return "accelerate cpu_offload (per module)"


def run_mode(model, windows, device, label: str) -> dict:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    encode(model, windows[:2], device)  # warm-up (kernels, allocator)
    sync()
    t0 = time.perf_counter()
    rows = 0
    for batch in batches([real_len(w) for w in windows]):
        rows += sum(r.shape[0] for r in encode(model, [windows[i] for i in batch], device))
    sync()
    elapsed = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) / 1024**3 if device.type == "cuda" else 0.0
    result = {
        "prompts_per_s": round(len(windows) / elapsed, 2),
        "seconds": round(elapsed, 2),
        "peak_gpu_gib": round(peak, 3),
        "real_rows": rows,
        "how": label,
    }
    print(f"{label}: {result}", flush=True)
    return result


def batched_vs_single(model, windows, device) -> dict:
    sample = sorted(windows, key=real_len)[:: max(1, len(windows) // 16)][:16]
    batched = encode(model, sample, device)
    worst_abs, worst_rel, min_cos = 0.0, 0.0, 1.0
    for w, got in zip(sample, batched):
        ref = encode(model, [w], device, trim=False)[0]
        diff = (got - ref).abs().max().item()
        worst_abs = max(worst_abs, diff)
        worst_rel = max(worst_rel, diff / ref.abs().max().item())
        min_cos = min(min_cos, torch.nn.functional.cosine_similarity(got, ref, dim=-1).min().item())
    return {
        "max_abs": worst_abs,
        "max_rel": worst_rel,
        "min_row_cos": min_cos,
        "prompts": len(sample),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--modes", default="gpu,offload")
    ap.add_argument("--quick", action="store_true", help="tiny dims on the CPU (checks the script)")
    args = ap.parse_args(argv)
    quick = args.quick or not torch.cuda.is_available()
    device = torch.device("cpu" if quick else "cuda")
    dims, dtype = (TINY, torch.float32) if quick else (XXL, torch.bfloat16)
    windows = prompt_windows(args.prompts, dims["vocab_size"], random.Random(SEED))
    t0 = time.perf_counter()
    model = build_model(dims, device, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"built a T5 encoder of {n_params / 1e9:.3f}B params ({dtype}) on {device} in "
        f"{time.perf_counter() - t0:.1f}s; {args.prompts} prompts, mean "
        f"{sum(map(real_len, windows)) / len(windows):.1f} "
        "real slots",
        flush=True,
    )
    out = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "params": n_params,
        "prompts": args.prompts,
        "modes": {},
    }
    modes = args.modes.split(",")
    if "gpu" in modes:
        out["modes"]["gpu"] = run_mode(model, windows, device, "gpu (resident)")
        out["batched_vs_single"] = batched_vs_single(model, windows, device)
        print(
            f"batched vs per-prompt full window ({out['dtype']}): {out['batched_vs_single']}",
            flush=True,
        )
    if "offload" in modes and device.type == "cuda":
        how = place_offload(model, device)
        out["modes"]["offload"] = run_mode(model, windows, device, f"offload ({how})")
    if {"gpu", "offload"} <= set(out["modes"]):
        out["offload_slowdown"] = round(
            out["modes"]["gpu"]["prompts_per_s"] / out["modes"]["offload"]["prompts_per_s"], 1
        )
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
