"""The attention blocks every adapter kind is built of, as the engine runs them
(llm_adapter.hpp `Attention`, `Block`, `TokenBlock`): separate q/k/v/o Linears with bias,
64-wide heads, scale 1/8, no positions, pre-LayerNorm (eps 1e-5), exact-erf GELU MLP named
mlp.0 / mlp.2. Owns the row-gathering helpers of the training forward. Must not know kinds or
configs: adapters.py and slot_resampler.py build their modules from these.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

HEAD_DIM = 64  # hard-coded in the engine: heads = width / 64
LN_EPS = 1e-5
INIT_STD = 0.02  # learned queries and seed tables


class Attention(nn.Module):
    """Separate q/k/v/o Linears with bias, 64-wide contiguous heads, scale 1/8, no positions."""

    def __init__(self, width: int):
        super().__init__()
        self.heads = width // HEAD_DIM
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))

    def forward(
        self, xq: torch.Tensor, xkv: torch.Tensor, key_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        b, lq, w = xq.shape
        lk = xkv.shape[1]
        q = self.q(xq).view(b, lq, self.heads, HEAD_DIM).transpose(1, 2)  # (B, H, Lq, 64)
        k = self.k(xkv).view(b, lk, self.heads, HEAD_DIM).transpose(1, 2)
        v = self.v(xkv).view(b, lk, self.heads, HEAD_DIM).transpose(1, 2)
        # (B, 1, 1, Lk) True = attend. A row with no True key would be NaN; right-padded
        # batches always keep >= 1 real key per sample.
        mask = None if key_mask is None else key_mask[:, None, None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=HEAD_DIM**-0.5)
        return self.o(y.transpose(1, 2).reshape(b, lq, w))


def _mlp(width: int, hidden: int) -> nn.Sequential:
    # Sequential so the engine's names are mlp.0 / mlp.2; exact-erf GELU.
    return nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))


# Training needs the output on the supervised rows only, and after the last block's attention
# every op is per row (LayerNorm, MLP, ln_out, out_proj, skip): the last block reads every row
# as keys but computes queries only up to the last supervised position (`leading_rows`), then
# keeps the supervised rows alone (`gather_rows`). Row-wise matmuls on a gathered, contiguous
# copy give bit-identical rows on CPU (tests/unit/model/test_adapters.py asserts max |diff| = 0).
def leading_rows(rows, *xs):
    """xs cut to the positions up to the last supervised one (contiguous); xs when rows is None."""
    if rows is None:
        return xs
    hit = rows.any(0).nonzero()
    n = int(hit[-1]) + 1 if len(hit) else 1
    return tuple(x[:, :n].contiguous() for x in xs)


def gather_rows(rows, x):
    """The supervised rows of x (B, n, W) -> (N, W), sample-major like metrics.masked_rows."""
    return x if rows is None else x[rows[:, : x.shape[1]]]


class ResamplerBlock(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.ln_self = nn.LayerNorm(width, eps=LN_EPS)
        self.self_attn = Attention(width)
        self.ln_q = nn.LayerNorm(width, eps=LN_EPS)
        self.ln_kv = nn.LayerNorm(width, eps=LN_EPS)
        self.cross_attn = Attention(width)
        self.ln_mlp = nn.LayerNorm(width, eps=LN_EPS)
        self.mlp = _mlp(width, hidden)

    def forward(self, q, kv, kv_mask=None, rows=None):
        """(B, Q, W) -> (B, Q, W); with `rows` (B, Q) bool, only those rows: (N, W)."""
        x = self.ln_self(q)
        q, xq = leading_rows(rows, q, x)
        q = q + self.self_attn(xq, x)  # all queries as keys, no query mask (the engine has none)
        q = q + self.cross_attn(self.ln_q(q), self.ln_kv(kv), kv_mask)
        q = gather_rows(rows, q)
        return q + self.mlp(self.ln_mlp(q))


class TokenBlock(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.ln_self = nn.LayerNorm(width, eps=LN_EPS)
        self.self_attn = Attention(width)
        self.ln_mlp = nn.LayerNorm(width, eps=LN_EPS)
        self.mlp = _mlp(width, hidden)

    def forward(self, x, mask=None, rows=None):
        """(B, L, W) -> (B, L, W); with `rows` (B, L) bool, only those rows: (N, W)."""
        y = self.ln_self(x)
        x, yq = leading_rows(rows, x, y)
        x = x + self.self_attn(yq, y, mask)
        x = gather_rows(rows, x)
        return x + self.mlp(self.ln_mlp(x))


def as_bool(mask):
    return None if mask is None else mask.to(torch.bool)
