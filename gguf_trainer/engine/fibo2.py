"""ggk 0.9.7's Fibo 2.0 conditioner (conditioning/fibo2.hpp) as the qwen3vl_fibo2 pack needs it:
the caption port (format_prompt and its JSON parse, clean and dump, 57-151; the image markers of
edits, 292-316) and the reference images as it hands them to Qwen3-VL (231-319).

Owns, for captions: `fibo2_caption` (what the template carries between `<|im_start|>user\n` and
`<|im_end|>`: plain text as typed, a JSON object cleaned and dumped as nlohmann does, the empty
prompt the null caption, the edit JSON with one marker per image) and `expand_markers`.

Owns, for images: the size rule `fibo2_target_size` (a long side over 768 scaled to 768 with
llround, then each side rounded to the processor's 32-px grid within its pixel bounds 3136 ..
1605632, all in double as the engine computes it), `resize_8bit` (the engine's antialiased
bicubic, a = -0.75, edge-clamped taps normalised per output pixel, accumulated in double, then
rounded to 8 bit: core/tensor.hpp 873-1030, fibo2.hpp 198-208), and `preprocess_fibo2`: the
picture as the vision tower takes it, 2·v − 1 (Qwen3-VL's mean = std = 0.5). The engine never
refuses a reference for its shape (no crop that can fall short, unlike MageFlow's
clip_preprocess).
Must not: run a model.

    th, tw = fibo2_target_size(h, w)        # (h̄, w̄), multiples of 32, long side <= 768
    x = preprocess_fibo2(path)              # (3, h̄, w̄) float32 in [-1, 1]
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path

import numpy as np

from gguf_trainer.engine.c_round import c_round
from gguf_trainer.engine.qwen_ids import IMAGE_PAD, VISION_END, VISION_START
from gguf_trainer.engine.qwen_vl_images import FACTOR, load_rgb

MAX_SIDE = 768  # kDefaultSide: the fibo2 preset's vlm_max_size (model.hpp 46-58)
MIN_AREA = 3136  # kMinArea / kMaxArea: the processor's pixel bounds on the 32 px grid
MAX_AREA = 1605632
CUBIC_A = -0.75  # cubic_interpolate_weight: PyTorch's bicubic


def vlm_size(h: int, w: int, side: int = MAX_SIDE) -> tuple[int, int]:
    """(h, w) after the longest-side step (fibo2.hpp 238-245): unchanged unless max(h, w) >
    side, else each side max(1, llround(side · side / max))."""
    if h < 1 or w < 1:
        raise ValueError(f"an image of {w}×{h} pixels has no content")
    if max(h, w) <= side:
        return h, w
    scale = float(side) / float(max(h, w))
    return max(1, c_round(h * scale)), max(1, c_round(w * scale))


def fibo2_target_size(h: int, w: int, side: int = MAX_SIDE) -> tuple[int, int]:
    """(h̄, w̄) the vision tower sees for an h×w reference (fibo2.hpp 238-258)."""
    h, w = vlm_size(h, w, side)
    hb, wb = c_round(h / FACTOR) * FACTOR, c_round(w / FACTOR) * FACTOR
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
    3731-3733, 5872-5897), as load_rgb does."""
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


# ---------------------------------------------------------------- captions (fibo2.hpp 57-151)


NULL_CAPTION = (
    '{"short_description":"","objects":[],"background_setting":"","lighting":{},"aesthetics":{},'
    '"photographic_characteristics":{},"style_medium":"","context":"","artistic_style":""}'
)
IMAGE_MARKER = VISION_START + IMAGE_PAD + VISION_END  # one per reference (135)


def _empty(v) -> bool:
    return (
        v is None
        or (isinstance(v, str) and not v)
        or (isinstance(v, float) and math.isnan(v))
        or (isinstance(v, (list, dict)) and not v)
    )


def _clean(v):
    """fibo2.hpp clean_caption (64-86): drop empty values, recursively."""
    if isinstance(v, dict):
        return {k: c for k, c in ((k, _clean(x)) for k, x in v.items()) if not _empty(c)}
    if isinstance(v, list):
        return [c for c in map(_clean, v) if not _empty(c)]
    return v


def _number(text: str, kind):
    """A JSON number as nlohmann's parser reads it: an integer within int64 / uint64 stays one,
    a larger one becomes a double; a number that overflows a double is a parse error."""
    value = kind(text)
    if kind is int and -(2**63) <= value < 2**64:
        return value
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number overflow parsing {text!r}")
    return value


def _refuse(name: str):
    raise ValueError(f"{name} is not JSON")  # Python reads NaN / Infinity; nlohmann does not


def _parse(text: str):
    """nlohmann::json::parse(text, nullptr, false) (fibo2.hpp 91): a UTF-8 BOM is skipped, NaN /
    Infinity, numbers past a double and lone surrogates are errors (ValueError)."""
    value = json.loads(
        text.removeprefix("\ufeff"),
        parse_constant=_refuse,
        parse_float=lambda t: _number(t, float),
        parse_int=lambda t: _number(t, int),
    )
    json.dumps(value, ensure_ascii=False).encode("utf-8")  # UnicodeEncodeError: a lone surrogate
    return value


def _float(v: float) -> str:
    """A double as nlohmann's dump writes it (serializer dump_float -> to_chars / format_buffer):
    the shortest digits, fixed notation for decimal points 10^-3 .. 10^15, else d.igitse+XX."""
    if v == 0:
        return "-0.0" if math.copysign(1.0, v) < 0 else "0.0"
    _, digits, exp = Decimal(repr(abs(v))).as_tuple()
    d = "".join(map(str, digits)).rstrip("0")
    exp += len(digits) - len(d)
    k, n = len(d), len(d) + exp  # n: the decimal point's place after the first digit
    if k <= n <= 15:
        text = d + "0" * (n - k) + ".0"
    elif 0 < n <= 15:
        text = d[:n] + "." + d[n:]
    elif -4 < n <= 0:
        text = "0." + "0" * -n + d
    else:
        text = (
            d[0] + ("." + d[1:] if k > 1 else "") + f"e{'-' if n - 1 < 0 else '+'}{abs(n - 1):02d}"
        )
    return ("-" if v < 0 else "") + text


def _dump(v) -> str:
    """nlohmann::ordered_json::dump(): compact, keys in order, UTF-8 as is; strings, integers,
    booleans and null read as Python's json writes them, doubles as _float."""
    if isinstance(v, dict):
        return "{" + ",".join(f"{_dump(k)}:{_dump(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(map(_dump, v)) + "]"
    if isinstance(v, float):
        return _float(v)
    return json.dumps(v, ensure_ascii=False)


def _parse_prompt(text: str):
    """fibo2.hpp parse_prompt (88-123): (caption, edit instruction), None standing for JSON
    null; a prompt that is not a JSON object comes back as it is, with no instruction."""
    try:
        caption = _parse(text)
    except (ValueError, UnicodeError):
        return text, None
    if not isinstance(caption, dict):
        return text, None
    instruction = caption.pop("edit_instruction", None)
    if "structured_caption" in caption:
        caption = caption["structured_caption"]
        if not isinstance(caption, dict):
            return caption, instruction
    short = len(caption) == 2 and "short_description" in caption and "text_render" in caption
    for score in ("aesthetic_score", "preference_score"):
        caption.pop(score, None)
        for value in caption.values():
            if isinstance(value, dict):
                value.pop(score, None)
    caption = _clean(caption)
    if short:
        caption = {
            "short_description": caption.get("short_description", ""),
            "text_render": caption.get("text_render", []),
        }
    return caption, instruction


def fibo2_caption(text: str, num_images: int = 0) -> str:
    """fibo2.hpp format_prompt(text, num_images) (125-151): what the template carries between
    `<|im_start|>user\\n` and `<|im_end|>`, each image as one unexpanded marker."""
    caption, instruction = _parse_prompt(text)
    if num_images > 0:
        if instruction is None:  # a plain prompt with images is the edit instruction
            caption, instruction = None, text
        edit = {
            ("image" if num_images == 1 else f"image_{i + 1}"): IMAGE_MARKER
            for i in range(num_images)
        }
        if not _empty(caption):
            edit["structured_caption"] = caption
        edit["edit_instruction"] = instruction
        return _dump(edit)
    if not text:
        return NULL_CAPTION
    if isinstance(caption, str):
        return caption
    return "{}" if _empty(caption) else _dump(caption)


def expand_markers(prompt: str, counts) -> str:
    """fibo2.hpp 292-316: image i's marker (the first `<|image_pad|>` at or after the end of
    image i - 1's run) replaced by counts[i] pads."""
    at = 0
    for n in counts:
        pos = prompt.find(IMAGE_PAD, at)
        if pos < 0:
            raise ValueError(f"reference image marker {n} is missing from the prompt")
        run = IMAGE_PAD * n
        prompt = prompt[:pos] + run + prompt[pos + len(IMAGE_PAD) :]
        at = pos + len(run)
    return prompt
