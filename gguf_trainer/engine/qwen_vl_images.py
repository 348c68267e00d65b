"""Reference images as ggk's MageFlow conditioner sees them (engine-contract §3.2).

Owns: the target size (each side rounded to a multiple of 32, a long side over 384 scaled
down with the engine's floor rule, in double as conditioner.hpp 3176-3181 computes it),
`clip_preprocess` (nearest resize to cover the target, centre crop, clamp, OpenAI-CLIP
normalisation; the shapes where the engine's own clip_preprocess throws are refused,
`engine_refuses`), the vision-token count, and the
patch rows the Qwen3-VL vision tower takes (Qwen2VLImageProcessor's layout: the still frame
duplicated over the temporal patch, merge blocks contiguous). Must not: run a model.

    th, tw = target_size(h, w)              # (h̄, w̄), multiples of 32, long side ≤ 384
    n = vision_tokens(h, w)                 # (h̄/32)·(w̄/32) ≤ 144
    x = preprocess_image(path)              # (3, h̄, w̄) float32, CLIP-normalised
    rows, (t, gh, gw) = patchify(x)         # (gh·gw, 3·2·16·16) and the grid for grid_thw
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from gguf_trainer.engine.c_round import c_round

PATCH = 16
MERGE = 2
TEMPORAL = 2
FACTOR = PATCH * MERGE  # 32: one vision token per 32×32 cell
MAX_SIDE = 384
MAX_TOKENS = (MAX_SIDE // FACTOR) ** 2  # 144
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def target_size(h: int, w: int) -> tuple[int, int]:
    """(h̄, w̄): h̄ = max(32, round(h/32)·32), w̄ likewise; when max(h, w) > 384,
    β = 384/max(h, w) and each side is max(32, ⌊side·β/32⌋·32), all in double as the engine
    computes them (float32 gave another size for ~4 % of shapes: 401×535 → 256×384, not the
    engine's 256×352)."""
    if h < 1 or w < 1:
        raise ValueError(f"an image of {w}×{h} pixels has no content")
    if max(h, w) <= MAX_SIDE:
        return tuple(max(FACTOR, c_round(s / FACTOR) * FACTOR) for s in (h, w))
    beta = MAX_SIDE / max(h, w)
    return tuple(max(FACTOR, math.floor(s * beta / FACTOR) * FACTOR) for s in (h, w))


def resized_size(h: int, w: int, th: int, tw: int) -> tuple[int, int]:
    """The engine's clip_preprocess resize (util.cpp 777-786): scale = max(tw/w, th/h) and
    (⌊scale·h⌋, ⌊scale·w⌋), all in float32."""
    scale = max(np.float32(tw) / np.float32(w), np.float32(th) / np.float32(h))
    return int(np.float32(scale) * np.float32(h)), int(np.float32(scale) * np.float32(w))


def engine_refuses(h: int, w: int, size=target_size) -> bool:
    """Whether the engine cannot take an h×w reference image: float32 rounding leaves its
    resize a pixel short of the target and its centre crop reads past the picture (the
    engine's clip_preprocess throws; ~4 % of shapes, e.g. 78×592 → 32×384). `size` is the
    family's size rule (MageFlow's by default; another pack passes its own). A rule flagged
    `direct_resize` (Qwen Image 2.1: a nearest resize straight to the size, no crop) never
    throws."""
    if getattr(size, "direct_resize", False):
        return False
    th, tw = size(h, w)
    rh, rw = resized_size(h, w, th, tw)
    return rh < th or rw < tw


def vision_tokens(h: int, w: int, size=target_size) -> int:
    """Vision tokens of an h×w picture after the engine's preprocessing (MageFlow: at most 144)."""
    th, tw = size(h, w)
    return (th // FACTOR) * (tw // FACTOR)


def nearest_resize(x: np.ndarray, rh: int, rw: int) -> np.ndarray:
    """Nearest resize of (h, w, c) to (rh, rw) with the integer index out·in // out_size."""
    h, w = x.shape[:2]
    rows = np.arange(rh, dtype=np.int64) * h // rh
    cols = np.arange(rw, dtype=np.int64) * w // rw
    return x[rows][:, cols]


def clip_preprocess(x: np.ndarray, th: int, tw: int) -> np.ndarray:
    """(th, tw, 3) from an (h, w, 3) float image in [0, 1]: nearest resize to resized_size,
    centre crop, clamp to [0, 1], (x − mean) / std. ValueError where the engine throws (the
    resize is short of the target): such an image cannot be used with the engine."""
    h, w = x.shape[:2]
    rh, rw = resized_size(h, w, th, tw)
    if rh < th or rw < tw:
        raise ValueError(
            f"the engine cannot preprocess a {w}×{h} picture (its resize to cover "
            f"{tw}×{th} comes out {rw}×{rh}, and its crop then throws); crop or resize it"
        )
    x = nearest_resize(x, rh, rw)
    top, left = (x.shape[0] - th) // 2, (x.shape[1] - tw) // 2
    x = np.clip(x[top : top + th, left : left + tw], 0.0, 1.0)
    return (x - np.array(CLIP_MEAN, dtype=np.float32)) / np.array(CLIP_STD, dtype=np.float32)


def load_rgb(path: Path | str) -> np.ndarray:
    """(h, w, 3) float32 in [0, 1]. Raises OSError/ValueError for a file that is not an image."""
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.float32) / np.float32(255.0)


def preprocess_image(path: Path | str, size=target_size) -> np.ndarray:
    """(3, h̄, w̄) float32: the picture at `path` as the engine hands it to the vision tower,
    sized by the family's rule `size` (MageFlow's by default)."""
    x = load_rgb(path)
    th, tw = size(*x.shape[:2])
    return np.ascontiguousarray(clip_preprocess(x, th, tw).transpose(2, 0, 1))


def patchify(pixels: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
    """The vision tower's input rows for one preprocessed image (3, H, W): the frame repeated
    over the temporal patch, cut into 16-px patches ordered merge block by merge block (the 4
    patches a merged token pools are consecutive rows), each row (c, t, py, px) flattened —
    exactly Qwen2VLImageProcessor's layout. Returns (rows (gh·gw, 1536) float32, (1, gh, gw))."""
    c, hh, ww = pixels.shape
    gh, gw = hh // PATCH, ww // PATCH
    if gh % MERGE or gw % MERGE or gh * PATCH != hh or gw * PATCH != ww:
        raise ValueError(
            f"a preprocessed image must be a multiple of {FACTOR} px per side, not {ww}×{hh}"
        )
    frames = np.repeat(pixels[None], TEMPORAL, axis=0)  # (t, c, H, W)
    x = frames.reshape(1, TEMPORAL, c, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return (
        np.ascontiguousarray(x.reshape(gh * gw, c * TEMPORAL * PATCH * PATCH), dtype=np.float32),
        (1, gh, gw),
    )
