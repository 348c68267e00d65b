"""`check` of the slot kinds' dumps: a `qwen35_bridge` or `ming_image` adapter against what ggk
0.9.7 writes when it conditions through Qwen35BridgeEmbedder or MingImageAdapterEmbedder with
SD_DUMP_COND set (the dump files are read by dump_files.py, the figures made by figures.py).

What the engine writes (vendor/engine/diffusion/src/conditioning/conditioner.hpp, read from the
0.9.7 sdist; headerless f32, the feature axis innermost; the last conditioning pass wins):

  MingImageAdapterEmbedder (4137-4150)
    qwen_hidden.bin   the student's final-norm states on the RAW prompt [L, 1024] (4103-4116)
    adapter_out.bin   [256 + P, out_dim]: the caption rows zero-padded to out_dim, then one
                      direct row per Ling slot (llm_adapter.hpp 594-598)
    vis_embeds.bin    an edit's reference image through the Ling tower [n, vis_dim] (one image)
    no id file: the Ling ids are the template's (MingImageTE::build_prompt_tokens) over the
    tokenizer.json the adapter carries; the image's slots start after `<image>`.
  Qwen35BridgeEmbedder (conditioner.hpp 4458-4488)
    qwen_hidden.bin   as above (4388-4397)
    adapter_out.bin   MOSS-Image: [P, out_dim], one row per Qwen3.5 slot of the MOSS template;
                      FLUX.3 (the bank head): [R, bank_dim], R = the token-aligned bank's real
                      rows rounded up to a multiple of 80 (4438-4439), or all n_bank rows
    bank_hidden.bin   the token-aligned bank's student rows [n_bank, 1024] (FLUX.3 only)
    vis_embeds.bin    the references through the Qwen3.5 tower, concatenated [sum n_i, vis_dim]
    seed_ids.txt      the P slot ids;  vis_pos.txt: "slot n" per reference (empty text-only)

  The full teacher (no --llm-adapter) writes the same rows as the adapter is trained to:
    Ming-Image (MingImageEmbedder, 3911-3932): ming_te_out.bin [256 + P, 3840] + ming_tokens.txt
    MOSS-Image (LLMEmbedder, 2843-2895): llm_hidden.bin [P, 4096] (the 9B's final norm) +
    tokens.txt; against either the figure is the adapter's quality, not a port check.

The check rebuilds each of these from the prompt (the engine's slot ids over the vocabulary in
the file: engine/qwen35_bpe.py, engine/ling_bpe.py; the student ids; the references' rows from
the dump itself), runs `load_gguf`'s forward and compares row for row. The dump is the engine's
run of this very file, so the verdict is a port check; a dump of another prompt, length, head or
family is one sentence.

    res = slot_check(adapter, path, student, "a sheep in sunglasses", "dumps/run1", "ming_image")
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gguf_trainer.base.errors import UserError
from gguf_trainer.engine.qwen_bpe import engine_bpe

from .dump_files import (
    QWEN_HIDDEN,
    T5_IDS_TXT,
    TOKENS_TXT,
    VIS_EMBEDS,
    VIS_POS,
    read_dump,
    read_ids,
)
from .figures import compare, lead_figures

SLOT_KINDS = ("qwen35_bridge", "ming_image")
SEED_IDS_TXT = "seed_ids.txt"  # the bridge's slot ids (conditioner.hpp 4475-4480)
ADAPTER_OUT = "adapter_out.bin"
# The full teacher's run (no --llm-adapter), the same rows as the adapter's and its ids: Ming's
# MingImageEmbedder (conditioner.hpp 3911-3932: ming_te_out.bin [256 + P, 3840], the caption
# zero-padded, and ming_tokens.txt), MOSS-Image's LLMEmbedder (2843-2895: the 9B's final-norm
# states over the same template, llm_hidden.bin [P, 4096], and tokens.txt).
TEACHER_OUT = {"ming_image": "ming_te_out.bin", "qwen35_bridge": "llm_hidden.bin"}
TEACHER_IDS = {"ming_image": "ming_tokens.txt", "qwen35_bridge": TOKENS_TXT}
BANK_ROW_MULTIPLE = 80  # the FLUX.3 bank's rows to the DiT: a multiple of 80 (4440)
BANK_PREFIX = "<|im_start|>user\n"  # the Qwen3-VL-4B template around the bank's rows (4426-4427)
BANK_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
MAX_STUDENT_ROWS = 8192  # qwen_hidden.bin rows read to name another prompt's (32 MiB at 1024)
CFG_HINT = ("with CFG on, the last pass the engine writes is the empty negative prompt; dump "
            "again with --cfg-scale 1")


def _slot_ids_of(adapter, kind: str, path):
    """prompt, image counts -> (the engine's slot ids, [first slot of each image]) over the
    vocabulary the file carries, as the engine builds it."""
    if kind == "qwen35_bridge":
        from gguf_trainer.engine.qwen35_bpe import IMAGE_PAD, EngineQwen35BPE, moss_prompt

        meta = getattr(adapter, "metadata", {}) or {}
        tokens, merges = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.merges")
        if not tokens or not merges:
            raise UserError("this qwen35_bridge adapter carries no Qwen3.5 vocabulary "
                            "(tokenizer.ggml.tokens / merges), so its slot ids are unknown; "
                            "re-export it with gguf-trainer's qwen35_bridge pack.")
        bpe = EngineQwen35BPE(list(tokens), list(merges))
        pad = bpe.special_ids[IMAGE_PAD]

        def ids_of(text, counts=()):
            ids = bpe.encode(moss_prompt(text, counts))
            starts = [i for i, t in enumerate(ids) if t == pad and (i == 0 or ids[i - 1] != pad)]
            return ids, starts

        return ids_of
    from gguf_trainer.engine.ling_bpe import EngineLingBPE, ming_prompt_ids

    bpe = EngineLingBPE(ling_tokenizer_json(path))

    def ling_ids(text, counts=()):
        ids, start = ming_prompt_ids(bpe, text, sum(counts))
        return ids, ([start] if counts else [])

    return ling_ids


def ling_tokenizer_json(path) -> str:
    """The Ling tokenizer.json a Ming adapter file carries (`tokenizer_json`, one f16 per byte),
    as the engine reads it; a sentence when the file has none."""
    import gguf

    from gguf_trainer.model.ming_adapter import TOKENIZER_TENSOR, tokenizer_from_tensor

    reader = gguf.GGUFReader(str(path))
    found = next((t for t in reader.tensors if t.name == TOKENIZER_TENSOR), None)
    if found is None:
        raise UserError(f"{path} carries no {TOKENIZER_TENSOR}, so the Ling slot ids of a prompt "
                        "are unknown here (the engine would need a tokenizer pack); re-export it "
                        "with gguf-trainer's ming_image pack.")
    try:
        return tokenizer_from_tensor(np.asarray(found.data))
    except UnicodeDecodeError:
        raise UserError(f"{path}'s {TOKENIZER_TENSOR} is not UTF-8 text; re-export it.") from None


def _references(dump_dir: Path, kind: str, vis_dim: int) -> tuple[np.ndarray | None, list]:
    """(the dump's reference rows [sum n, vis_dim] or None, the bridge's vis_pos.txt runs
    [(slot, n)]). Ming writes no vis_pos.txt: its one image's row count is the file's."""
    path = dump_dir / VIS_EMBEDS
    runs: list[tuple[int, int]] = []
    if kind == "qwen35_bridge":
        ids = read_ids(dump_dir / VIS_POS) or []  # always written; empty for a text-only run
        if len(ids) % 2 or any(v < 0 for v in ids) or any(n <= 0 for n in ids[1::2]):
            raise UserError(f"{dump_dir / VIS_POS} is not one \"slot rows\" pair per reference; "
                            "use the files of one engine run.")
        runs = list(zip(ids[0::2], ids[1::2]))
        if not runs:
            return None, []
        rows = read_dump(path, vis_dim, max_rows=sum(n for _, n in runs))
        if rows.shape[0] != sum(n for _, n in runs):
            raise UserError(f"{path} holds {rows.shape[0]} rows but {VIS_POS} names "
                            f"{sum(n for _, n in runs)}; use the files of one engine run.")
        return rows, runs
    if not path.is_file():
        return None, []
    # one image of at most the adapter's slots (a larger file is refused unread)
    return read_dump(path, vis_dim, max_rows=1 << 16), []


def _template_rows(ids_of, prompt: str, counts) -> np.ndarray:
    """True at the slots of the prompt's own tokens: less the template's constant lead and
    tail (the ids this prompt shares with two other prompts' templates, as lead_rows)."""
    ids, _ = ids_of(prompt, counts)
    others = [ids_of(t, counts)[0] for t in ("0", "#")]

    def shared(seqs):
        n = 0
        while all(len(s) > n for s in seqs) and len({s[n] for s in seqs}) == 1:
            n += 1
        return n

    head = shared([ids, *others])
    tail = shared([s[::-1] for s in (ids, *others)])
    r = np.arange(len(ids))
    return (r >= head) & (r < len(ids) - min(tail, len(ids) - head))


def _reference(dump, kind: str) -> tuple[Path, int]:
    """(the file the figures compare with, its size): the engine's run of the adapter
    (adapter_out.bin) first, else the full teacher's (TEACHER_OUT)."""
    path = Path(dump)
    names = (ADAPTER_OUT, TEACHER_OUT[kind])
    if path.is_dir():
        path = next((path / n for n in names if (path / n).is_file()), path / ADAPTER_OUT)
    if not path.is_file():
        raise UserError(f"{path} does not exist; run the engine with SD_DUMP_COND set to an "
                        f"existing folder (with this adapter it writes {ADAPTER_OUT}, with the "
                        f"full teacher {TEACHER_OUT[kind]}), or name that file.")
    if path.name not in names:
        raise UserError(f"{path.name} is not what the engine writes for a {kind} adapter or its "
                        f"teacher; pass the dump folder, its {ADAPTER_OUT} or "
                        f"{TEACHER_OUT[kind]}.")
    return path, path.stat().st_size


def slot_check(adapter, adapter_path, student, prompt: str, dump, pack_id: str) -> dict:
    """Every figure of the check of a slot-kind adapter (run_check's dict, format_check)."""
    import torch

    from gguf_trainer.data.samples import Sample
    from gguf_trainer.packs import get_pack

    cfg, kind = adapter.config, adapter.config.kind
    dump_dir = Path(dump) if Path(dump).is_dir() else Path(dump).parent
    out_path, n_bytes = _reference(dump, kind)
    teacher = out_path.name == TEACHER_OUT[kind]
    ids_of = _slot_ids_of(adapter, kind, adapter_path)
    n_cap = cfg.n_bank if kind == "ming_image" else 0
    lead_n = n_cap  # caption rows before the slots in adapter_out.bin
    text_pass = n_bytes == (lead_n + len(ids_of(prompt)[0])) * cfg.out_dim * 4
    if kind == "ming_image" and text_pass:
        vis, runs = None, []  # a vis_embeds.bin an earlier edit run left is not this pass's
    else:
        vis, runs = _references(dump_dir, kind, cfg.vis_dim)
    counts = [n for _, n in runs] if kind == "qwen35_bridge" else (
        [vis.shape[0]] if vis is not None else [])
    ids, starts = ids_of(prompt, counts)
    if kind == "qwen35_bridge" and starts != [s for s, _ in runs]:
        raise UserError(f"the dump's {VIS_POS} puts the references at slots {[s for s, _ in runs]}"
                        f" but this prompt's template has them at {starts}; pass the exact "
                        "--prompt the engine ran.")
    if len(ids) > cfg.num_queries:
        raise UserError(f"this prompt is {len(ids)} slots but the adapter holds "
                        f"{cfg.num_queries}; the engine refuses it (it writes no dump).")
    ids_name = TEACHER_IDS[kind] if teacher else SEED_IDS_TXT
    engine_ids = (read_ids(dump_dir / ids_name) if teacher or kind == "qwen35_bridge"
                  else None)
    others = [n for n in (TOKENS_TXT, T5_IDS_TXT) if (dump_dir / n).is_file()]
    if kind == "qwen35_bridge" and not teacher and engine_ids is None and others:
        raise UserError(f"{dump_dir} holds {others[0]} but no {SEED_IDS_TXT}: it is another "
                        "kind's dump (a token-aligned, layerwise or T5 adapter's run), not this "
                        "bridge's; dump this adapter's run into a fresh folder.")
    if engine_ids is not None and engine_ids != ids:
        empty = prompt.strip() and engine_ids == ids_of("", counts)[0]
        raise UserError(
            f"the dump's {ids_name} is the empty prompt's: {CFG_HINT}." if empty else
            f"the dump's {ids_name} ({len(engine_ids)} slots) is not this prompt's "
            f"({len(ids)}); pass the exact --prompt the engine ran, or a dump of this adapter's "
            "family (a dump is overwritten by each pass).")

    # which head wrote adapter_out.bin: its size says (MOSS: the slots; FLUX.3: the bank)
    encode = engine_bpe(student.tokenizer).encode
    pack = get_pack(pack_id)
    sids = pack.student_ids(encode, Sample(prompt), [])
    heads = {"slots": (lead_n + len(ids), cfg.out_dim)}
    bank_real = 0
    if kind == "qwen35_bridge" and cfg.n_bank and not teacher:  # MOSS's teacher: slots only
        if cfg.bank_align:
            pre, suf = encode(BANK_PREFIX), encode(BANK_SUFFIX)
            body = 0 if not prompt else min(cfg.n_bank - len(pre) - len(suf), len(sids))
            bank_real = len(pre) + body + len(suf)
            mult = BANK_ROW_MULTIPLE
            heads["bank"] = (min(cfg.n_bank, -(-bank_real // mult) * mult), cfg.bank_dim)
        else:
            heads["bank"] = (cfg.n_bank, cfg.bank_dim)
    head = next((h for h, (r, d) in heads.items() if r * d * 4 == n_bytes), None)
    if head is None:
        said = " or ".join(
            f"{r} rows of {d} ({lead_n} caption + {r - lead_n} slots)" if h == "slots" and lead_n
            else f"{r} {h.rstrip('s')} rows of {d}" for h, (r, d) in heads.items())
        most = {"slots": lead_n + cfg.num_queries, "bank": cfg.n_bank}  # what the file can make
        fits = [d for h, (_, d) in heads.items()
                if n_bytes and n_bytes % (4 * d) == 0 and n_bytes // (4 * d) <= most[h]]
        why = (f"{n_bytes // (4 * fits[0])} rows of {fits[0]}: another prompt or length was "
               "dumped (pass the exact --prompt the engine ran; " + CFG_HINT + ")"
               if fits else f"{n_bytes} bytes, not a number of rows of "
               f"{' or '.join(str(d) for _, d in heads.values())} this adapter can make: it was "
               "written by another family's conditioner or adapter")
        raise UserError(f"the dump's {out_path.name} holds {why}; this adapter makes {said} for "
                        "this prompt.")
    rows, width = heads[head]
    ref = read_dump(out_path, width, max_rows=rows)

    x = torch.tensor([sids])
    hidden = student.hidden(x, torch.ones_like(x))
    kw = {}
    if vis is not None:
        v = torch.from_numpy(np.ascontiguousarray(vis, dtype=np.float32))[None]
        vis_slot = torch.zeros(1, len(ids), cfg.vis_dim)
        at = 0
        for s, n in zip(starts, counts):
            vis_slot[0, s : s + n] = v[0, at : at + n]
            at += n
        kw = {"vis": v, "vis_slot": vis_slot}
    if head == "bank":
        kw["want_bank"] = True
        if cfg.bank_align:
            bank = torch.zeros(1, cfg.n_bank, cfg.in_dim)
            n_body = bank_real - len(pre) - len(suf)
            bank[0, len(pre) : len(pre) + n_body] = hidden[0, :n_body]
            kw["bank_hidden"] = bank
    with torch.no_grad():
        pred = adapter(hidden, seed_ids=torch.tensor([ids]), **kw)[0, :rows].float().numpy()

    # the lead: Ming's caption rows and the prompt's own direct rows; the bridge's prompt slots;
    # a token-aligned bank's real rows and its pads apart
    r = np.arange(rows)
    if head == "bank":
        sets = {"tokens": r < bank_real, "pads": r >= bank_real} if bank_real else {
            "tokens": r >= 0}
    else:
        own = np.concatenate([np.zeros(lead_n, bool), _template_rows(ids_of, prompt, counts)])
        sets = ({"caption": r < lead_n} if lead_n else {}) | {"tokens": own}
    lead = lead_figures(pred, ref, sets)
    student_cos = None
    if (dump_dir / QWEN_HIDDEN).is_file() and not teacher:  # the teacher's run writes none
        states = hidden[0].float().numpy()
        # room for another prompt's rows, so that one is named as such (a larger file is
        # refused unread)
        engine = read_dump(dump_dir / QWEN_HIDDEN, states.shape[1],
                           max_rows=max(states.shape[0], MAX_STUDENT_ROWS))
        if engine.shape != states.shape:
            raise UserError(f"the dump's {QWEN_HIDDEN} has {engine.shape[0]} student rows but "
                            f"this prompt is {states.shape[0]} student tokens; pass the exact "
                            f"--prompt the engine ran ({CFG_HINT}).")
        student_cos = compare(states, engine)["cos"]
    figures = compare(pred, ref)
    return {
        "student_cos": student_cos, "adapter": str(adapter_path), "dump": str(out_path),
        "pack": pack_id, "kind": kind, "prompt": prompt, "student_tokens": len(sids),
        "images": len(counts), "tokens_checked": None,
        "slots": len(ids), "head": head,
        # whether the engine's slot ids were compared: the bridge writes seed_ids.txt, Ming none
        "slot_ids_checked": engine_ids is not None,
        "t5_ids_checked": None, "lead": lead, **figures, "per_tap": None,
        "ids_file": ids_name if engine_ids is not None else None,
        "verdict": (f"quality (the adapter vs the engine's full teacher, {out_path.name}): cos "
                    f"{figures['cos']:.6f}; n/a: no reference run for "
                    f"{get_pack(pack_id).title}, compare with eval's val cos and its mean "
                    "baseline" if teacher else
                    "port check (the engine's run of this adapter vs this tool's): cos "
                    f"{figures['cos']:.6f}; near 1 means the engine reads the file as trained, "
                    "not that the adapter is good (judge quality by eval's val cos)"),
        "thresholds": None,
    }


def slot_ids_line(res: dict) -> str:
    """The dump line's note on the slot ids (format_check)."""
    where = f"{res['slots']} slots, {res['head']} head"
    if res.get("slot_ids_checked"):
        return f"{where}; {res.get('ids_file') or SEED_IDS_TXT} matches this prompt's"
    if res.get("kind") == "ming_image":
        return (f"{where}; Ming-Image dumps no slot ids: a dump of another prompt of the same "
                "Ling length shows only in the student cosine")
    return f"{where}; slot ids not checked: no {SEED_IDS_TXT}"
