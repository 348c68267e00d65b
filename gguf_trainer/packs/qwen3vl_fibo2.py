"""Fibo 2.0 pack (text-to-image): pig_clip + a 15-tap layerwise adapter replaces the
Qwen3-VL-4B-Instruct text encoder of Fibo 2.0 (engine-families §2 row 18).

Engine (ggk 0.9.7 conditioning/fibo2.hpp): the prompt `<|im_start|>user\\n{caption}<|im_end|>\\n
<|im_start|>assistant\\n` (227) tokenized as one piece (`{0, 0}`, 322-332), start 0, max 4096; the
caption is plain text as typed, a JSON object cleaned and dumped, and the empty prompt the null
caption (`format_prompt`, 88-151, ported below for prompts without images); taps {5, 7, 9, 11,
13, 16, 18, 20, 22, 24, 27, 29, 31, 33, 35} (39-42); the stack must be 15 x 2560 = 38400 wide
(336-340).

Normalisation. `get_learned_condition` hands `make_bundles` whatever `encode_prompt` returned
(342): the full teacher's taps and an adapter's output alike. make_bundles RMS-normalises every
tap (eps 1e-6, no weight), rounds to bf16 and gathers the bundles (167-193). So the adapter emits
the RAW tap stack and the engine normalises it once; the targets here are the raw taps
(tests/unit/test_layerwise_packs.py pins it against fibo2.hpp's arithmetic).

Teacher: Qwen3-VL-4B (hidden 2560, 36 layers; fibo2.hpp 49-53, the `qwen3vl-4b-it` GGUF of the
ggk README). Edits (references <= 768 px, a vision-ext layerwise adapter) come after the text-only
packs: not in this pack yet.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal

from ..template_padding import Padding
from .layerwise import LayerwisePack
from .qwen3vl_krea2 import Krea2Pack
from .teacher_repos import QWEN3VL_4B

NULL_CAPTION = (
    '{"short_description":"","objects":[],"background_setting":"","lighting":{},"aesthetics":{},'
    '"photographic_characteristics":{},"style_medium":"","context":"","artistic_style":""}'
)
FIBO2_WIDTH = 2560  # kTextWidth


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


def fibo2_caption(text: str) -> str:
    """fibo2.hpp format_prompt(text, 0) (88-151): the caption the template carries for a prompt
    with no reference image."""
    if not text:
        return NULL_CAPTION
    try:
        caption = _parse(text)
    except (ValueError, UnicodeError):
        return text
    if not isinstance(caption, dict):
        return text
    caption.pop("edit_instruction", None)
    if "structured_caption" in caption:
        caption = caption["structured_caption"]
        if not isinstance(caption, dict):  # returned as parse_prompt's caption (103), then 147-150
            return (
                caption if isinstance(caption, str) else "{}" if _empty(caption) else _dump(caption)
            )
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
    return "{}" if _empty(caption) else _dump(caption)


class Fibo2Pack(LayerwisePack):
    id = "qwen3vl_fibo2"
    title = "Fibo 2.0 text-to-image (Qwen3-VL-4B, 15 taps)"
    description = (
        "Replaces the Qwen3-VL-4B-Instruct text encoder of Fibo 2.0 (text-to-image) with pig_clip "
        "+ a layerwise adapter emitting the raw 15-layer stack (38400 wide); the engine "
        "normalises and bundles it."
    )
    family = "Fibo 2.0"
    serves = "Fibo 2.0 Dev (text-to-image)"
    taps = (5, 7, 9, 11, 13, 16, 18, 20, 22, 24, 27, 29, 31, 33, 35)
    one_piece = True
    padding = Padding(max_length=4096)  # kMaxLength: encode_prompt cuts longer templates, pads none
    max_len_student = max_len_teacher = 4096
    default_name = "qwen3vl_fibo2_adapter"
    shard_contract = "qwen3vl_fibo2/1"
    # Fibo2Conditioner builds the template itself: format_prompt and its helpers (members),
    # the prompt (lines) and the encode_prompt call with its range, start and max length (call)
    engine_template = {
        "file": "diffusion/src/conditioning/fibo2.hpp",
        "lines": (227, 227),
        "members": ((30, 43), (57, 151)),
        "call": (322, 332),
        "version": "VERSION_FIBO2",
    }
    teacher_materials = Krea2Pack.teacher_materials
    teacher_memory_gib = 9.0
    typical_rows = 200
    hints = {
        "train": "Targets: the 15 RAW Qwen3-VL-4B layers (the engine RMS-normalises them itself).",
        "eval": "Judge by cos and the per-tap cosines against their mean baselines.",
    }
    engine_command_template = (
        "ggk --diffusion-model <fibo2 dev DiT .gguf> --vae pig_flux2_vae_fp32-f16.gguf --llm "
        "{student} "
        '--llm-adapter {adapter} -p "a sheep in sunglasses" --cfg-scale 5 --steps 20 '
        "--sampling-method euler --diffusion-fa -o out.png"
    )
    engine_notes = (
        "Text-to-image only: edits need a vision-ext layerwise adapter, not in this pack yet.",
    )
    export_kv = {
        "adapter.teacher": QWEN3VL_4B,
        "adapter.teacher_tap": "layers 5,7,...,35 (raw)",
        "adapter.family": "Fibo 2.0",
    }

    def format_prompt(self, text: str) -> str:
        return self.prefix + fibo2_caption(text) + self.suffix


PACK = Fibo2Pack()
