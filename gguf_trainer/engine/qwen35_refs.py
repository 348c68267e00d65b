"""Reference images as ggk 0.9.7's Qwen3.5 bridge hands them to the Qwen3.5 vision tower
(conditioner.hpp 4296-4330, Qwen35BridgeEmbedder::get_learned_condition; engine-families §2 rows
20-21): Qwen's smart resize to multiples of patch × merge (32), the area clamped to
[65536, max_pixels] (1024² unless `--ref-image-args vlm_max_size=S`: S²), then
`sd::ops::interpolate` in Bilinear mode WITH antialias (core/tensor.hpp 908-1030: the triangle
filter widened by the downscale factor, centres at (o + 0.5)·scale − 0.5, out-of-range taps
clamped to the edge pixel, weights normalised, summed in double), alpha composited over white,
then 2x − 1. Must not: run a model.

    w_bar, h_bar = smart_size(w, h)             # multiples of 32
    x = bridge_pixels(rgba)                     # (3, h̄, w̄) float32 in [-1, 1]
    starts = image_slot_starts(bpe.encode, [64, 16])   # each image's first <|image_pad|> slot
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

FACTOR = 32  # the Qwen3.5 tower's patch_size (16) x spatial_merge_size (2)
MIN_PIXELS = 65536
MAX_PIXELS = 1024 * 1024


def smart_size(width: int, height: int, max_pixels: int = MAX_PIXELS,
               factor: int = FACTOR) -> tuple[int, int]:
    """(w̄, h̄) as conditioner.hpp 4306-4317 computes them, in double."""
    def round_to(v: float) -> int:
        return max(factor, int(_llround(v / factor)) * factor)

    h_bar, w_bar = round_to(float(height)), round_to(float(width))
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(float(height) * width / float(max_pixels))
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < MIN_PIXELS:
        beta = math.sqrt(float(MIN_PIXELS) / (float(height) * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return w_bar, h_bar


def _llround(x: float) -> float:
    """C's llround: halves away from zero (Python's round is to even)."""
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)


def bilinear_weights(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) float64: make_interpolate_contributors for Bilinear with antialias."""
    scale = n_in / n_out
    fs = max(1.0, scale)
    out = np.zeros((n_out, n_in))
    for o in range(n_out):
        center = (o + 0.5) * scale - 0.5
        taps = []
        for i in range(math.ceil(center - fs), math.floor(center + fs) + 1):
            w = max(0.0, 1.0 - abs((center - i) / fs))
            if w != 0.0:
                taps.append((min(max(i, 0), n_in - 1), w))
        total = sum(w for _, w in taps)
        if not taps:
            taps, total = [(min(max(math.floor(center + 0.5), 0), n_in - 1), 1.0)], 0.0
        for i, w in taps:
            out[o, i] += w / total if abs(total) > 1e-12 else w
    return out


def resize(x: np.ndarray, w_bar: int, h_bar: int) -> np.ndarray:
    """(H, W, C) float -> (h̄, w̄, C) float32 by the engine's antialiased bilinear filter (the
    identity when the size is already right, as the engine returns its input)."""
    h, w = x.shape[:2]
    if (h, w) == (h_bar, w_bar):
        return x.astype(np.float32)
    wy, wx = bilinear_weights(h, h_bar), bilinear_weights(w, w_bar)
    out = np.einsum("yh,hwc,xw->yxc", wy, x.astype(np.float64), wx, optimize=True)
    return out.astype(np.float32)


def bridge_pixels(image: np.ndarray, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """(H, W, 3 or 4) float in [0, 1] -> (3, h̄, w̄) float32: resized, alpha over white, 2x − 1
    (conditioner.hpp 4318-4330)."""
    h, w = image.shape[:2]
    w_bar, h_bar = smart_size(w, h, max_pixels)
    r = resize(image, w_bar, h_bar)
    rgb = r[..., :3]
    if r.shape[2] == 4:
        a = r[..., 3:4]
        rgb = rgb * a + 1.0 - a
    return np.ascontiguousarray((2.0 * rgb - 1.0).transpose(2, 0, 1), dtype=np.float32)


def image_slot_starts(encode, counts) -> list[int]:
    """Each reference's first `<|image_pad|>` slot, as the engine counts it: the ids of the
    prompt built so far, up to and including that image's `<|vision_start|>`
    (conditioner.hpp 4336-4349: index = encode(prompt).size(), then `count` pads and
    `<|vision_end|>`). `encode` is the Qwen3.5 tokenizer's (qwen35_bpe.EngineQwen35BPE)."""
    from gguf_trainer.engine.qwen35_bpe import IMAGE_PAD, PREFIX

    prompt, starts = PREFIX, []
    for n in counts:
        prompt += "<|vision_start|>"
        starts.append(len(encode(prompt)))
        prompt += IMAGE_PAD * n + "<|vision_end|>"
    return starts


def vision_grid(width: int, height: int, max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """(grid_h, grid_w) of merged vision rows a width x height reference gives (h̄/32, w̄/32):
    the tower emits grid_h * grid_w rows (conditioner.hpp 3530-3531, the full MOSS path's
    image extras)."""
    w_bar, h_bar = smart_size(width, height, max_pixels)
    return h_bar // FACTOR, w_bar // FACTOR


def load_image(path: Path | str) -> np.ndarray:
    """A picture as (H, W, 3 or 4) float32 in [0, 1] (alpha kept when the file has one)."""
    from PIL import Image, ImageOps

    with Image.open(path) as im:
        im = ImageOps.exif_transpose(im)
        has_alpha = im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info
        im = im.convert("RGBA" if has_alpha else "RGB")
        return np.asarray(im, dtype=np.float32) / 255.0
