"""LLaDA-Image's QueryFormer and TextProjection in plain torch (no diffusers).

Owns: the two modules, built from their released `config.json` and loaded strictly from
`diffusion_pytorch_model.safetensors` under the names the release stores (the layout, the
config keys and the sources for both: `teachers/llada_layout.py`). Must not: know about
projects, packs or the backbone. Equations (anchor-trainer §4.1; diffusers'
`transformer_llada_image.py`):

* QueryFormer: 256 learned queries read the backbone's *token input embeddings*. Per block:
  q = LN(q); e = LN(enc); q += out_proj(MHA(q, e, e, key padding)); q = LN(q);
  q += fc2(gelu_tanh(fc1(q))). LN has no affine; the MHA is packed (in_proj [3H, H]).
* TextProjection: per layer, x += out_proj(SDPA(RMS_h(q(n)), RMS_h(k(n)), v(n))) with
  n = RMS(x); x += fc2(gelu_tanh(fc1(RMS(x)))); then `projector` H -> projection_dim. Every
  RMSNorm (the per-head q/k one included) is parameter-free. The original runs one unpadded
  prompt; a key mask makes a right-padded batch equal per-prompt (pads are never attended).

    qf = load_module(QueryFormer, root / "queryformer")
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from gguf_trainer.base.errors import UserError

from .llada_layout import (
    QUERYFORMER,
    TEXT_PROJECTION,
    WEIGHTS_FILE,
    ModuleLayout,
    read_config,
    weights_mismatch,
)


def _layer_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), eps=eps)


def _rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Parameter-free RMSNorm (every one in TextProjection has no weight)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


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

    LAYOUT: ClassVar[ModuleLayout] = QUERYFORMER

    def __init__(self, hidden_size, num_queries, num_attention_heads, intermediate_size,
                 norm_eps, num_hidden_layers):
        super().__init__()
        self.meta_queries = nn.Parameter(torch.empty(num_queries, hidden_size))  # (Q, H)
        self.query_blocks = nn.ModuleList(
            _QueryBlock(hidden_size, num_attention_heads, intermediate_size, norm_eps)
            for _ in range(num_hidden_layers))

    def forward(self, enc: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        q = self.meta_queries.to(enc.dtype).unsqueeze(0).expand(enc.shape[0], -1, -1)
        for block in self.query_blocks:
            q = block(q, enc, mask)
        return q


class _ProjectionAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, eps: float):
        super().__init__()
        self.heads = heads
        self.eps = eps  # the per-head q/k RMSNorm: elementwise_affine=False in the release
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, hidden)

    def forward(self, x, key_mask=None):
        b, n, h = x.shape

        def heads(t):  # (B, N, H) -> (B, heads, N, H / heads)
            return t.view(b, n, self.heads, h // self.heads).transpose(1, 2)

        q = _rms_norm(heads(self.q_proj(x)), self.eps)
        k = _rms_norm(heads(self.k_proj(x)), self.eps)
        out = F.scaled_dot_product_attention(q, k, heads(self.v_proj(x)),
                                             attn_mask=_attn_bias(key_mask, x.dtype))
        return self.out_proj(out.transpose(1, 2).reshape(b, n, h))


class _ProjectionLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float):
        super().__init__()
        self.eps = eps
        self.self_attn = _ProjectionAttention(hidden, heads, eps)
        self.mlp = _Mlp(hidden, intermediate)

    def forward(self, x, key_mask=None):
        x = x + self.self_attn(_rms_norm(x, self.eps), key_mask)
        return x + self.mlp(_rms_norm(x, self.eps))


class TextProjection(nn.Module):
    """(B, T, H) backbone rows + (B, T) key mask -> (B, T, projection_dim)."""

    LAYOUT: ClassVar[ModuleLayout] = TEXT_PROJECTION

    def __init__(self, hidden_size, intermediate_size, num_attention_heads, norm_eps,
                 num_hidden_layers, projection_dim):
        super().__init__()
        self.layers = nn.ModuleList(
            _ProjectionLayer(hidden_size, num_attention_heads, intermediate_size, norm_eps)
            for _ in range(num_hidden_layers))
        self.projector = nn.Linear(hidden_size, projection_dim)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, key_mask)
        return self.projector(x)


def module_config(cls, folder: Path) -> dict:
    """The constructor arguments from `<folder>/config.json`, read under the released keys;
    UserError naming the file for a missing file, another class, an unknown or missing key."""
    return read_config(folder, cls.LAYOUT)


def load_module(cls, folder, device="cpu", dtype=torch.float32) -> nn.Module:
    """Build `cls` from `<folder>/config.json` and load its safetensors strictly: any missing
    or unexpected key (or shape) is a UserError naming them in one sentence."""
    from safetensors.torch import load_file

    folder = Path(folder)
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise UserError(f"{weights} is missing; download the teacher snapshot again.")
    with torch.device("meta"):
        module = cls(**module_config(cls, folder))
    state = load_file(str(weights), device="cpu")
    want = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    problem = weights_mismatch(weights, want, {k: tuple(v.shape) for k, v in state.items()})
    if problem:
        raise UserError(problem)
    module.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True, assign=True)
    return module.to(device).eval().requires_grad_(False)
