"""The window kinds of benchmarks/bench_recipe_real.py on a decoder proxy: the T5 kinds'
teachers (T5-XXL, UMT5-XXL: encoders) and LLaDA's QueryFormer are not SmolLM2, so each kind's
targets are the nearest thing a causal decoder gives, cut to a fixed window of rows:

  seeded_resampler  (PixArt / Chroma / Wan)  the raw prompt, no template (PixArt's embedder
      runs none), cut to a WINDOW_T5-slot window as teachers/t5.window_ids cuts it (pieces, then
      EOS = `<|im_end|>`, pads `<|endoftext|>` = id 0 as T5's PAD); targets = SmolLM2's final
      norm (T5's last_hidden_state is its final RMSNorm's output) at the real slots of the
      window, computed over the window itself; seeds = the window's SmolLM2 ids (the T5 ids in
      the product). Student = model.norm(hidden_states[3]) over the whole prompt + EOS (pig_clip
      reads the whole prompt whatever the window cuts).
  resampler  (LLaDA)  the chat template, then QUERIES fixed query rows (QUERY_TEXT repeated,
      attending to the prompt and to each other): targets = hidden state 24 (raw) at those rows,
      a fixed number of rows per prompt that read the whole prompt, as LLaDA's 256 QueryFormer
      rows do; student = model.norm(hidden_states[3]) over the template rows.

Neither window holds the template's sink row (the seeded window's first row is the prompt's first
token, through the final norm; the query rows come after the sink), and every row is a `token`
row: the recipe settings that act on pads, prefixes and constant rows change nothing here.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch

from gguf_trainer.data.recipe import TOKEN
from gguf_trainer.data.shards import Batch

WINDOW_T5 = 120  # PixArt-alpha's caption length: the long captions are cut, as PixArt cuts them
QUERIES = 64  # LLaDA's 256 QueryFormer rows in small
QUERY_TEXT = " image"  # one fixed piece, repeated QUERIES times after the template
QUERY_STATE = 24
EOS_TEXT = "<|im_end|>"


def load(kind: str, gguf, digest: str, sets: dict, cache: Path, student_state: int,
         prefix: str, suffix: str, log) -> dict:
    """Per prompt of a window kind: student rows, target rows (float16) and the window's ids,
    cached by the GGUF's sha256, the prompt set and the window layout."""
    layout = ([WINDOW_T5, EOS_TEXT] if kind == "seeded_resampler"
              else [QUERIES, QUERY_TEXT, QUERY_STATE, prefix, suffix])
    key = hashlib.sha256(json.dumps([digest, sets, kind, layout, student_state]).encode())
    path = cache / f"smollm2-{kind}-{key.hexdigest()[:16]}.pt"
    if path.exists():
        return torch.load(path, weights_only=False)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32).eval()
    log(f"loaded {gguf.name} in {time.time() - t0:.0f} s ({kind})")
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    eos, query = tok.convert_tokens_to_ids(EOS_TEXT), enc(QUERY_TEXT)
    if len(query) != 1:
        raise SystemExit(f"{QUERY_TEXT!r} is {len(query)} pieces, not one")
    pre, suf = enc(prefix), enc(suffix)

    def run(seqs):
        """Hidden states of right-padded sequences (pads masked as keys). The last is
        transformers' last_hidden_state: the final norm's output."""
        L = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), L, dtype=torch.long)
        keep = torch.zeros(len(seqs), L, dtype=torch.long)
        for j, s in enumerate(seqs):
            ids[j, :len(s)], keep[j, :len(s)] = torch.tensor(s), 1
        return model(input_ids=ids, attention_mask=keep, output_hidden_states=True
                     ).hidden_states

    out = {b: [None] * len(sets[b]) for b in sets}
    items = [(b, i, p) for b in ("short", "long") for i, p in enumerate(sets[b])]
    items.sort(key=lambda it: len(enc(it[2])))
    for k in range(0, len(items), 8):
        chunk = items[k:k + 8]
        pieces = [enc(p) for _, _, p in chunk]
        with torch.no_grad():
            if kind == "seeded_resampler":
                full = [pc + [eos] for pc in pieces]
                window = [pc[:WINDOW_T5 - 1] + [eos] for pc in pieces]
                hs = run(full)
                cut = [j for j, (f, w) in enumerate(zip(full, window)) if f != w]
                hs_cut = run([window[j] for j in cut]) if cut else None
                for j, (b, i, _) in enumerate(chunk):
                    last = hs_cut[-1][cut.index(j)] if j in cut else hs[-1][j]
                    out[b][i] = {
                        "x": model.model.norm(hs[student_state][j, :len(full[j])]).half(),
                        "y": last[:len(window[j])].clone().half(), "ids": window[j]}
            else:
                temp = [pre + pc + suf + query * QUERIES for pc in pieces]
                hq = run(temp)
                for j, (b, i, _) in enumerate(chunk):
                    n_t = len(temp[j]) - QUERIES
                    out[b][i] = {
                        "x": model.model.norm(hq[student_state][j, :n_t]).half(),
                        "y": hq[QUERY_STATE][j, n_t:n_t + QUERIES].clone().half(),
                        "ids": temp[j]}
        log(f"  cached {min(k + 8, len(items))}/{len(items)} prompts, {kind} "
            f"({time.time() - t0:.0f} s)")
    data = {"gguf_sha256": digest, "sets": sets, "prompts": out}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(data, tmp)
    tmp.replace(path)
    return data


def samples(data: dict, kind: str, n_train: dict) -> tuple[list, list]:
    """(train, val) samples of a window kind, shaped as bench_recipe_real.samples_of's."""
    train, val = [], []
    for bucket in ("short", "long"):
        for i, rec in enumerate(data["prompts"][bucket]):
            r = rec
            n = r["y"].shape[0]
            smp = {"x": r["x"], "y": r["y"], "cls": torch.full((n,), TOKEN, dtype=torch.int8),
                   "start": 0, "n": n, "const": 0, "bucket": bucket, "index": i,
                   "ids": r["ids"], "window": kind}
            (train if i < n_train[bucket] else val).append(smp)
    return train, val


def collate(batch: list, width: int) -> Batch:
    """A window kind's batch as shards.collate builds it: the student rows padded, the targets
    padded to the window (seeded: WINDOW_T5 slots, its ids the seeds; resampler: QUERIES rows),
    row_mask the supervised rows."""
    seeded = batch[0]["window"] == "seeded_resampler"
    L = max(s["x"].shape[0] for s in batch)
    Q = WINDOW_T5 if seeded else QUERIES
    B, D = len(batch), batch[0]["y"].shape[1]
    x, m = torch.zeros(B, L, width), torch.zeros(B, L, dtype=torch.bool)
    y, rm = torch.zeros(B, Q, D), torch.zeros(B, Q, dtype=torch.bool)
    seeds = torch.zeros(B, Q, dtype=torch.long)
    for b, s in enumerate(batch):
        n, R = s["x"].shape[0], s["y"].shape[0]
        x[b, :n], m[b, :n] = s["x"].float(), True
        y[b, :R], rm[b, :R] = s["y"].float(), True
        if seeded:
            seeds[b, :len(s["ids"])] = torch.tensor(s["ids"])
    return Batch(hidden=x, mask=m, target=y, row_mask=rm, seed_ids=seeds if seeded else None,
                 sup_start=None, samples=[], n_real=None)


def describe(kind: str, prefix: str, suffix: str) -> dict:
    """The window's layout for --export-dir's layers.json."""
    if kind == "seeded_resampler":
        return {"window": WINDOW_T5, "template": None, "eos": EOS_TEXT, "pad_id": 0,
                "rows": "the raw prompt's pieces (the first window-1) + EOS, run alone; "
                        "val_ids.json 'ids' are the window's real slots, the seeds",
                "student": "the whole prompt + EOS"}
    return {"prefix": prefix, "suffix": suffix, "queries": QUERIES, "query": QUERY_TEXT,
            "rows": f"hidden_states[{QUERY_STATE}] at the {QUERIES} query rows after the template",
            "student": "the template rows (val_ids.json 'ids' less the query rows)"}
