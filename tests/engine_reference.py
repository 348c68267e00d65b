"""An engine-faithful NumPy forward of an adapter GGUF, written from engine-contract §1.3–§2.

Independent of gguf_trainer.model.adapters and model.adapter_file on purpose: it has its own
reader (gguf.GGUFReader), its own variant detection (the §1.3 table, with the engine's
defaults for absent tensors) and its own math, so the tests compare two implementations.
Data is read the way the engine converts it on load (f16 -> f32, quants dequantized) and the
forward then runs in float64 so that the reference itself adds no visible error.

    out = engine_forward("adapter.gguf", hidden)   # hidden (L, in_dim), one unpadded prompt
"""

from __future__ import annotations

import math
import os

import gguf
import numpy as np

ENGINE_PREFIX = "text_encoders.llm_adapter."
HEAD_DIM = 64
EPS = 1e-5
DEFAULTS = {
    "in_dim": 1024,
    "out_dim": 4096,
    "width": 1024,
    "depth": 6,
    "num_queries": 120,
    "t5_vocab": 32128,
    "mlp_hidden": 4096,
}
_erf = np.vectorize(math.erf, otypes=[np.float64])


# The last file read, keyed by what changes when it is rewritten: GGUFReader takes ~16 s on a
# bridge export's 248k-token vocabulary, and a test runs several prompts through one file.
_LAST_READ: dict[tuple, dict[str, np.ndarray]] = {}


def read_engine_tensors(path) -> dict[str, np.ndarray]:
    """`rest` names (under text_encoders.llm_adapter.adapter.) -> float64 arrays, torch order
    (fresh copies: a caller may change them)."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _LAST_READ:
        _LAST_READ.clear()
        _LAST_READ[key] = _read_engine_tensors(path)
    return {name: a.copy() for name, a in _LAST_READ[key].items()}


def _read_engine_tensors(path) -> dict[str, np.ndarray]:
    reader = gguf.GGUFReader(path)
    out = {}
    for t in reader.tensors:
        name = t.name if t.name.startswith(ENGINE_PREFIX) else ENGINE_PREFIX + t.name
        rest = name[len(ENGINE_PREFIX) :]
        if not rest.startswith("adapter."):
            continue  # loaded into the map, never used
        torch_shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if t.tensor_type == gguf.GGMLQuantizationType.F16:
            data = np.asarray(t.data).astype(np.float32)  # the engine's f16 -> f32
        elif t.tensor_type == gguf.GGMLQuantizationType.F32:
            data = np.asarray(t.data, dtype=np.float32)
        else:
            data = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        out[rest[len("adapter.") :]] = data.reshape(torch_shape).astype(np.float64)
    return out


def detect(t: dict[str, np.ndarray]) -> dict:
    """§1.3 `detect_from_weights`; ne[i] of a tensor is torch shape[-1 - i]."""

    def ne(name, i):
        return t[name].shape[::-1][i] if name in t and t[name].ndim == 2 else None

    c = dict(DEFAULTS)
    c["resampler"] = "query" in t
    c["factorized"] = "t5_embed_a.weight" in t
    c["has_skip"] = "skip.weight" in t
    c["has_vis_in"] = "vis_in.weight" in t
    if c["resampler"]:
        c["width"], c["num_queries"] = ne("query", 0), ne("query", 1)
    if "in_proj.weight" in t:
        c["in_dim"] = ne("in_proj.weight", 0)
        if not c["resampler"]:
            c["width"] = ne("in_proj.weight", 1)
    if "out_proj.weight" in t:
        c["out_dim"] = ne("out_proj.weight", 1)
    if "blocks.0.mlp.0.weight" in t:
        c["mlp_hidden"] = ne("blocks.0.mlp.0.weight", 1)
    idx = [int(n.split(".")[1]) for n in t if n.startswith("blocks.")]
    if idx:
        c["depth"] = max(idx) + 1
    if not c["resampler"]:
        c["num_queries"] = c["t5_vocab"] = 0
    c["heads"] = c["width"] // HEAD_DIM
    # llm_adapter.hpp 114-115: n_out_layers = layer_map ne[0] (1-D); 260-263: the tensor is
    # declared only for n > 1. Default 1: a plain adapter is a one-layer stack.
    lm = t.get("layer_map")
    c["n_out_layers"] = int(lm.shape[0]) if lm is not None and lm.ndim == 1 else 1
    return c


def conditioner_stack(path_or_tensors, hidden, out_layers) -> np.ndarray:
    """What LLMEmbedder::encode_prompt hands on for a family with `out_layers` (conditioner.hpp
    2786-2840): the adapter's whole-template output, after the stack check that aborts unless
    the adapter's n_out_layers equals max(1, |out_layers|) (no tiling hook set)."""
    t = _tensors(path_or_tensors)
    model_stack = max(len(out_layers), 1)
    if detect(t)["n_out_layers"] != model_stack:
        raise RuntimeError(
            "llm adapter layer stack does not match this model's conditioning layers"
        )
    return engine_forward(t, hidden)


def tap_slices(stack: np.ndarray, n: int) -> list[np.ndarray]:
    """A layerwise row [n * D] as its n taps, in the ascending order the engine concatenates
    them (sd::ops::concat along dim 0 of the layer outputs, llm.hpp 1779-1815)."""
    d = stack.shape[-1] // n
    return [stack[..., k * d : (k + 1) * d] for k in range(n)]


FIBO2_TAPS = (5, 7, 9, 11, 13, 16, 18, 20, 22, 24, 27, 29, 31, 33, 35)  # fibo2.hpp 39-42
FIBO2_BUNDLES = ((9, 20, 31), (5, 16, 27), (7, 18, 29), (9, 20, 31), (11, 22, 33), (13, 24, 35))


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """fibo2.hpp round_bf16: round to nearest even on the dropped 16 bits."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def fibo2_bundles(states: np.ndarray, width: int) -> np.ndarray:
    """fibo2.hpp make_bundles (167-195), applied by get_learned_condition to whatever
    encode_prompt returned (the full teacher's taps or the adapter's output alike, 316-338):
    each tap RMS-normalised per token (no weight, eps 1e-6, the sum in double), bf16-rounded,
    then gathered into the six three-tap bundles. states (T, 15 * width) -> (T, 18 * width)."""
    taps = tap_slices(np.asarray(states, dtype=np.float32), len(FIBO2_TAPS))
    normed = []
    for x in taps:
        ms = (x.astype(np.float64) ** 2).sum(-1, keepdims=True) / width
        scale = (np.float32(1.0) / np.sqrt(ms.astype(np.float32) + np.float32(1e-6))).astype(
            np.float32
        )
        normed.append(_round_bf16((x * scale).astype(np.float32)))
    index = {layer: k for k, layer in enumerate(FIBO2_TAPS)}
    return np.concatenate(
        [normed[index[layer]] for bundle in FIBO2_BUNDLES for layer in bundle], axis=-1
    )


def _lin(t, name, x, bias=True):
    y = x @ t[name + ".weight"].T
    return y + t[name + ".bias"] if bias else y


def _ln(t, name, x):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * t[name + ".weight"] + t[name + ".bias"]


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _mha(t, name, xq, xkv, heads, key_mask=None):
    """§1.5: contiguous 64-wide heads, scores * 0.125, additive [Lk] mask, softmax over keys."""
    q, k, v = (_lin(t, f"{name}.{p}", x) for p, x in (("q", xq), ("k", xkv), ("v", xkv)))
    add = 0.0 if key_mask is None else np.where(key_mask, 0.0, -1e30)[None, :]
    heads_out = []
    for h in range(heads):
        s = slice(HEAD_DIM * h, HEAD_DIM * (h + 1))
        scores = q[:, s] @ k[:, s].T * 0.125 + add
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        heads_out.append((scores / scores.sum(-1, keepdims=True)) @ v[:, s])
    return _lin(t, f"{name}.o", np.concatenate(heads_out, axis=-1))


def _mlp(t, b, x):
    return _lin(t, f"{b}.mlp.2", _gelu(_lin(t, f"{b}.mlp.0", _ln(t, f"{b}.ln_mlp", x))))


def _tensors(path_or_tensors):
    return (
        path_or_tensors
        if isinstance(path_or_tensors, dict)
        else read_engine_tensors(path_or_tensors)
    )


def engine_forward(path_or_tensors, hidden, seed_ids=None, vis=None, key_mask=None) -> np.ndarray:
    """One prompt: hidden (L, in_dim) -> (Q, out_dim) or (L, out_dim), per §2.
    seed_ids (Q,) for seeded files; vis (L, vis_dim) raw embeds with zeros off-image."""
    t = _tensors(path_or_tensors)
    c = detect(t)
    h = np.asarray(hidden, dtype=np.float64)
    if c["resampler"]:
        kv = _lin(t, "in_proj", h)  # computed once, shared by all blocks
        q = t["query"].copy()
        if c["factorized"]:
            q = q + t["t5_embed_a.weight"][seed_ids] @ t["t5_embed_b.weight"].T
        elif "t5_embed.weight" in t:
            q = q + t["t5_embed.weight"][seed_ids]
        for i in range(c["depth"]):
            b = f"blocks.{i}"
            x = _ln(t, f"{b}.ln_self", q)
            q = q + _mha(t, f"{b}.self_attn", x, x, c["heads"])
            q = q + _mha(
                t,
                f"{b}.cross_attn",
                _ln(t, f"{b}.ln_q", q),
                _ln(t, f"{b}.ln_kv", kv),
                c["heads"],
                key_mask,
            )
            q = q + _mlp(t, b, q)
        return _lin(t, "out_proj", _ln(t, "ln_out", q))
    if vis is not None and "vision_proj.weight" not in t:
        # §3.2: the conditioner asserts "ref-image conditioning needs a vision-ext adapter"
        raise ValueError(
            "reference images need a vision-ext adapter (vision_proj); this file is text-only"
        )
    x = _lin(t, "in_proj", h)
    if vis is not None and c["has_vis_in"]:
        x = x + _lin(t, "vis_in", np.asarray(vis, dtype=np.float64), bias=False)
    for i in range(c["depth"]):
        b = f"blocks.{i}"
        y = _ln(t, f"{b}.ln_self", x)
        x = x + _mha(t, f"{b}.self_attn", y, y, c["heads"], key_mask)
        x = x + _mlp(t, b, x)
    out = _lin(t, "out_proj", _ln(t, "ln_out", x))
    if c["has_skip"]:
        out = out + _lin(t, "skip", h)  # skip reads the raw student states
    return out


def vision_project(path_or_tensors, e_raw) -> np.ndarray:
    """The engine's splice map, run outside the adapter: (n, vis_dim) -> (n, in_dim), no bias."""
    return np.asarray(e_raw, dtype=np.float64) @ _tensors(path_or_tensors)["vision_proj.weight"].T


def slot_inputs(t, hidden, seed_ids, vis=None, vis_slot=None):
    """What the slot kinds (the bridge, Ming) start from: kv = in_proj(hidden) ++ the vision
    rows through vis_in; the seeded slot queries slot_query[:P] + seed_proj(seed_embed[ids]),
    plus vis_q(vis_slot) at image slots. Returns (kv, q)."""
    ids = np.asarray(seed_ids)
    kv = _lin(t, "in_proj", np.asarray(hidden, dtype=np.float64))
    if vis is not None:
        kv = np.concatenate([kv, np.asarray(vis, np.float64) @ t["vis_in.weight"].T], 0)
    q = t["slot_query"][: len(ids)] + t["seed_embed.weight"][ids] @ t["seed_proj.weight"].T
    if vis_slot is not None:
        q = q + np.asarray(vis_slot, np.float64) @ t["vis_q.weight"].T
    return kv, q


def slot_blocks(t, q, kv) -> np.ndarray:
    """The slot kinds' resampler blocks over q (self-attention, cross-attention to kv, MLP;
    depth and heads read off the file), then ln_out."""
    heads = t["slot_query"].shape[1] // HEAD_DIM
    depth = max(int(n.split(".")[1]) for n in t if n.startswith("blocks.")) + 1
    for i in range(depth):
        b = f"blocks.{i}"
        x = _ln(t, f"{b}.ln_self", q)
        q = q + _mha(t, f"{b}.self_attn", x, x, heads)
        q = q + _mha(t, f"{b}.cross_attn", _ln(t, f"{b}.ln_q", q), _ln(t, f"{b}.ln_kv", kv), heads)
        q = q + _mlp(t, b, q)
    return _ln(t, "ln_out", q)


def slot_forward(path_or_tensors, hidden, seed_ids, vis=None, vis_slot=None, want_bank=False,
                 bank_hidden=None) -> np.ndarray:
    """The Qwen3.5 bridge (llm_adapter.hpp 753-837) for one prompt, from the file alone:
    hidden (L, in_dim), seed_ids (P,), vis (V, vis_dim) raw mmproj rows, vis_slot (P, vis_dim),
    bank_hidden (n_bank, in_dim) -> slots (P, out_dim) or the bank (n_bank, bank_dim). No
    masks anywhere: the engine runs one unpadded prompt."""
    t = _tensors(path_or_tensors)
    bank = "out_bank.weight" in t and "bank_query" in t  # bank_dim 0 turns n_bank off (752-755)
    kv, q = slot_inputs(t, hidden, seed_ids, vis, vis_slot)
    n_bank = 0
    if bank:
        lead = t["bank_query"].copy()
        if bank_hidden is not None:
            lead = lead + np.asarray(bank_hidden, np.float64) @ t["bank_in.weight"].T
        n_bank = lead.shape[0]
        q = np.concatenate([lead, q], 0)
    q = slot_blocks(t, q, kv)
    if want_bank:
        return _lin(t, "out_bank", q[:n_bank])
    return _lin(t, "out_proj", q[n_bank:])
