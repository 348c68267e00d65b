"""Ridge least squares, accumulated in float64 over row chunks (library: numbers only).

Used for the frozen `vision_proj` (teacher token embeddings -> student token embeddings)
and for the optional least-squares start of an adapter's linear `skip` path.

    acc = RidgeAccumulator(in_dim, out_dim)
    for x, y in chunks: acc.add(x, y)          # x (N, in), y (N, out)
    weight, bias = acc.solve(bias=True)        # weight (out, in), bias (out,) float32
"""

from __future__ import annotations

import torch

LAMBDA_REL = 1e-4  # lambda = LAMBDA_REL * mean(diag(XᵀX)): scale-free, barely regularises


class RidgeAccumulator:
    def __init__(self, in_dim: int, out_dim: int):
        f64 = torch.float64
        self.n = 0
        self.sx, self.sy = torch.zeros(in_dim, dtype=f64), torch.zeros(out_dim, dtype=f64)
        self.sxx = torch.zeros(in_dim, in_dim, dtype=f64)
        self.sxy = torch.zeros(in_dim, out_dim, dtype=f64)

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        x, y = x.detach().to("cpu", torch.float64), y.detach().to("cpu", torch.float64)
        self.n += x.shape[0]
        self.sx += x.sum(0)
        self.sy += y.sum(0)
        self.sxx += x.T @ x
        self.sxy += x.T @ y

    def solve(self, bias: bool = False, lambda_rel: float = LAMBDA_REL):
        """(weight (out, in), bias (out,) or None), float32, minimising
        ||x Wᵀ + b - y||² + λ||W||² (with `bias`, over centred x and y)."""
        if self.n == 0:
            raise ValueError("no rows to fit")
        g, c = self.sxx, self.sxy
        if bias:
            mx, my = self.sx / self.n, self.sy / self.n
            g = g - self.n * torch.outer(mx, mx)
            c = c - self.n * torch.outer(mx, my)
        lam = lambda_rel * float(g.diagonal().mean().clamp_min(1e-12))
        w = torch.linalg.solve(g + lam * torch.eye(g.shape[0], dtype=g.dtype), c)  # (in, out)
        b = (my - mx @ w).float() if bias else None
        return w.T.contiguous().float(), b
