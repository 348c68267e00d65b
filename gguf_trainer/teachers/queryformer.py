"""LLaDA-Image's QueryFormer and TextProjection in plain torch (no diffusers).

Owns: the two modules, built from their `config.json` and loaded strictly from
`diffusion_pytorch_model.safetensors`. Must not: know about projects, packs or the backbone.
Equations (anchor-trainer §4.1):

* QueryFormer: 256 learned queries read the backbone's *token input embeddings*. Per block:
  q = LN(q); e = LN(enc); q += out_proj(MHA(q, e, e, key padding)); q = LN(q);
  q += fc2(gelu_tanh(fc1(q))). LN has no affine; the MHA is packed (in_proj [3H, H]).
* TextProjection: per layer, x += out_proj(SDPA(qn(q(n)), kn(k(n)), v(n))) with n = RMS(x)
  (no affine) and per-head RMSNorm on q and k; x += fc2(gelu_tanh(fc1(RMS(x)))); then
  `projector` H -> projection_dim. The original runs one unpadded prompt; a key mask makes a
  right-padded batch equal per-prompt (pads are never attended).

    qf = load_module(QueryFormer, root / "queryformer")
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UserError

log = logging.getLogger(__name__)
WEIGHTS_FILE = "diffusion_pytorch_model.safetensors"
CONFIG_FILE = "config.json"


def _layer_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), eps=eps)


def _rms_norm(x: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _attn_bias(key_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """(B, S) True = real key -> additive (B, 1, 1, S); None = every key real."""
    if key_mask is None:
        return None
    bias = torch.zeros(key_mask.shape, dtype=dtype, device=key_mask.device)
    bias = bias.masked_fill(~key_mask.to(torch.bool), torch.finfo(dtype).min)
    return bias[:, None, None, :]


class _Mlp(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, intermediate)
        self.fc2 = nn.Linear(intermediate, hidden)

    def forward(self, x):
        return self.fc2(_gelu_tanh(self.fc1(x)))


class _CrossAttention(nn.Module):
    """nn.MultiheadAttention's packed parameter layout, computed with SDPA."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * hidden, hidden))  # rows: q | k | v
        self.in_proj_bias = nn.Parameter(torch.empty(3 * hidden))
        self.out_proj = nn.Linear(hidden, hidden)

    def forward(self, q, kv, key_mask=None):
        wq, wk, wv = self.in_proj_weight.chunk(3)
        bq, bk, bv = self.in_proj_bias.chunk(3)
        b, nq, h = q.shape

        def heads(x):  # (B, N, H) -> (B, heads, N, H / heads)
            return x.view(b, x.shape[1], self.heads, h // self.heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            heads(F.linear(q, wq, bq)), heads(F.linear(kv, wk, bk)), heads(F.linear(kv, wv, bv)),
            attn_mask=_attn_bias(key_mask, q.dtype))
        return self.out_proj(out.transpose(1, 2).reshape(b, nq, h))


class _QueryBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float):
        super().__init__()
        self.eps = eps
        self.cross_attn = _CrossAttention(hidden, heads)
        self.mlp = _Mlp(hidden, intermediate)

    def forward(self, q, enc, key_mask=None):
        q = _layer_norm(q, self.eps)
        q = q + self.cross_attn(q, _layer_norm(enc, self.eps), key_mask)
        q = _layer_norm(q, self.eps)
        return q + self.mlp(q)


class QueryFormer(nn.Module):
    """(B, L, H) token embeddings + (B, L) mask -> (B, num_queries, H)."""

    DEFAULTS: ClassVar[dict] = {"hidden_size": 2048, "num_queries": 256, "num_attention_heads": 16,
                "intermediate_size": 8192, "layer_norm_eps": 1e-6, "num_layers": 1}

    def __init__(self, hidden_size, num_queries, num_attention_heads, intermediate_size,
                 layer_norm_eps, num_layers):
        super().__init__()
        self.meta_queries = nn.Parameter(torch.empty(num_queries, hidden_size))  # (Q, H)
        self.query_blocks = nn.ModuleList(
            _QueryBlock(hidden_size, num_attention_heads, intermediate_size, layer_norm_eps)
            for _ in range(num_layers))

    def forward(self, enc: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        q = self.meta_queries.to(enc.dtype).unsqueeze(0).expand(enc.shape[0], -1, -1)
        for block in self.query_blocks:
            q = block(q, enc, mask)
        return q


class _HeadNorm(nn.Module):
    """RMSNorm over one head's dims, with a weight (q/k norm)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return _rms_norm(x, self.eps, self.weight)


class _ProjectionAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, eps: float):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.q_norm = _HeadNorm(hidden // heads, eps)
        self.k_norm = _HeadNorm(hidden // heads, eps)
        self.out_proj = nn.Linear(hidden, hidden)

    def forward(self, x, key_mask=None):
        b, n, h = x.shape

        def heads(t):  # (B, N, H) -> (B, heads, N, H / heads)
            return t.view(b, n, self.heads, h // self.heads).transpose(1, 2)

        q = self.q_norm(heads(self.q_proj(x)))
        k = self.k_norm(heads(self.k_proj(x)))
        out = F.scaled_dot_product_attention(q, k, heads(self.v_proj(x)),
                                             attn_mask=_attn_bias(key_mask, x.dtype))
        return self.out_proj(out.transpose(1, 2).reshape(b, n, h))


class _ProjectionLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float):
        super().__init__()
        self.eps = eps
        self.attn = _ProjectionAttention(hidden, heads, eps)
        self.mlp = _Mlp(hidden, intermediate)

    def forward(self, x, key_mask=None):
        x = x + self.attn(_rms_norm(x, self.eps), key_mask)
        return x + self.mlp(_rms_norm(x, self.eps))


class TextProjection(nn.Module):
    """(B, T, H) backbone rows + (B, T) key mask -> (B, T, projection_dim)."""

    DEFAULTS: ClassVar[dict] = {"hidden_size": 2048, "intermediate_size": 8960, "num_attention_heads": 32,
                "rms_norm_eps": 1e-6, "num_layers": 6, "projection_dim": 2560}

    def __init__(self, hidden_size, intermediate_size, num_attention_heads, rms_norm_eps,
                 num_layers, projection_dim):
        super().__init__()
        self.layers = nn.ModuleList(
            _ProjectionLayer(hidden_size, num_attention_heads, intermediate_size, rms_norm_eps)
            for _ in range(num_layers))
        self.projector = nn.Linear(hidden_size, projection_dim)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, key_mask)
        return self.projector(x)


def module_config(cls, folder: Path) -> dict:
    """The constructor arguments from `<folder>/config.json` (diffusers keys; defaults where
    a key is absent). UserError when the file is missing or unreadable."""
    path = Path(folder) / CONFIG_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} is missing; download the teacher snapshot again.") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{path} cannot be read ({e}); download the teacher snapshot again.") from None
    unknown = sorted(k for k in raw if not k.startswith("_") and k not in cls.DEFAULTS)
    if unknown:  # a key we do not read may change the math: say so where it can be found
        log.warning("%s: keys %s are not read by gguf-trainer's %s", path, unknown, cls.__name__)
    return {k: type(v)(raw.get(k, v)) for k, v in cls.DEFAULTS.items()}


def load_module(cls, folder, device="cpu", dtype=torch.float32) -> nn.Module:
    """Build `cls` from `<folder>/config.json` and load its safetensors strictly: any missing
    or unexpected key is a UserError naming them all in one sentence."""
    from safetensors.torch import load_file

    folder = Path(folder)
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise UserError(f"{weights} is missing; download the teacher snapshot again.")
    with torch.device("meta"):
        module = cls(**module_config(cls, folder))
    state = load_file(str(weights), device="cpu")
    want, have = set(module.state_dict()), set(state)
    missing, unexpected = sorted(want - have), sorted(have - want)
    if missing or unexpected:
        raise UserError(
            f"{weights} does not match its config.json: missing {missing or 'none'}, "
            f"unexpected {unexpected or 'none'}; download the teacher snapshot again.")
    bad = [k for k, v in module.state_dict().items() if tuple(state[k].shape) != tuple(v.shape)]
    if bad:
        raise UserError(f"{weights} has tensors whose shapes differ from its config.json "
                        f"({', '.join(bad[:5])}); download the teacher snapshot again.")
    module.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True, assign=True)
    return module.to(device).eval().requires_grad_(False)
