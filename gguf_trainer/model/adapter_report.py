"""The body of `gguf-trainer inspect`: what the engine detects in an adapter GGUF, its geometry,
taps, seed table, provenance, minimum ggk and every problem, as text or stable JSON. Reads
through adapter_file.read_adapter; like it, never imports torch.

Usage: `gguf-trainer inspect adapter-f16.gguf [--json]` -> `inspect_main(path, as_json)`.
"""

from __future__ import annotations

import json
import math
import sys
from typing import TextIO

from gguf_trainer.model import slot_file
from gguf_trainer.model.adapter_file import (
    GEOMETRY_KEYS,
    PREFIX,
    AdapterView,
    families_for,
    read_adapter,
    trainer_kind,
    weight_type,
)


def _tensor_bytes(ne: tuple[int, ...], type_name: str) -> int:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name.upper()]]
    return math.prod(ne) // block * size


def seed_table(view: AdapterView) -> dict | None:
    """A factorized seed's rank and bytes against the full (vocab x width) f16 table it replaces,
    or None for other files."""
    if view.kind != "seeded_resampler_factorized" or not view.t5_vocab or not view.width:
        return None
    found = [
        view.tensors.get(n) for n in (PREFIX + "t5_embed_a.weight", PREFIX + "t5_embed_b.weight")
    ]
    if not all(found):
        return None
    stored = sum(_tensor_bytes(ne, ty) for ne, ty in found)
    full = view.t5_vocab * view.width * 2
    return {
        "rank": view.embed_rank,
        "bytes": stored,
        "full_bytes": full,
        "saved_bytes": full - stored,
    }


MAX_LIST_ITEMS = 32  # long KV arrays (an embedded vocabulary) are summarised, not dumped


def _short(value):
    if isinstance(value, list) and len(value) > MAX_LIST_ITEMS:
        return f"[{len(value)} items]"
    return value


def report_dict(view: AdapterView) -> dict:
    """JSON-serialisable summary with stable keys (the `inspect --json` output)."""
    return {
        "path": view.path,
        "kind": view.kind,
        "trainer_kind": trainer_kind(view),
        "geometry": {k: getattr(view, k) for k in GEOMETRY_KEYS},
        "metadata": {k: _short(v) for k, v in view.metadata.items()},
        "min_ggk": view.min_ggk,
        "problems": list(view.problems),
        "notes": list(view.notes),
        "tensors": len(view.tensors),
        "seed_table": seed_table(view),
        "taps": list(view.taps),
        "families": _families(view),
        "slots": _slots(view),
        "weight_type": weight_type(view),
    }


def _families(view: AdapterView) -> list[str]:
    if view.kind in slot_file.KINDS:
        return slot_file.slot_families(view.kind, {"n_bank": view.n_bank})
    return families_for(view.n_out_layers) if view.has_layer_map else []


def _slots(view: AdapterView) -> dict | None:
    """A slot kind's queries: max_slots, the seed table, the bank head; None for other files."""
    if view.kind not in slot_file.KINDS:
        return None
    tokens = view.metadata.get("tokenizer.ggml.tokens")
    return {
        "max_slots": view.num_queries, "seed_vocab": view.t5_vocab, "seed_rank": view.embed_rank,
        "n_bank": view.n_bank, "bank_dim": view.bank_dim, "bank_align": view.bank_align,
        "vocabulary": len(tokens) if isinstance(tokens, list) else 0,
        "tokenizer_pre": view.metadata.get("tokenizer.ggml.pre"),
        # ming_image: the Ling tokenizer.json rides as a tensor, one element per byte
        "tokenizer_json_bytes": next((int(info[0][0]) for n, info in view.tensors.items()
                                      if n.endswith("tokenizer_json")), 0),
    }


def _kind_line(view: AdapterView) -> str:
    label = {
        "seeded_resampler": "seeded resampler (full t5_embed table)",
        "seeded_resampler_factorized": "seeded resampler (factorized t5_embed_a/b)",
        "resampler": "seedless resampler (query only)",
        "token_aligned": "token-aligned",
        "qwen35_bridge": "Qwen3.5 bridge (slot resampler: MOSS-Image slots"
        + (", FLUX.3 Klein bank)" if view.n_bank else ")"),
        "ming_image": "Ming-Image adapter (slot resampler + caption queries)",
    }.get(view.kind or "", "no adapter")
    ext = [
        n
        for n, on in (
            ("skip", view.has_skip),
            ("vision_proj", view.has_vision_proj),
            ("vis_in", view.has_vis_in),
            ("layer_map", view.has_layer_map),
        )
        if on
    ]
    return label + (f" + {', '.join(ext)}" if ext else "")


def _seed_lines(view: AdapterView) -> list[str]:
    t = seed_table(view)
    if t is None:
        return []
    mib = 1024**2
    line = (
        f"  seed table     : factorized, rank {t['rank']}: {t['bytes'] / mib:.2f} MiB instead of "
        f"{t['full_bytes'] / mib:.2f} MiB for the full f16 table ({t['saved_bytes'] / mib:.2f} "
        "MiB saved)"
    )
    return [line]


def _tap_lines(view: AdapterView) -> list[str]:
    if not view.has_layer_map:
        return []
    n = view.n_out_layers or 0
    width = view.out_dim // n if n and view.out_dim else None
    taps = ", ".join(map(str, view.taps)) if view.taps else "unreadable"
    fams = families_for(n)
    return [
        f"  taps           : {n} ({taps}), {width} features each, concatenated in this order",
        "  accepted by    : "
        + (", ".join(fams) if fams else f"no ggk 0.9.7 family conditions on {n} layers")
        + " (the engine checks the count only)",
    ] + (
        [  # fibo2.hpp 217-221: edits with --llm-adapter need both
            f"  vision         : vision_proj + vis_in (vis_dim {view.vis_dim}): reference "
            + "images (Fibo 2.0 edits)"
        ]
        if view.has_vision_proj and view.has_vis_in
        else []
    )


def _slot_lines(view: AdapterView) -> list[str]:
    s = _slots(view)
    if s is None:
        return []
    bank = (
        f"{s['n_bank']} x {s['bank_dim']}" + (" token-aligned (bank_in)" if s["bank_align"] else "")
        if s["n_bank"]
        else "none"
    )
    ming = view.kind == "ming_image"
    vocab = (f"the Ling tokenizer.json, {s['tokenizer_json_bytes']} bytes (tokenizer_json)"
             if ming else f"{s['vocabulary']} tokens, pre-tokenizer {s['tokenizer_pre']!r}")
    return [
        (
            f"  slots          : up to {s['max_slots']} teacher tokens, seed table "
            f"{s['seed_vocab']} x rank {s['seed_rank']}, {'caption' if ming else 'bank'} {bank}"
        ),
        f"  vocabulary     : {vocab}",
        "  accepted by    : " + ", ".join(_families(view)),
    ]


def _type_line(view: AdapterView) -> str:
    """The file's export.dtype in words: what the engine keeps of it (ggml_extend.hpp 3692)."""
    ty = weight_type(view)
    return {
        "q8_0": "q8_0 (Q8_0 Linears whose input width is a multiple of 32, f16 the others; "
                "the engine computes them in Q8_0)",
        "bf16": "bf16 (bf16 Linears; the engine computes them in bf16)",
        "f16": "f16 (the engine's reference type)",
    }.get(ty, f"{ty} (every 2-D weight f32: exact, just larger)")


def format_report(view: AdapterView) -> str:
    """Human text: what the engine detects, provenance, minimum ggk, problems and notes."""
    g = view
    types: dict[str, int] = {}
    for _, ty in view.tensors.values():
        types[ty] = types.get(ty, 0) + 1
    lines = [
        f"{view.path}",
        f"  engine detects : {_kind_line(view)}",
        f"  geometry       : in={g.in_dim} out={g.out_dim} width={g.width} depth={g.depth} "
        f"heads={g.heads} "
        f"queries={g.num_queries} t5_vocab={g.t5_vocab} embed_rank={g.embed_rank} "
        f"vis_dim={g.vis_dim} "
        f"mlp={g.mlp_hidden}" + (f" layers={g.n_out_layers}" if g.has_layer_map else ""),
        f"  tensors        : {len(view.tensors)} ("
        + ", ".join(f"{n} {t}" for t, n in sorted(types.items()))
        + ")",
        f"  weight type    : {_type_line(view)}",
        *_seed_lines(view),
        *_tap_lines(view),
        *_slot_lines(view),
        "  minimum ggk    : "
        + (
            f"{view.min_ggk} (seedless resampler; older builds fail to load it)"
            if view.min_ggk
            else "none known (the contract's engine build loads it)"
        ),
    ]
    if view.metadata:
        lines.append("  provenance     :")
        lines += [
            f"    {k} = {_short(v)}"
            for k, v in view.metadata.items()
            if k.startswith(("adapter.", "general."))
        ]
    if view.problems:
        lines.append(f"  problems ({len(view.problems)}):")
        lines += [f"    - {p}" for p in view.problems]
    else:
        lines.append("  problems       : none")
    if view.notes:
        lines.append("  notes:")
        lines += [f"    - {n}" for n in view.notes]
    return "\n".join(lines)


def inspect_main(path: str, as_json: bool, out: TextIO | None = None) -> int:
    """Body of `gguf-trainer inspect FILE [--json]`: 1 when the file has problems, else 0.
    A non-GGUF file raises UserError (the CLI turns it into exit 1, exit_codes.EXIT_USER)."""
    out = out or sys.stdout
    view = read_adapter(path)
    if as_json:
        out.write(json.dumps(report_dict(view), indent=2, allow_nan=False) + "\n")
    else:
        out.write(format_report(view) + "\n")
    return 1 if view.problems else 0
