"""The slot-resampler kind of benchmarks/bench_recipe_real.py (issue 32: `kind: slot_resampler`):
the Qwen3.5 bridge's adapter (model/slot_resampler.py, pack `qwen35_bridge`), one seeded query
per TEACHER token, measured with SmolLM2-135M as the teacher and its own ids as the slots:

  slots    SmolLM2's ids of `<|im_start|>user\\n` + prompt + `<|im_end|>\\n<|im_start|>assistant\\n`
           (the MOSS template's shape; pieces tokenized apart, as the other kinds), one query per
           id: slot_query + seed_proj(seed_embed[id])
  seeds    a frozen PCA (model/slot_resampler.pca_seed, the product's) of SmolLM2's own 49,152 x
           576 embedding table at the pack's `train.seed_rank`
  targets  SmolLM2's last hidden state after the final norm at every slot (MOSS-Image reads the
           9B's last hidden state after the norm, one row per template token)
  student  model.norm(hidden_states[3]) over the RAW prompt, no template (the bridge's student
           reads the prompt as one string, conditioner.hpp 4388) - a weaker view that does not
           even share the slots' rows, as pig_clip does not share Qwen3.5's tokenizer

Every slot is a `token` row in the product (a slot shard has no sup_start, so
data/recipe.shard_classes names no constant or pad row): only `target_space` and
`sigma_floor_mode` can change anything. The template's 3 lead slots (the same for every prompt)
are left out of `tokens` and reported as the constant rows' fit, as for the other kinds.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch

from gguf_trainer.data.recipe import TOKEN
from gguf_trainer.data.shards import Batch
from gguf_trainer.model.slot_resampler import PAD_SLOT, pca_seed

KIND = "slot_resampler"
# The bridge's export insists on the engine's pre-tokenizer name (slot_file.QWEN35_PRE); the
# vocabulary is SmolLM2's all the same, and a recompute feeds val_ids.json's slot ids, never text.
TOKENIZER_PRE = "qwen35"


def load(gguf, digest: str, sets: dict, cache: Path, student_state: int, prefix: str,
         suffix: str, seed_rank: int, log) -> dict:
    """Per prompt: the raw prompt's student rows, the template's final-norm rows (float16) and
    the slot ids; the PCA seed table and the vocabulary (for --export-dir). Cached by the
    GGUF's sha256, the prompt set and the layout."""
    layout = [KIND, prefix, suffix, student_state, seed_rank]
    key = hashlib.sha256(json.dumps([digest, sets, layout]).encode())
    path = cache / f"smollm2-{KIND}-{key.hexdigest()[:16]}.pt"
    if path.exists():
        return torch.load(path, weights_only=False)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32).eval()
    log(f"loaded {gguf.name} in {time.time() - t0:.0f} s ({KIND})")
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    pre, suf = enc(prefix), enc(suffix)

    def run(seqs):
        L = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), L, dtype=torch.long)
        keep = torch.zeros(len(seqs), L, dtype=torch.long)
        for j, s in enumerate(seqs):
            ids[j, :len(s)], keep[j, :len(s)] = torch.tensor(s), 1
        return model(input_ids=ids, attention_mask=keep, output_hidden_states=True).hidden_states

    out = {b: [None] * len(sets[b]) for b in sets}
    items = [(b, i, p) for b in ("short", "long") for i, p in enumerate(sets[b])]
    items.sort(key=lambda it: len(enc(it[2])))
    for k in range(0, len(items), 8):
        chunk = items[k:k + 8]
        raw = [enc(p) for _, _, p in chunk]
        slots = [pre + r + suf for r in raw]
        with torch.no_grad():
            hs_raw, hs_slot = run(raw), run(slots)
            for j, (b, i, _) in enumerate(chunk):
                out[b][i] = {
                    "x": model.model.norm(hs_raw[student_state][j, :len(raw[j])]).half(),
                    "y": hs_slot[-1][j, :len(slots[j])].clone().half(), "ids": slots[j]}
        log(f"  cached {min(k + 8, len(items))}/{len(items)} prompts, {KIND} "
            f"({time.time() - t0:.0f} s)")
    with torch.no_grad():
        seed = pca_seed(model.model.embed_tokens.weight.float(), seed_rank)
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    vocab = {"tokens": tok.convert_ids_to_tokens(list(range(len(tok)))),
             "merges": [m if isinstance(m, str) else " ".join(m) for m in merges]}
    data = {"gguf_sha256": digest, "sets": sets, "prompts": out, "n_const": len(pre),
            "seed": seed.half(), "vocabulary": vocab}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(data, tmp)
    tmp.replace(path)
    return data


def samples(data: dict, n_train: dict) -> tuple[list, list]:
    """(train, val) samples shaped as bench_recipe_real.samples_of's; `const` = the template's
    lead slots (judged apart), every slot a token row for the loss, as the product's."""
    train, val = [], []
    for bucket in ("short", "long"):
        for i, r in enumerate(data["prompts"][bucket]):
            n = r["y"].shape[0]
            smp = {"x": r["x"], "y": r["y"], "cls": torch.full((n,), TOKEN, dtype=torch.int8),
                   "start": 0, "n": n, "const": data["n_const"], "bucket": bucket, "index": i,
                   "ids": r["ids"], "window": KIND}
            (train if i < n_train[bucket] else val).append(smp)
    return train, val


def collate(batch: list, width: int) -> Batch:
    """As shards.collate builds a slot batch: the student rows padded (mask), one target row
    and one seed id per slot, PAD_SLOT past a sample's slots (masked as self-attention keys)."""
    L = max(s["x"].shape[0] for s in batch)
    R = max(s["y"].shape[0] for s in batch)
    B, D = len(batch), batch[0]["y"].shape[1]
    x, m = torch.zeros(B, L, width), torch.zeros(B, L, dtype=torch.bool)
    y, rm = torch.zeros(B, R, D), torch.zeros(B, R, dtype=torch.bool)
    seeds = torch.full((B, R), PAD_SLOT, dtype=torch.long)
    for b, s in enumerate(batch):
        n, P = s["x"].shape[0], s["y"].shape[0]
        x[b, :n], m[b, :n] = s["x"].float(), True
        y[b, :P], rm[b, :P] = s["y"].float(), True
        seeds[b, :P] = torch.tensor(s["ids"])
    return Batch(hidden=x, mask=m, target=y, row_mask=rm, seed_ids=seeds, sup_start=None,
                 samples=[], n_real=None)


def config(pack, width: int, depth: int, in_dim: int, out_dim: int, seed_rank: int,
           seed_vocab: int):
    """The pack's own adapter config at the bench's width and depth (its max_slots, its rank),
    SmolLM2's vocabulary for the seed table, and a 64-wide vision input no row uses (the
    engine always declares vis_q / vis_in)."""
    from dataclasses import replace

    from gguf_trainer.store.project_schema import TrainSettings

    cfg = pack.adapter_config(TrainSettings(width=width, depth=depth, seed_rank=seed_rank),
                              in_dim=in_dim, out_dim=out_dim, vis_dim=64)
    return replace(cfg, seed_vocab=seed_vocab)


def describe(prefix: str, suffix: str) -> dict:
    """The slot layout for --export-dir's layers.json."""
    return {"slots": f"SmolLM2 ids of {prefix!r} + prompt + {suffix!r}, pieces apart "
                     "(val_ids.json 'ids')",
            "seeds": "pca_seed(model.model.embed_tokens.weight, seed_rank)",
            "student": "the raw prompt, no template", "targets": "model.norm, every slot"}
