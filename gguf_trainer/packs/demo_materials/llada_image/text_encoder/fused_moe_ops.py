"""The routed experts of the tiny LLaDA2-MoE-like backbone (one stacked weight per projection).

Like the released `fused_moe_ops.py`, the experts are inference-only: they refuse to run
under autograd."""

import torch
import torch.nn.functional as F
from torch import nn


class FusedExperts(nn.Module):
    def __init__(self, num_experts, hidden_size, intermediate_size):
        super().__init__()
        self.gate_up_proj = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size)
        )
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def forward(self, x, expert_ids, expert_weights):
        """x (N, H), expert_ids / expert_weights (N, k) -> (N, H)."""
        if torch.is_grad_enabled():
            raise RuntimeError(
                "fused MoE experts support inference only; run under torch.no_grad()"
            )
        out = torch.zeros_like(x)
        for e in range(self.gate_up_proj.shape[0]):
            rows, slot = (expert_ids == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            gate, up = F.linear(x[rows], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_proj[e])
            out.index_add_(0, rows, y * expert_weights[rows, slot, None].to(y.dtype))
        return out
