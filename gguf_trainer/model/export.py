"""State dict -> adapter GGUF the ggk engine loads (engine-contract §1.2, §1.4, §6).

Owns: the standardization fold, the dtype policy (f32 for 1-D tensors, `query`,
`vision_proj.weight`, `layer_map` and LayerNorm tensors; f16 for every other weight, or
export.dtype's q8_0 / bf16 for the Linears: `tensor_type`), the KV
provenance, and the read-back check. Must not know about projects or checkpoints: the
export stage passes a state dict and numbers.

    info = write_adapter_gguf(out / "pig_t5_adapter-f16.gguf", model.state_dict(), cfg,
                              metadata={"adapter.pack": "t5xxl_pixart"}, mu=mu, sigma_f=sigma_f)
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import torch

from gguf_trainer.base.atomic import atomic_path
from gguf_trainer.base.errors import UserError
from gguf_trainer.model.adapter_file import (
    EMBED_TABLES,
    F32_NAMES,
    PREFIX,
    block_size,
    is_layernorm_name,
    read_adapter,
    trainer_kind,
)
from gguf_trainer.model.adapters import TOKEN_ALIGNED_KINDS, AdapterConfig
from gguf_trainer.model.ming_adapter import KIND as MING_KIND
from gguf_trainer.model.ming_adapter import TOKENIZER_TENSOR, tokenizer_bytes_tensor
from gguf_trainer.model.slot_resampler import SLOT_KINDS

log = logging.getLogger(__name__)

ARCH = "pig"  # general.architecture of the shipped adapter files; the engine reads no KV
U32_MAX = 2**32 - 1
I32_MIN = -(2**31)


def fold_standardization(state_dict: dict[str, torch.Tensor], mu, sigma_f) -> dict:
    """Targets were (t - mu) / sigma_f: make the output layer emit teacher-scale rows.
    W' = diag(sigma_f) W, b' = sigma_f * b + mu, in float64, cast back. `skip` (if any) is
    scaled too, because the engine adds it after out_proj. Returns a new dict."""
    out = dict(state_dict)
    w = state_dict["out_proj.weight"]
    mu64 = torch.as_tensor(mu, dtype=torch.float64).flatten().cpu()
    sig64 = torch.as_tensor(sigma_f, dtype=torch.float64).flatten().cpu()
    if mu64.numel() != w.shape[0] or sig64.numel() != w.shape[0]:
        raise ValueError(
            f"mu/sigma_f need {w.shape[0]} entries, got {mu64.numel()}/{sig64.numel()}"
        )
    if not (torch.isfinite(mu64).all() and torch.isfinite(sig64).all() and (sig64 > 0).all()):
        raise ValueError(
            "mu must be finite and sigma_f finite and positive (apply the floor first)"
        )
    for name in ("out_proj", "skip"):
        if f"{name}.weight" not in state_dict:
            continue
        wt, bt = state_dict[f"{name}.weight"], state_dict[f"{name}.bias"]
        w64 = (
            wt.detach().cpu().to(torch.float64) * sig64[:, None]
        )  # (out, W): row o scaled by sigma_o
        b64 = bt.detach().cpu().to(torch.float64) * sig64 + (mu64 if name == "out_proj" else 0.0)
        out[f"{name}.weight"] = w64.to(wt.dtype)
        out[f"{name}.bias"] = b64.to(bt.dtype)
    return out


def fold_bank(state_dict: dict[str, torch.Tensor], mu, sigma_f) -> dict:
    """The Qwen3.5 bridge's FLUX.3 bank trained on (t - mu) / sigma_f of its own rows
    (data/bank_rows.py): `out_bank` folded as fold_standardization folds out_proj. New dict."""
    sub = {"out_proj.weight": state_dict["out_bank.weight"],
           "out_proj.bias": state_dict["out_bank.bias"]}
    folded = fold_standardization(sub, mu, sigma_f)
    return {**state_dict, "out_bank.weight": folded["out_proj.weight"],
            "out_bank.bias": folded["out_proj.bias"]}


def factorize_seed(state_dict: dict[str, torch.Tensor], cfg: AdapterConfig, rank: int):
    """The full seed table T (V, W) as its best rank-r factorization (truncated SVD, Eckart-Young):
    t5_embed_a = T·V_r (V, r) and t5_embed_b.weight = V_r (W, r), so B(A[id]) = T[id]·V_r·V_rᵀ.
    V_r are the top eigenvectors of TᵀT (W x W, float64): the same subspace as the SVD's right
    singular vectors without decomposing a 256384-row table. Returns (state dict, config with
    seed_rank, relative Frobenius error ||T - T·V_r·V_rᵀ|| / ||T||)."""
    if cfg.kind != "seeded_resampler" or cfg.seed_rank or "t5_embed.weight" not in state_dict:
        raise ValueError("only a full-table seeded_resampler can be factorized")
    most = min(cfg.seed_vocab, cfg.width)
    if not 0 < rank <= most:
        raise UserError(
            f"train.seed_rank {rank} cannot factorize a {cfg.seed_vocab} x {cfg.width} seed "
            f"table; set it between 1 and {most}, or 0 to export the full table."
        )
    new_cfg = AdapterConfig.from_dict({**cfg.to_dict(), "seed_rank": rank})
    table = state_dict["t5_embed.weight"].detach().to("cpu", torch.float64)
    _, vecs = torch.linalg.eigh(table.T @ table)  # ascending eigenvalues
    basis = vecs[:, -rank:].flip(1)  # (W, r), the strongest direction first
    a = table @ basis
    err = float(torch.linalg.norm(table - a @ basis.T) / torch.linalg.norm(table).clamp_min(1e-30))
    out = {k: v for k, v in state_dict.items() if k != "t5_embed.weight"}
    dtype = state_dict["t5_embed.weight"].dtype
    out["t5_embed_a.weight"], out["t5_embed_b.weight"] = a.to(dtype), basis.to(dtype).contiguous()
    return out, new_cfg, err


def engine_state(state_dict: dict, cfg: AdapterConfig, seed_rank: int = 0):
    """The tensors an export writes for a checkpoint's state: a full seed table factorized to
    `seed_rank` (train.seed_rank) when the adapter trained with the full table. Returns
    (state dict, config, the factorization's relative error or None)."""
    if seed_rank and cfg.kind == "seeded_resampler" and not cfg.seed_rank:
        # Trained with the full table; the file carries its best rank-r factorization.
        return factorize_seed(state_dict, cfg, seed_rank)
    return state_dict, cfg, None


def is_f32_tensor(name: str, ndim: int) -> bool:
    """The export dtype policy: f32 here, f16 everywhere else."""
    return ndim == 1 or name in F32_NAMES or is_layernorm_name(name)


EXPORT_DTYPES = ("f16", "q8_0", "bf16")  # export.dtype


def tensor_type(name: str, shape: tuple[int, ...], dtype: str = "f16") -> str:
    """The type tensor `name` (torch shape) is written in for `export.dtype`: f32 for norms,
    biases, queries, vision_proj and layer_map in every type; an embedding table f16 (the
    engine reads it row by row); every other 2-D weight is a Linear: bf16, or Q8_0 when its
    input width (shape[-1], the engine's ne0) is a multiple of 32 and f16 otherwise (the engine
    turns a Q8_0 weight of another width into f32, ggml_extend.hpp 3695-3698)."""
    if is_f32_tensor(name, len(shape)):
        return "f32"
    if dtype == "f16" or name in EMBED_TABLES:
        return "f16"
    if dtype == "bf16":
        return "bf16"
    if dtype == "q8_0":
        return "q8_0" if shape[-1] % block_size("q8_0") == 0 else "f16"
    raise ValueError(f"unknown export dtype {dtype!r}; one of {EXPORT_DTYPES}")


def is_f16_in_every_dtype(name: str, ndim: int) -> bool:
    """A tensor every export.dtype writes as f16 (an embedding table): a kept step may hold it
    in f16 and still export exactly; any other weight must stay f32 to quantize the same."""
    return not is_f32_tensor(name, ndim) and name in EMBED_TABLES


def _structural_kv(cfg: AdapterConfig) -> dict[str, int]:
    kv = {
        "adapter.in_dim": cfg.in_dim,
        "adapter.out_dim": cfg.out_dim,
        "adapter.width": cfg.width,
        "adapter.depth": cfg.depth,
        "adapter.heads": cfg.heads,
    }
    if cfg.vis_dim:  # token_aligned_vision, or a layerwise adapter with the vision extension
        kv["adapter.vis_dim"] = cfg.vis_dim
    elif cfg.kind not in TOKEN_ALIGNED_KINDS:
        kv["adapter.num_queries"] = cfg.num_queries
    if cfg.kind == "seeded_resampler":
        kv["adapter.t5_vocab"] = cfg.seed_vocab
    if cfg.seed_rank:
        kv["adapter.seed_rank"] = cfg.seed_rank
    if cfg.taps:
        kv["adapter.n_layers"] = len(cfg.taps)
    if cfg.kind in (*SLOT_KINDS, MING_KIND):  # provenance only: the engine reads the shapes
        kv.update({"adapter.max_slots": cfg.num_queries, "adapter.seed_vocab": cfg.seed_vocab,
                   "adapter.n_bank": cfg.n_bank, "adapter.bank_dim": cfg.bank_dim,
                   "adapter.bank_align": int(cfg.bank_align)})
        kv.pop("adapter.num_queries", None)
    return kv


def _add_tokenizer(writer, tokenizer: dict) -> None:
    """The teacher's vocabulary as llama.cpp KVs, the way the engine reads it for the Qwen3.5
    bridge (gk-diffuser.cpp 1236-1277, gguf_io.cpp read_gguf_tokenizer): tokens (id order),
    merges ("a b"), pre-tokenizer name; model "gpt2" (byte-level BPE)."""
    writer.add_tokenizer_model(tokenizer.get("model", "gpt2"))
    writer.add_tokenizer_pre(tokenizer["pre"])
    writer.add_token_list(list(tokenizer["tokens"]))
    writer.add_token_merges(list(tokenizer["merges"]))


def _add_kv(writer, key: str, value) -> None:
    """str -> string, bool -> bool, int -> u32 (i32 if negative; 64-bit if out of range),
    float -> f32 (non-finite skipped), None skipped."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None:
        return
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        if 0 <= value <= U32_MAX:
            writer.add_uint32(key, value)
        elif I32_MIN <= value < 0:
            writer.add_int32(key, value)
        elif value > 0:
            writer.add_uint64(key, value)
        else:
            writer.add_int64(key, value)
    elif isinstance(value, float):
        if math.isfinite(value):
            writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        raise TypeError(f"metadata {key!r} has unsupported type {type(value).__name__}")


def _to_numpy(name: str, t: torch.Tensor, dtype: str = "f16") -> tuple[np.ndarray, str]:
    """The tensor as written: (array, type). f32/f16 arrays as they are; q8_0 and bf16 as the
    `gguf` library's quantizer packs them (raw bytes, the engine's own block layout)."""
    import gguf

    a = t.detach().to("cpu", torch.float32).contiguous().numpy()
    ty = tensor_type(name, tuple(a.shape), dtype)
    with np.errstate(over="ignore"):  # an f16 overflow becomes inf, reported just below
        checked = a.astype(np.float16) if ty == "f16" else a
    if not np.isfinite(checked).all():
        raise UserError(
            f"adapter weight {name} is not finite (or overflows f16) in this checkpoint; "
            "export an earlier checkpoint or lower the learning rate and retrain."
        )
    if ty in ("f32", "f16"):
        return checked, ty
    return gguf.quants.quantize(a, gguf.GGMLQuantizationType[ty.upper()]), ty


def _check_readback(tmp: Path, cfg: AdapterConfig, n_tensors: int) -> None:
    """Programmer errors: the file we just wrote must be exactly what the engine expects."""
    view = read_adapter(tmp)
    if view.problems or view.notes:  # a note here means a tensor the engine would ignore
        raise RuntimeError(f"exported adapter failed verification: {view.problems + view.notes}")
    got = {
        "kind": trainer_kind(view),
        "in_dim": view.in_dim,
        "out_dim": view.out_dim,
        "width": view.width,
        "depth": view.depth,
        "mlp": view.mlp_hidden,
        "queries": view.num_queries,
        "vocab": view.t5_vocab,
        "vis_dim": view.vis_dim,
        "seed_rank": view.embed_rank,
        "taps": view.taps,
        "bank": (view.n_bank, view.bank_dim, view.bank_align),
    }
    want = {
        "kind": cfg.kind,
        "in_dim": cfg.in_dim,
        "out_dim": cfg.out_dim,
        "width": cfg.width,
        "depth": cfg.depth,
        "mlp": cfg.hidden_dim,
        "queries": cfg.num_queries,
        "vocab": cfg.seed_vocab,
        "vis_dim": cfg.vis_dim,
        "seed_rank": cfg.seed_rank,
        "taps": cfg.taps,
        "bank": (cfg.n_bank, cfg.bank_dim, cfg.bank_align),
    }
    if got != want:
        raise RuntimeError(f"exported adapter reads back as {got}, expected {want}")
    if len(view.tensors) != n_tensors:
        raise RuntimeError(f"exported adapter has {len(view.tensors)} tensors, wrote {n_tensors}")


def write_adapter_gguf(
    path,
    state_dict,
    cfg: AdapterConfig,
    *,
    metadata: dict,
    mu=None,
    sigma_f=None,
    name: str | None = None,
    dtype: str = "f16",
    tokenizer: dict | None = None,
    bank_fold=None,
) -> dict:
    """Write `adapter.<name>` tensors + KVs to a temp file in `dtype` (tensor_type), verify it
    reads back as `cfg`, then rename it into place. `bank_fold` (mu, sigma_f): the bridge's
    standardized bank head (fold_bank). Returns {"path", "n_f16", "n_f32",
    "n_tensors", "bytes", "dtype", "types": {type: count}}."""
    import gguf

    problems = cfg.validate()
    if problems:
        raise ValueError(f"cannot export an invalid config: {problems}")
    if (mu is None) != (sigma_f is None):
        raise ValueError("pass both mu and sigma_f, or neither")
    if cfg.kind in SLOT_KINDS and not (tokenizer and tokenizer.get("tokens")):
        raise ValueError(f"a {cfg.kind} adapter carries its teacher's vocabulary: pass tokenizer")
    # ming_image: the Ling tokenizer.json rides as a tensor beside adapter.* (ming_adapter.py)
    extra = {}
    if cfg.kind == MING_KIND:
        if not (tokenizer and tokenizer.get("json")):
            raise ValueError("a ming_image adapter carries the Ling tokenizer.json: pass "
                             "tokenizer={'json': text}")
        extra[TOKENIZER_TENSOR] = tokenizer_bytes_tensor(tokenizer["json"])
        tokenizer = None
    if mu is not None:
        state_dict = fold_standardization(state_dict, mu, sigma_f)
    if bank_fold is not None:
        state_dict = fold_bank(state_dict, *bank_fold)
    path = Path(path)
    kv = _structural_kv(cfg)
    clash = sorted((set(kv) | {"general.name", "general.architecture"}) & set(metadata))
    if clash:
        raise ValueError(f"metadata must not override the structural keys {clash}")
    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"unknown export dtype {dtype!r}; one of {EXPORT_DTYPES}")
    written = {k: _to_numpy(k, v, dtype) for k, v in state_dict.items()}
    arrays = {k: a for k, (a, _) in written.items()}
    with atomic_path(path) as tmp:
        writer = gguf.GGUFWriter(tmp, ARCH)
        writer.add_name(name or path.stem)
        for key, value in {**kv, **metadata}.items():
            _add_kv(writer, key, value)
        if tokenizer is not None:  # {"tokens", "merges", "pre"}: the slot kinds' teacher vocab
            _add_tokenizer(writer, tokenizer)
        for k, (a, ty) in written.items():
            raw = None if ty in ("f32", "f16") else gguf.GGMLQuantizationType[ty.upper()]
            writer.add_tensor(PREFIX + k, a, raw_dtype=raw)
        for k, a in extra.items():
            writer.add_tensor(k, a)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        _check_readback(tmp, cfg, len(arrays) + len(extra))
        n_bytes = tmp.stat().st_size
    types: dict[str, int] = {}
    for _, ty in written.values():
        types[ty] = types.get(ty, 0) + 1
    n_f32 = types.get("f32", 0)
    info = {
        "path": str(path),
        "n_f16": len(arrays) - n_f32,  # every tensor not f32 (the 2-D weights)
        "n_f32": n_f32,
        "n_tensors": len(arrays),
        "bytes": n_bytes,
        "dtype": dtype,
        "types": types,
    }
    log.debug(
        "export: wrote %s: %d f16 + %d f32 tensors, %d bytes", path, info["n_f16"], n_f32, n_bytes
    )
    return info
