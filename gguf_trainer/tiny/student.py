"""Tiny pig_clip-layout students: a small Qwen3Model and its GGUF, as the shipped file is laid out.

Owns: the tiny dimensions, a deterministic tiny Qwen3, writing it as a student GGUF with HF
or llama.cpp names in F32/F16/BF16/Q8_0/Q4_K/Q6_K, and a tokenizer folder for it.
Must not: be used for real materials. Tests, benchmarks and the offline demo build here.

Usage:
    stored = {}
    write_tiny_student(path, dtype="Q4_K", hidden=256, intermediate=512, record=stored)
    # `stored` now holds the dequantized values the file holds, by HF state-dict name
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import torch
import transformers
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from gguf_trainer.base.atomic import atomic_path, write_text
from gguf_trainer.base.paths import TINY_GGUF_KEY, TINY_MARKER
from gguf_trainer.model.student import LLAMACPP_GLOBAL, LLAMACPP_LAYER, qwen3_config
from gguf_trainer.tiny import qwen_tokenizer_dir

log = logging.getLogger(__name__)

TINY_DIMS = {"hidden": 64, "layers": 2, "heads": 2, "kv_heads": 1, "head_dim": 128,
             "intermediate": 128, "vocab": 151936}
INIT_STD = 0.05  # large enough that states are not degenerate after a few layers
QK = 256  # K-quant super-block
NAME_STYLES = ("hf", "llamacpp")
TINY_NOTE = "a tiny stand-in built by gguf_trainer.tiny.student; never a real pig_clip"
DTYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_K", "Q6_K")


def tiny_qwen3_config(**overrides) -> transformers.Qwen3Config:
    """TINY_DIMS (with overrides, same keys) as the engine's Qwen3 config."""
    unknown = set(overrides) - set(TINY_DIMS)
    if unknown:
        raise TypeError(f"unknown tiny dims: {sorted(unknown)}")
    return qwen3_config(**{**TINY_DIMS, **overrides})


def build_tiny_qwen3(seed: int = 0, **overrides) -> transformers.Qwen3Model:
    """float32, eval, deterministic: N(0, 0.05) weights, norm weights 1 + N(0, 0.05)."""
    config = tiny_qwen3_config(**overrides)
    with torch.device("meta"):
        model = transformers.Qwen3Model(config)
    model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32) * INIT_STD
            param.copy_(noise + 1.0 if param.ndim == 1 else noise)
    model.rotary_emb = type(model.rotary_emb)(config=config)  # to_empty left its buffers garbage
    return model.float().eval().requires_grad_(False)


# ---------------------------------------------------------------- K-quant blocks


def _pack_q4_k(blocks: np.ndarray) -> np.ndarray:
    """(n, 256) float32 -> (n, 144) uint8 valid Q4_K blocks (asymmetric, per 32 values)."""
    n = blocks.shape[0]
    x = blocks.reshape(n, 8, 32)
    low = np.minimum(x.min(-1), 0.0)
    scale, mins = (x.max(-1) - low) / 15.0, -low  # (n, 8) each, >= 0
    d = (scale.max(-1) / 63.0).astype(np.float16)
    dmin = (mins.max(-1) / 63.0).astype(np.float16)
    sc = _ratio(scale, d.astype(np.float32)[:, None]).clip(0, 63).astype(np.uint8)
    m = _ratio(mins, dmin.astype(np.float32)[:, None]).clip(0, 63).astype(np.uint8)
    step = d.astype(np.float32)[:, None] * sc  # (n, 8)
    offset = dmin.astype(np.float32)[:, None] * m
    q = _ratio(x + offset[..., None], step[..., None]).clip(0, 15).astype(np.uint8)  # (n, 8, 32)
    packed_scales = np.concatenate([
        sc[:, :4] | ((sc[:, 4:] >> 4) << 6),
        m[:, :4] | ((m[:, 4:] >> 4) << 6),
        (sc[:, 4:] & 0xF) | ((m[:, 4:] & 0xF) << 4),
    ], axis=1)
    q = q.reshape(n, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, 128)
    head = [d[:, None].view(np.uint8), dmin[:, None].view(np.uint8)]
    return np.concatenate([*head, packed_scales, qs], axis=1)


def _pack_q6_k(blocks: np.ndarray) -> np.ndarray:
    """(n, 256) float32 -> (n, 210) uint8 valid Q6_K blocks (symmetric, per 16 values)."""
    n = blocks.shape[0]
    x = blocks.reshape(n, 16, 16)
    scale = np.abs(x).max(-1) / 31.0  # (n, 16)
    d = (scale.max(-1) / 127.0).astype(np.float16)
    sc = _ratio(scale, d.astype(np.float32)[:, None]).clip(-128, 127).astype(np.int8)
    step = d.astype(np.float32)[:, None] * sc
    q = (_ratio(x, step[..., None]).clip(-32, 31) + 32).astype(np.uint8).reshape(n, 256)
    low, high = (q & 0xF).reshape(n, 2, 2, 64), (q >> 4).reshape(n, 2, 4, 32)
    ql = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(n, 128)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    qh = qh.reshape(n, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), d[:, None].view(np.uint8)], axis=1)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """round(num / den), 0 where den is 0 (den broadcasts against num)."""
    den = np.asarray(den, dtype=np.float32)
    return np.where(den > 0, np.rint(num / np.where(den > 0, den, 1.0)), 0.0)


_KQUANT_PACKERS = {"Q4_K": _pack_q4_k, "Q6_K": _pack_q6_k}


def _storage_type(dtype: str, row: int) -> str:
    """What a 2-D weight with rows of `row` values is stored as (llama.cpp-style fallbacks)."""
    if dtype in _KQUANT_PACKERS and row % QK:
        dtype = "Q8_0"
    if dtype == "Q8_0" and row % 32:
        dtype = "F16"
    return dtype


def encode_tensor(arr: np.ndarray, dtype: str) -> tuple[np.ndarray, GGMLQuantizationType,
                                                        np.ndarray]:
    """(data for GGUFWriter, ggml type, the float32 values the file then holds)."""
    if arr.ndim == 1 or dtype == "F32":
        data = np.ascontiguousarray(arr, dtype=np.float32)
        return data, GGMLQuantizationType.F32, data
    stored_as = _storage_type(dtype, arr.shape[-1])
    if stored_as != dtype:
        log.debug("rows of %d values cannot be %s; storing %s", arr.shape[-1], dtype, stored_as)
    dtype = stored_as
    qtype = GGMLQuantizationType[dtype]
    if dtype == "F16":
        data = arr.astype(np.float16)
    elif dtype in _KQUANT_PACKERS:  # gguf cannot quantize K-quants: build the blocks here
        blocks = _KQUANT_PACKERS[dtype](arr.reshape(-1, QK).astype(np.float32))
        data = blocks.reshape(arr.shape[0], -1)
    else:
        data = quantize(arr.astype(np.float32), qtype)
    return data, qtype, dequantize(data, qtype).astype(np.float32).reshape(arr.shape)


def gguf_name(name: str, names: str) -> str:
    """The file name of an HF state-dict name (without "model.") in the given style."""
    if names == "hf":
        return f"model.{name}"
    inverse_global = {hf: ll for ll, hf in LLAMACPP_GLOBAL.items()}
    if name in inverse_global:
        return inverse_global[name]
    _, index, rest = name.split(".", 2)  # layers.N.<part>.weight
    part, kind = rest.rsplit(".", 1)
    inverse_layer = {hf: ll for ll, hf in LLAMACPP_LAYER.items()}
    return f"blk.{index}.{inverse_layer[part]}.{kind}"


def write_student_gguf(model, path, names: str = "hf", dtype: str = "F16",
                       record: dict | None = None) -> Path:
    """Write `model`'s state dict as a student GGUF (1-D tensors always F32, as shipped).
    `record`, when given, receives {HF name: float32 torch tensor} of the values stored."""
    if names not in NAME_STYLES or dtype not in DTYPES:
        raise ValueError(f"names must be one of {NAME_STYLES} and dtype one of {DTYPES}")
    path = Path(path)
    with atomic_path(path, suffix=".gguf") as tmp:
        writer = GGUFWriter(tmp, "qwen3")
        writer.add_name("tiny pig_clip")
        writer.add_string(TINY_GGUF_KEY, TINY_NOTE)  # discovery never links a stand-in
        for name, tensor in model.state_dict().items():
            arr = tensor.detach().to("cpu", torch.float32).numpy()
            data, qtype, stored = encode_tensor(arr, dtype)
            writer.add_tensor(gguf_name(name, names), data, raw_dtype=qtype)
            if record is not None:
                record[name] = torch.from_numpy(stored.copy())
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return path


def write_tiny_student(path, names: str = "hf", dtype: str = "F16", seed: int = 0,
                       record: dict | None = None, **overrides) -> Path:
    """build_tiny_qwen3(seed, **overrides) written with write_student_gguf."""
    model = build_tiny_qwen3(seed, **overrides)
    return write_student_gguf(model, path, names, dtype, record=record)


def write_tiny_tokenizer_dir(dest, config: transformers.Qwen3Config) -> Path:
    """The real Qwen BPE files plus `config.json` for `config`, in `dest`."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for src in qwen_tokenizer_dir().iterdir():
        if src.is_file():
            with atomic_path(dest / src.name) as tmp:
                shutil.copyfile(src, tmp)
    write_text(dest / "config.json", config.to_json_string())
    write_text(dest / TINY_MARKER, TINY_NOTE)
    return dest
