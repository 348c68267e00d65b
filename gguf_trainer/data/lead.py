"""The lead block's names and its one-line reading, without torch (store/results.py, the GUI
and `render` read eval.json through it; data/dit_rows.py computes the block).

    lead_value(ev["lead"], "tokens", "short", "rel_mse")   # None when absent
    lead_line(ev["lead"])   # "tokens centred cos 0.9312 rel_mse 0.081 (mean baseline ...) ..."
"""

from __future__ import annotations

SHORT_BELOW = 77  # real rows from the start row on (CLIP's context: the prompts most write)
SETS = ("tokens", "pads")
BUCKETS = ("all", "short", "long")
METRIC = "centred_cos"
CENTRED_ON = "each row set's own mean over the val rows"


def lead_value(lead, name: str = "tokens", bucket: str = "all", figure: str = METRIC):
    """One figure of a lead block (eval.json "lead", a val record), or None when absent (an
    eval.json written before the lead figures, a pack without pads)."""
    try:
        v = lead["sets"][name][bucket][figure]
    except (KeyError, TypeError):
        return None
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def lead_line(lead) -> str | None:
    """One line: the tokens' and pads' centred cosine (its mean baseline's beside it), short
    and long apart, and each tap's for a stack; None without a lead block."""
    tok = lead_value(lead)
    if tok is None:
        return None

    def cell(name):
        cc, rm = lead_value(lead, name), lead_value(lead, name, figure="rel_mse")
        base = lead_value(lead, name, figure="baseline_centred_cos")
        text = f"{name} centred cos {cc:.4f}"
        if isinstance(rm, float):
            text += f" rel_mse {rm:.3f}"
        if base is not None:
            text += f" (mean baseline {base:.4f})"
        buckets = [f"{b} {v:.4f}" for b in ("short", "long")
                   if (v := lead_value(lead, name, b)) is not None]
        return text + (f" [{', '.join(buckets)}]" if len(buckets) == 2 else "")

    parts = [cell(n) for n in SETS if lead_value(lead, n) is not None]
    per = (lead.get("sets", {}).get("tokens", {}).get("all", {}) or {}).get("per_tap")
    taps = lead.get("taps") or []
    if isinstance(per, list) and len(per) == len(taps) and taps:
        parts.append("tokens per tap: " + ", ".join(
            f"L{t} {f['centred_cos']:.3f}" for t, f in zip(taps, per)
            if isinstance(f, dict) and isinstance(f.get("centred_cos"), (int, float))))
    return "; ".join(parts)
