"""The check's figures for one prompt: compare() of the adapter's rows with the dump's, each
tap's block of a stack, the lead (the rows the DiT reads, tokens and pads apart, each centred on
the dump's own mean of its rows: data/dit_rows.py's lead for one prompt) and the pack's verdict.

    figures = compare(pred, ref)             # cos, cos_centered, worst_row_cos_centered, rel_mse
    lead = lead_figures(pred, ref, {"tokens": keep})
"""

from __future__ import annotations

import numpy as np

from gguf_trainer.packs import get_pack


def compare(pred: np.ndarray, ref: np.ndarray, keep: np.ndarray | None = None) -> dict:
    """Row figures of pred vs ref ([rows, dim]) over the rows in `keep` (default all)."""
    if keep is not None:
        pred, ref = pred[keep], ref[keep]
    p, t = pred.astype(np.float64), ref.astype(np.float64)

    def rowcos(a, b):
        den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
        return (a * b).sum(1) / np.maximum(den, 1e-12)

    mu = t.mean(0, keepdims=True)  # the dump's own per-dim mean
    centred = rowcos(p - mu, t - mu)
    return {
        "rows": int(t.shape[0]),
        "cos": float(rowcos(p, t).mean()),
        "cos_centered": float(centred.mean()),
        "worst_row_cos_centered": float(centred.min()),
        "rel_mse": float(((p - t) ** 2).sum() / max((t**2).sum(), 1e-30)),
    }


def verdict_line(pack_id: str, figures: dict) -> str:
    """The pack's healthy / weak / broken line for these figures (TrainerPack.verdict); n/a for a
    pack with no reference run to judge by (the layerwise families)."""
    verdict = get_pack(pack_id).verdict
    if verdict is None:
        return (
            f"n/a: no reference run for {get_pack(pack_id).title}; read the figures (against "
            "llm_hidden.bin, the full teacher's stack: the quality; against adapter_out.bin, the "
            "engine's run of this file: a port check)"
        )
    return verdict.line(figures)


def tap_figures(pred: np.ndarray, ref: np.ndarray, taps, keep=None) -> dict:
    """Layerwise: compare() of each tap's column block (ascending, the engine's stack order):
    its plain and its centred cosine."""
    n = len(taps)
    d = pred.shape[1] // n
    per = [compare(pred[:, k * d : (k + 1) * d], ref[:, k * d : (k + 1) * d], keep)
           for k in range(n)]
    return {"taps": list(taps), "cos": [f["cos"] for f in per],
            "cos_centered": [f["cos_centered"] for f in per]}


def lead_rows(pack, ids: list[int], encode) -> dict[str, np.ndarray]:
    """One prompt's rows the lead figures read (data/dit_rows.py), for a token-aligned output:
    `tokens` from the DiT's start row on, less the template's constant lead (the ids this
    template shares with two other prompts' templates: the sink row is one), before the pads;
    `pads` the family's pads (absent without any)."""
    from gguf_trainer.data.recipe import shared_prefix
    from gguf_trainer.data.samples import Sample

    others = [pack.student_ids(encode, Sample(text), []) for text in ("0", "#")]
    r = np.arange(len(ids))
    n_real = pack.padding.real_length(ids)
    first = max(pack.template_start(Sample("")), shared_prefix([ids, *others]))
    out = {"tokens": (r >= first) & (r < n_real)}
    if n_real < len(ids):
        out["pads"] = r >= n_real
    return out


def lead_figures(pred: np.ndarray, ref: np.ndarray, sets: dict, taps=()) -> dict:
    """compare() of each row set, each centred on its own mean (the dump's rows of that set),
    with each tap's centred cosine for a stack: what eval's lead block holds, for one prompt."""
    out = {}
    for name, keep in sets.items():
        if keep.any():
            out[name] = compare(pred, ref, keep)
            if taps:
                out[name]["per_tap"] = tap_figures(pred, ref, taps, keep)["cos_centered"]
    return out


def lead_text(lead: dict | None) -> str:
    """"tokens centred cosine 0.93 rel_mse 0.08; pads ..." (empty without a lead)."""
    return "; ".join(f"{n} centred cosine {f['cos_centered']:.4f} rel_mse {f['rel_mse']:.4g} "
                     f"({f['rows']} rows)" for n, f in (lead or {}).items())

