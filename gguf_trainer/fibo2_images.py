"""Reference images as ggk's Fibo 2.0 conditioner hands them to Qwen3-VL (ggk 0.9.7
conditioning/fibo2.hpp 231-268), for the qwen3vl_fibo2 pack's edits.

Owns: the size rule `fibo2_target_size` (a long side over 768 scaled to 768 with llround, then
each side rounded to the processor's 32-px grid within its pixel bounds 3136 .. 1605632, all in
double as the engine computes it), `resize_8bit` (the engine's antialiased bicubic, a = -0.75,
edge-clamped taps normalised per output pixel, accumulated in double, then rounded to 8 bit:
core/tensor.hpp 873-1030, fibo2.hpp 198-208), and `preprocess_fibo2`: the picture as the
vision tower takes it, 2·v − 1 (Qwen3-VL's mean = std = 0.5). The engine never refuses a
reference for its shape (no crop that can fall short, unlike MageFlow's clip_preprocess).
Must not: run a model.

    th, tw = fibo2_target_size(h, w)        # (h̄, w̄), multiples of 32, long side <= 768
    x = preprocess_fibo2(path)              # (3, h̄, w̄) float32 in [-1, 1]
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .mageflow_images import FACTOR, load_rgb

MAX_SIDE = 768  # kDefaultSide: the fibo2 preset's vlm_max_size (model.hpp 46-58)
MIN_AREA = 3136  # kMinArea / kMaxArea: the processor's pixel bounds on the 32 px grid
MAX_AREA = 1605632
CUBIC_A = -0.75  # cubic_interpolate_weight: PyTorch's bicubic


def _llround(x: float) -> int:
    """std::llround for x >= 0 (halves away from zero), exact in double."""
    f = math.floor(x)
    return f + 1 if x - f >= 0.5 else f


def vlm_size(h: int, w: int, side: int = MAX_SIDE) -> tuple[int, int]:
    """(h, w) after the longest-side step (fibo2.hpp 238-245): unchanged unless max(h, w) >
    side, else each side max(1, llround(side · side / max))."""
    if h < 1 or w < 1:
        raise ValueError(f"an image of {w}×{h} pixels has no content")
    if max(h, w) <= side:
        return h, w
    scale = float(side) / float(max(h, w))
    return max(1, _llround(h * scale)), max(1, _llround(w * scale))


def fibo2_target_size(h: int, w: int, side: int = MAX_SIDE) -> tuple[int, int]:
    """(h̄, w̄) the vision tower sees for an h×w reference (fibo2.hpp 238-258)."""
    h, w = vlm_size(h, w, side)
    hb, wb = _llround(h / FACTOR) * FACTOR, _llround(w / FACTOR) * FACTOR
    if hb * wb > MAX_AREA:
        beta = math.sqrt(float(h) * w / MAX_AREA)
        hb = max(FACTOR, math.floor(h / beta / FACTOR) * FACTOR)
        wb = max(FACTOR, math.floor(w / beta / FACTOR) * FACTOR)
    elif hb * wb < MIN_AREA:
        beta = math.sqrt(MIN_AREA / (float(h) * w))
        hb = math.ceil(h * beta / FACTOR) * FACTOR
        wb = math.ceil(w * beta / FACTOR) * FACTOR
    return max(FACTOR, hb), max(FACTOR, wb)


def _cubic(x: np.ndarray) -> np.ndarray:
    a, x = CUBIC_A, np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    return np.where(x <= 1.0, near, np.where(x < 2.0, far, 0.0))


def _weights(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) float64: make_interpolate_contributors for antialiased bicubic, each
    output's taps (edge-clamped indices, zero weights dropped) divided by their sum."""
    scale = n_in / n_out
    fs = max(1.0, scale)
    out = np.zeros((n_out, n_in))
    for o in range(n_out):
        center = (o + 0.5) * scale - 0.5
        taps = np.arange(math.ceil(center - 2.0 * fs), math.floor(center + 2.0 * fs) + 1)
        wt = _cubic((center - taps) / fs)
        keep = wt != 0.0
        taps, wt = taps[keep], wt[keep]
        if not len(taps):  # the engine's fallback: the nearest pixel
            out[o, min(max(math.floor(center + 0.5), 0), n_in - 1)] = 1.0
            continue
        total = wt.sum()
        if abs(total) > 1e-12:
            wt = wt / total
        np.add.at(out[o], np.clip(taps, 0, n_in - 1), wt)
    return out


def resize_8bit(x: np.ndarray, th: int, tw: int) -> np.ndarray:
    """fibo2.hpp resize_8bit: (h, w, c) float32 in [0, 1] -> (th, tw, c) float32, the
    antialiased bicubic resize then round(v·255)/255 clamped to [0, 1]; the input unchanged
    when the size is."""
    h, w = x.shape[:2]
    if (h, w) == (th, tw):
        return x
    wy, wx = _weights(h, th), _weights(w, tw)
    v = np.einsum("yi,ijc,xj->yxc", wy, x.astype(np.float64), wx, optimize=True)
    v = v.astype(np.float32) * np.float32(255.0)  # float, as the engine stores and scales it
    v64 = v.astype(np.float64)
    f = np.floor(v64)
    r = (f + (v64 - f >= 0.5)).astype(np.float32)  # std::round (exact for v >= 0)
    return np.clip(r / np.float32(255.0), np.float32(0.0), np.float32(1.0))


def preprocess_fibo2(path: Path | str, side: int = MAX_SIDE) -> np.ndarray:
    """(3, h̄, w̄) float32: the picture at `path` as the engine hands it to Qwen3-VL's tower.
    The engine loads a Fibo 2.0 reference with 3 channels (alpha dropped, gk-diffuser.cpp
    3731-3733, 5872-5895), as load_rgb does."""
    x = load_rgb(path)
    h, w = vlm_size(*x.shape[:2], side)
    x = resize_8bit(x, h, w)
    th, tw = fibo2_target_size(*x.shape[:2], side)
    x = resize_8bit(x, th, tw)
    one = np.float32(1.0)
    x = x * one + one - one  # alpha 1 composited over white, in float as fibo2.hpp 266 rounds it
    rgb = np.float32(2.0) * np.clip(x, 0.0, 1.0) - one
    return np.ascontiguousarray(rgb.transpose(2, 0, 1), dtype=np.float32)


# The engine resizes a Fibo 2.0 reference straight to this size (no cover-and-crop that could
# fall short): the corpus refuses no shape (mageflow_images.engine_refuses reads the flag).
fibo2_target_size.direct_resize = True  # type: ignore[attr-defined]
