"""Qwen3-VL-4B teacher (MageFlow) on a GPU: precompute throughput and memory, resident vs streamed.

Builds a full-size Qwen3-VL-4B-Instruct-shaped model (text: 36 layers, hidden 2560, MLP 9728,
32/8 heads of 128, vocab 151936; vision: 24 blocks, hidden 1024, merger out 2560) with random
bf16 weights directly on the card, no download, and runs the pipeline's own teacher code
(gguf_trainer.teachers.qwen3vl: engine preprocessing, vision tower, text stack with the raw
merger rows spliced over the template's image pads, final norm) over a synthetic MageFlow mix:
single-image edit samples (384×384 -> 144 vision tokens, 320×224 -> 70) and text-only prompts
on the t2i template, batched by the big-card budgets as precompute batches them.

* gpu      everything resident: vision images/s, teacher samples/s, peak GPU memory;
* offload  the vision tower resident, the text stack streamed from RAM (accelerate
           cpu_offload, the pipeline's placement): samples/s and peak GPU memory;
* the offload rows against the resident rows on the same samples (min cosine: the two
  placements must compute the same thing).

Prints one JSON line at the end; times are figures to read, never asserted. About 2-4 min
on an H200 (most of it moving 8.9 GB of weights to RAM for offload). Needs the gguf_trainer
package importable (run from the repository root) with torch, transformers and accelerate.

Usage: python benchmarks/bench_qwen3vl_gpu.py [--samples 192] [--modes gpu,offload] [--quick]
(--quick: the tiny dims on the CPU in fp32, to check the script itself.)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TEXT_4B = {
    "vocab_size": 151936,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
    "tie_word_embeddings": True,
    "rope_theta": 5000000,
    "rope_scaling": {
        "rope_type": "default",
        "mrope_section": [24, 20, 20],
        "mrope_interleaved": True,
    },
}
VISION_4B = {
    "depth": 24,
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_heads": 16,
    "out_hidden_size": 2560,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [5, 11, 17],
    "hidden_act": "gelu_pytorch_tanh",
}
BUDGET = (256, 65536)  # big-card teacher batch / token budget (hardware.BIG_CARD_BUDGETS)
PROMPTS = (
    "make it night",
    "add a straw hat to the man",
    "change the background to a beach at dusk",
    "a red fox in the snow, oil painting, golden hour light, highly detailed",
    "replace the dog with a small bird",
    "restyle the image as a watercolor painting",
)


def build_model(config, device, dtype):
    """Qwen3VLModel with N(0, 0.02) weights (norms 1) made directly on `device`."""
    from transformers import Qwen3VLModel

    with torch.device("meta"):
        model = Qwen3VLModel(config)
    model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    model.to(dtype)
    # rebuilt after the cast: the rotary tables stay float32, as from_pretrained leaves them
    text, visual = model.language_model, model.visual
    text.rotary_emb = type(text.rotary_emb)(config=config.text_config).to(device)
    visual.rotary_pos_emb = type(visual.rotary_pos_emb)(config.vision_config).to(device)
    return model.eval().requires_grad_(False)


def make_samples(n: int, folder: Path, rng: random.Random):
    import numpy as np
    from PIL import Image

    from gguf_trainer.data.samples import Sample

    out = []
    for i in range(n):
        if i % 3 == 2:  # a third text-only, as in the reference mix
            out.append(Sample(rng.choice(PROMPTS)))
            continue
        h, w = (384, 384) if i % 2 else (224, 320)
        path = folder / f"img{i}.png"
        pixels = np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path)
        out.append(Sample(rng.choice(PROMPTS), (path,)))
    return out


def run_mode(teacher, samples, tokenizer, pack, sync) -> dict:
    from gguf_trainer.engine.qwen_bpe import engine_bpe
    from gguf_trainer.machine.hardware import budget_batches
    from gguf_trainer.model.vision import image_runs
    from gguf_trainer.teachers.base import VisionSegment

    sync()
    t0 = time.perf_counter()
    raw = [teacher.vision(list(s.images)) if s.images else [] for s in samples]
    sync()
    t_vis = time.perf_counter() - t0
    encode = engine_bpe(tokenizer).encode
    ids = [pack.student_ids(encode, s, [r.shape[0] for r in rows]) for s, rows in zip(samples, raw)]
    segs = [
        [VisionSegment(st, r) for (st, _), r in zip(image_runs(x, pack.image_pad_id), rows)]
        for x, rows in zip(ids, raw)
    ]
    out = [None] * len(samples)
    t0 = time.perf_counter()
    for batch in budget_batches([len(x) for x in ids], *BUDGET):
        rows = teacher.targets(
            [samples[i] for i in batch], [ids[i] for i in batch], [segs[i] for i in batch]
        )
        for i, r in zip(batch, rows):
            out[i] = r.rows
    sync()
    t_text = time.perf_counter() - t0
    n_img = sum(len(s.images) for s in samples)
    return {
        "rows": out,
        "vision_images_per_s": round(n_img / t_vis, 2),
        "text_samples_per_s": round(len(samples) / t_text, 2),
        "samples_per_s": round(len(samples) / (t_vis + t_text), 2),
        "tokens": sum(len(x) for x in ids),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=192)
    ap.add_argument("--modes", default="gpu,offload")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    from transformers import Qwen3VLConfig

    from gguf_trainer.model.student import load_tokenizer
    from gguf_trainer.packs import get_pack
    from gguf_trainer.teachers.qwen3vl import Qwen3VLTeacher, check_templates, place
    from gguf_trainer.tiny import qwen_tokenizer_dir
    from gguf_trainer.tiny.qwen3vl import CONFIG as TINY

    pack = get_pack("qwen3vl_mageflow")
    cuda = torch.cuda.is_available() and not args.quick
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    tc, vc = (TINY["text_config"], TINY["vision_config"]) if args.quick else (TEXT_4B, VISION_4B)
    config = Qwen3VLConfig(
        text_config=dict(tc),
        vision_config=dict(vc),
        image_token_id=151655,
        video_token_id=151656,
        vision_start_token_id=151652,
        vision_end_token_id=151653,
    )
    tokenizer = load_tokenizer(qwen_tokenizer_dir())
    check_templates(tokenizer, pack.teacher_template())
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t0 = time.perf_counter()
    model = build_model(config, device, dtype)
    sync()
    n_text = sum(p.numel() for p in model.language_model.parameters())
    n_vis = sum(p.numel() for p in model.visual.parameters())
    report = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "dtype": str(dtype),
        "params_text": n_text,
        "params_vision": n_vis,
        "build_s": round(time.perf_counter() - t0, 1),
    }
    n = 12 if args.quick else args.samples
    with tempfile.TemporaryDirectory() as tmp:
        samples = make_samples(n, Path(tmp), random.Random(0))
        resident = None
        for mode in args.modes.split(","):
            if mode == "offload" and not cuda:
                report["offload"] = "skipped: no CUDA device"
                continue
            if mode == "offload":
                model.to("cpu")
                place(model.language_model, model.visual, device, "offload")
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            teacher = Qwen3VLTeacher(
                model,
                tokenizer,
                device,
                mode if cuda else "cpu",
                pack.student_pieces,
                pack.teacher_template(),
            )
            use = samples if mode == "gpu" else samples[: max(24, n // 4)]  # streaming is slow
            res = run_mode(teacher, use, tokenizer, pack, sync)
            rows = res.pop("rows")
            if cuda:
                res["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 1024**3, 2)
            res["samples"] = len(use)
            if mode == "gpu":
                resident = rows
            elif resident is not None:
                cos = [
                    torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1).min().item()
                    for a, b in zip(rows, resident)
                ]
                res["min_cos_vs_resident"] = round(min(cos), 5)
            report[mode] = res
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
