"""The tensors the ggk engine declares for each adapter variant (engine-contract §1.4): names
under `adapter.` and their ne shapes, from the detected geometry.

Usage: `expected_tensors("resampler", in_dim=..., ...)`; `view_expected(view)` for a read file.
"""

from __future__ import annotations

from gguf_trainer.model import slot_file
from gguf_trainer.model.adapter_view import GEOMETRY_KEYS, AdapterView, Shape

# ---------------------------------------------------------------- inventory (§1.4)


def _block_tensors(i: int, w, h, *, cross: bool) -> dict[str, Shape]:
    b = f"blocks.{i}."
    subs = ["self_attn", "cross_attn"] if cross else ["self_attn"]
    lns = ["ln_self", "ln_q", "ln_kv", "ln_mlp"] if cross else ["ln_self", "ln_mlp"]
    out: dict[str, Shape] = {}
    for ln in lns:
        out[b + ln + ".weight"] = (w,)
        out[b + ln + ".bias"] = (w,)
    for sub in subs:
        for p in "qkvo":
            out[f"{b}{sub}.{p}.weight"] = (w, w)
            out[f"{b}{sub}.{p}.bias"] = (w,)
    out[b + "mlp.0.weight"] = (w, h)
    out[b + "mlp.0.bias"] = (h,)
    out[b + "mlp.2.weight"] = (h, w)
    out[b + "mlp.2.bias"] = (w,)
    return out


def expected_tensors(
    kind: str,
    *,
    in_dim,
    out_dim,
    width,
    depth: int,
    mlp_hidden,
    num_queries=0,
    t5_vocab=0,
    embed_rank=0,
    vis_dim=0,
    n_out_layers=0,
    has_skip=False,
    has_vision_proj=False,
    has_vis_in=False,
    has_layer_map=False,
) -> dict[str, Shape]:
    """Every tensor the engine declares for this variant (names without `adapter.`, ne order).
    Sizes may be None (not detected); such elements are not compared."""
    w = width
    t: dict[str, Shape] = {}
    resampler = kind != "token_aligned"
    if resampler:
        t["query"] = (w, num_queries)
    if kind == "seeded_resampler":
        t["t5_embed.weight"] = (w, t5_vocab)
    if kind == "seeded_resampler_factorized":
        t["t5_embed_a.weight"] = (embed_rank, t5_vocab)
        t["t5_embed_b.weight"] = (embed_rank, w)
    t["in_proj.weight"] = (in_dim, w)
    t["in_proj.bias"] = (w,)
    for i in range(depth):
        t.update(_block_tensors(i, w, mlp_hidden, cross=resampler))
    t["ln_out.weight"] = (w,)
    t["ln_out.bias"] = (w,)
    t["out_proj.weight"] = (w, out_dim)
    t["out_proj.bias"] = (out_dim,)
    if not resampler:  # the extensions are presence-switched and token-aligned only
        if has_skip:
            t["skip.weight"] = (in_dim, out_dim)
            t["skip.bias"] = (out_dim,)
        if has_vision_proj:
            t["vision_proj.weight"] = (vis_dim, in_dim)
        if has_vis_in:
            t["vis_in.weight"] = (vis_dim, w)
        if has_layer_map:
            t["layer_map"] = (n_out_layers,)
    return t


def view_expected(view: AdapterView) -> dict[str, Shape]:
    if view.kind in slot_file.KINDS:
        g = {k: getattr(view, k) for k in ("width", "num_queries", "in_dim", "embed_rank",
                                            "t5_vocab", "vis_dim", "out_dim", "n_bank",
                                            "bank_dim", "bank_align")}
        blocks = {}
        for i in range(view.depth or 0):
            blocks.update(_block_tensors(i, view.width, view.mlp_hidden, cross=True))
        return {**slot_file.slot_tensors(view.kind, g), **blocks}
    sizes = {k: getattr(view, k) for k in GEOMETRY_KEYS if k not in ("depth", "heads")}
    return expected_tensors(view.kind, depth=view.depth or 0, **sizes)

