"""Reference images as ggk 0.9.7 hands them to Qwen Image 2.1's text encoder (an edit run).

Unlike MageFlow's (mageflow_images.py) these are resized by the PIPELINE, not by the
conditioner, and the size depends on the render: gk-diffuser.cpp 6017-6072 (preset "qwen",
resize_before_vae, no vae_input_max_pixels) takes the render area A = W·H of the request
(default_pixels, 6027) and sizes reference i of w×h pixels as

    w̄' = sqrt((A·w) // h)   (integer product and division, then a double sqrt)
    h̄' = w̄'·h / w            (double)
    each side max(32, round(side / 32)·32)

then a nearest resize (index = out·in // out_size, core/tensor.hpp 1283) straight to (w̄, h̄),
no crop; the conditioner (conditioner.hpp 3090-3102) composites the alpha over white and
scales to 2x − 1 (the tower's mean/std 0.5), in float32. The picture keeps 4 channels (the CLI
loads references as RGBA, main.cpp 722-725; get_image_channels is 4 for this family).

The render (W, H): the request's -W/-H aligned up to 32 (align_image_size: VAE 16 × patch 2);
a sample record may name it as "render": [W, H]; without one the corpus assumes the family's
default output, 1024×1024 (sd_get_default_resolution, gk-diffuser.cpp 4943-4947), which the
pack's engine command passes explicitly.

    size = ref_size(h, w, area)            # (h̄, w̄), multiples of 32
    x = ref_pixels(path, size)             # (3, h̄, w̄) float32 in [-1, 1]
    item = RefImage(path, area)            # what the teacher's tower takes: item.pixels()
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gguf_trainer.base.errors import UserError
from gguf_trainer.engine.qwen_vl_images import FACTOR, nearest_resize

DEFAULT_RENDER = (1024, 1024)  # (W, H): the family's default output (gk-diffuser.cpp 4943-4946)


def _round_side(x: float) -> int:
    """max(32, round(x / 32)·32) with C's round (halves away from zero; x >= 0 here)."""
    q = x / FACTOR
    r = math.floor(q) + (1 if q - math.floor(q) >= 0.5 else 0)
    return max(FACTOR, r * FACTOR)


def ref_size(h: int, w: int, area: int) -> tuple[int, int]:
    """(h̄, w̄) of an h×w reference at a render of `area` pixels (gk-diffuser.cpp 6036-6044)."""
    if h < 1 or w < 1:
        raise ValueError(f"an image of {w}×{h} pixels has no content")
    vw = math.sqrt(float((int(area) * int(w)) // int(h)))
    vh = vw * h / w
    return _round_side(vh), _round_side(vw)


def default_ref_size(h: int, w: int) -> tuple[int, int]:
    """ref_size at the default 1024×1024 render: the pack's `image_size` (h, w) rule."""
    return ref_size(h, w, DEFAULT_RENDER[0] * DEFAULT_RENDER[1])


# The engine resizes these straight to the size (no cover-and-crop that could throw): the
# corpus refuses no shape for it (mageflow_images.engine_refuses reads this flag).
default_ref_size.direct_resize = True  # type: ignore[attr-defined]
# ... and it is the PIPELINE that sizes them, before the conditioner, which takes the sized
# pictures as they are (the engine tier hands its driver sized pictures; Fibo 2.0's
# conditioner sizes its own, from the picture as loaded).
default_ref_size.sized_by_pipeline = True  # type: ignore[attr-defined]


def align_render(w: int, h: int) -> tuple[int, int]:
    """The request size aligned up to multiples of 32 (align_image_size, gk-diffuser.cpp
    5183-5202)."""
    return tuple(-(-int(s) // FACTOR) * FACTOR for s in (w, h))


def render_area(extra: dict) -> int:
    """W·H of a sample's render: its record's "render": [W, H] (aligned as the engine aligns
    -W/-H), else the default 1024×1024. UserError for a malformed value."""
    render = extra.get("render")
    if render is None:
        return DEFAULT_RENDER[0] * DEFAULT_RENDER[1]
    ok = (isinstance(render, (list, tuple)) and len(render) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 16384
                  for v in render))
    if not ok:
        raise UserError(f"a sample's \"render\" is {render!r}; write it as [W, H], the -W and -H "
                        "of your ggk runs (1..16384 pixels each).")
    w, h = align_render(*render)
    return w * h


def load_rgba(path: Path | str) -> np.ndarray:
    """(h, w, 4) float32 in [0, 1], as the CLI loads a reference (4 channels; an RGB picture
    gets alpha 1). Raises OSError/ValueError for a file that is not an image."""
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGBA"), dtype=np.float32) / np.float32(255.0)


def ref_pixels(path: Path | str, size: tuple[int, int] | None = None, area: int = 0) -> np.ndarray:
    """(3, h̄, w̄) float32: the picture as the vision tower takes it, at `size` or at the size
    ref_size gives for `area`: nearest resize, alpha over white, 2x − 1 (float32 as the engine)."""
    x = load_rgba(path)
    th, tw = size or ref_size(x.shape[0], x.shape[1], area)
    x = nearest_resize(x, th, tw)
    rgb, alpha = x[..., :3], x[..., 3:]
    one, two = np.float32(1.0), np.float32(2.0)
    out = two * (rgb * alpha + one - alpha) - one
    return np.ascontiguousarray(out.transpose(2, 0, 1), dtype=np.float32)


@dataclass(frozen=True)
class RefImage:
    """One reference image of a sample with the render area the engine sizes it for."""

    path: Path
    area: int

    def pixels(self) -> np.ndarray:
        return ref_pixels(self.path, area=self.area)

    def __str__(self) -> str:  # error messages name the file
        return str(self.path)
