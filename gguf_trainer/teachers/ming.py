"""Ming-Image 0.1's text encoder in torch: the Ling-mini-2.0 thinker (Bailing MoE V2), the 256
learned query tokens spliced after `<image>`, the Qwen2-shaped connector and the projections,
ported from the engine's own ggml port (ggk 0.9.7 vendor/engine/diffusion/src/model/te/
ming_image_te.hpp, cited `T:<line>`) rather than from Hugging Face: transformers has no
`bailing_moe_v2`, and the engine is what the adapter must match. The engine tier
(tests/engine/test_ming_teacher_engine.py) runs MingImageTextRunner on a tiny config and asserts
this port equals it: hidden states 5 and 12, the
final norm and the 256 caption rows, <= 1e-4 relative.

What it computes for one Ling prompt of P tokens (T:818-840 builds the sequence, T:694-726 runs it):

    ids   = prompt ++ <image> ++ <imagePatch> x 256 ++ </image>        (157158, 157157, 157159)
    x     = embed(ids), query_tokens spliced over the 256 patches      (T:672-693)
    thinker: 20 Bailing blocks, causal, "video" rope (T:842-900): text counts up on t = h = w;
          the query bank is a 1 x 256 frame at t = P + 1, w = t + i - 127; of the 32 rotated
          frequencies the first 24 alternate h / w, the last 8 carry t
    direct  = proj_directvlm.1(RMSNorm_1e-5(cat(hs[5], hs[12], norm(final))[:P]))   (P, 3840)
    caption = proj_out(connector(proj_in(norm(final)[P+1 : P+257])))                (256, 2560)

An edit's reference image (`images=`): its tower rows (teachers/ming_vision.py) over the
<imagePatch> run of the HUMAN turn, a (grid_h, grid_w) frame of the video rope at the next t with
centred h / w, routed through image_gate; the direct rows then include the image block's.

hs[i] is Hugging Face's hidden_states[i], the output of block i-1 (T:578-583). The connector is a
Qwen2 stack fed embeddings: bidirectional, positions 0..255, NEOX rope over the whole 128-wide
head at theta 1e6, q/k/v biased (llm.hpp 256-269, 1406-1408, 1726-1844); the engine reads its
width from nothing (no embed_tokens), so it is Qwen2-1.5B's 1536 (llm.hpp 262), head_dim 128.
The routing constants the engine hard-codes (T:160-179: 8 groups, top 4 groups, top 8 experts,
scale 2.5, theta 6e5, eps 1e-6) are this port's too.

Module and parameter names are the engine's under `text_encoders.llm.` (thinker.*, connector.*,
query_tokens, proj_in, proj_out, proj_directvlm.*), so a state dict is one GGUF away from the
engine's MingImageTextRunner. Must not: know packs, projects or the student.

    cfg = MingConfig(...); te = MingTextEncoder(cfg)
    out = te(ids, lengths)        # MingOutput(caption (B,256,cap), direct [(P_i, 3840)], states)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

IMAGE_PATCH, IMAGE_START, IMAGE_END = 157157, 157158, 157159  # T:40-42
SPATIAL_FREQS = 24  # T:46: of the rope_dim / 2 frequencies, the first 24 are h / w
VOCAB = 157184
# The Ming-Image chat template around the prompt (T:1246-1249, conditioner.hpp 3843-3846).
PREFIX = ("<role>SYSTEM</role>你是一个友好的AI助手。\n\ndetailed thinking off<|role_end|>"
          "<role>HUMAN</role>")
SUFFIX = "<|role_end|><role>ASSISTANT</role>"


@dataclass(frozen=True)
class MingConfig:
    """Geometry of the thinker, connector and heads. Defaults are Ming-Image-0.1-Design's
    (T:160-179 and the checkpoint's shapes); the fields the engine hard-codes are not read from a
    file there, so a smaller model must keep them."""

    hidden: int = 2048
    intermediate: int = 5120
    moe_intermediate: int = 512
    layers: int = 20
    heads: int = 16
    kv_heads: int = 4
    head_dim: int = 128
    experts: int = 256
    shared_experts: int = 1
    first_dense: int = 1
    vocab: int = VOCAB
    n_group: int = 8
    topk_group: int = 4
    top_k: int = 8
    routed_scaling: float = 2.5
    rope_theta: float = 600000.0
    eps: float = 1e-6
    conn_hidden: int = 1536
    conn_layers: int = 28
    conn_heads: int = 12
    conn_kv_heads: int = 2
    conn_intermediate: int = 8960
    conn_head_dim: int = 128
    conn_theta: float = 1000000.0
    conn_norm: bool = True
    num_queries: int = 256
    caption_dim: int = 2560
    diffusion_dim: int = 3840
    direct_states: tuple = field(default=(5, 12))
    # mlp/config.json `connector_norm`: the model's own loader L2-normalises the caption rows
    # after proj_out when it is set (modeling_bailingmm2 get_condition_embeds_for_image_gen);
    # ggk 0.9.7's MingImageTextRunner never does (T:720-727), so a snapshot that sets it gives
    # targets the engine's full-teacher path does not (teachers/ming_release.py says so).
    caption_l2: bool = False
    # True: the routed experts as ggk 0.9.7's gk backends compute them (_engine_down), for the
    # engine tier only; False (targets): the real Bailing MoE.
    engine_moe: bool = False

    @property
    def rope_dim(self) -> int:
        return self.head_dim // 2  # T:247: partial_rotary_factor 0.5


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


class GatedMLP(nn.Module):
    """LLM::MLP (llm.hpp 515-546): down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, dim: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, inner, bias=False)
        self.up_proj = nn.Linear(dim, inner, bias=False)
        self.down_proj = nn.Linear(inner, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _attend(q, k, v, mask):
    """q (B, H, T, d), k/v (B, KV, T, d) -> (B, T, H*d). Query head h reads kv head h // (H/KV),
    as ggml's broadcast matmul does; scale 1/sqrt(d); mask additive (B|1, 1, T, T) or None."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    b, h, t, d = y.shape
    return y.transpose(1, 2).reshape(b, t, h * d)


class Experts(nn.Module):
    """The fused expert bank (T:381-384): gate_up (E, 2I, H), down (E, H, I)."""

    def __init__(self, cfg: MingConfig):
        super().__init__()
        e, i, h = cfg.experts, cfg.moe_intermediate, cfg.hidden
        self.gate_up_proj = nn.Module()
        self.gate_up_proj.weight = nn.Parameter(torch.zeros(e, 2 * i, h))
        self.down_proj = nn.Module()
        self.down_proj.weight = nn.Parameter(torch.zeros(e, h, i))


class Router(nn.Module):
    def __init__(self, cfg: MingConfig):
        super().__init__()
        self.proj = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        self.expert_bias = nn.Parameter(torch.zeros(cfg.experts))


class SparseMoe(nn.Module):
    """BailingSparseMoe (T:359-511): text tokens route through `gate`, image (query) tokens
    through `image_gate`; sigmoid scores, the bias steers the choice only; group score = the sum
    of a group's top 2 choices, top `topk_group` groups kept, top `top_k` experts of those;
    weights = the chosen raw scores / their sum (+1e-20), x routed_scaling; plus the shared
    expert."""

    def __init__(self, cfg: MingConfig):
        super().__init__()
        self.cfg = cfg
        self.gate = Router(cfg)
        self.image_gate = Router(cfg)
        self.experts = Experts(cfg)
        if cfg.shared_experts > 0:
            self.shared_experts = GatedMLP(cfg.hidden, cfg.moe_intermediate * cfg.shared_experts)

    def route(self, x, image):
        cfg = self.cfg
        img = image.reshape(-1, 1).to(torch.float32)
        xf = x.reshape(-1, x.shape[-1])
        # fp32 router whatever the weights' dtype (the model's own gate: F.linear on .float())
        xf32 = xf.float()
        logits = (F.linear(xf32, self.gate.proj.weight.float()) * (1 - img)
                  + F.linear(xf32, self.image_gate.proj.weight.float()) * img)
        bias = self.gate.expert_bias.float() * (1 - img) + self.image_gate.expert_bias.float() * img
        scores = torch.sigmoid(logits)
        choice = scores + bias
        n = choice.shape[0]
        grouped = choice.view(n, cfg.n_group, -1)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(group_scores)
        keep.scatter_(1, group_scores.topk(cfg.topk_group, dim=-1).indices, 1.0)
        keep = keep.unsqueeze(-1).expand_as(grouped).reshape(n, -1)
        idx = (choice + (keep - 1.0) * 1e9).topk(cfg.top_k, dim=-1).indices  # T:447-449
        w = scores.gather(1, idx)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * cfg.routed_scaling
        return idx, w

    def forward(self, x, image):
        shape = x.shape
        xf = x.reshape(-1, shape[-1])
        idx, w = self.route(x, image)
        out = torch.zeros(xf.shape, dtype=torch.float32, device=x.device)
        gu, down = self.experts.gate_up_proj.weight, self.experts.down_proj.weight
        inner = down.shape[-1]
        if self.cfg.engine_moe:
            out = _engine_down(xf, idx, w, gu, down)
        for e in ([] if self.cfg.engine_moe else idx.unique().tolist()):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            h = xf[tok] @ gu[e].T
            h = F.silu(h[:, :inner]) * h[:, inner:]  # ggml_swiglu: gate is the first half
            y = h @ down[e].T
            out.index_add_(0, tok, y.float() * w[tok, slot, None])
        out = out.to(x.dtype).reshape(shape)
        if hasattr(self, "shared_experts"):
            out = out + self.shared_experts(x)
        return out


def _engine_down(xf, idx, w, gu, down):
    """What ggk 0.9.7 computes for the routed experts (measured, tests/engine/
    test_ming_teacher_engine.py): its gk backends' mul_mat_id reads ONE activation row per token
    for every slot (gk/src/gk_compute.c gk_compute_mul_mat_id: `gk_row_read(src1, 0, it, ...)`;
    the CUDA kernel reads b(kk, 0, it) the same way), while T:493 passes the per-slot
    activations [I, top_k, T]. So every chosen expert's down projection runs on the activation
    of the token's first (highest-choice) expert. Reproduced only to check the rest of the port
    against the engine; the teacher's targets use the real Bailing MoE (each expert on its own
    activation)."""
    h = torch.einsum("th,toh->to", xf, gu[idx[:, 0]])
    inner = down.shape[-1]
    act0 = F.silu(h[:, :inner]) * h[:, inner:]
    y = torch.einsum("ti,tkhi->tkh", act0, down[idx])
    return (y.float() * w[..., None]).sum(1)


class BailingAttention(nn.Module):
    """T:281-351: fused query_key_value, per-head q/k RMSNorm, rope on the first rope_dim
    channels (NEOX halves, per-token per-frequency angles), causal GQA, `dense` out, no biases."""

    def __init__(self, cfg: MingConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.head_dim
        self.query_key_value = nn.Linear(cfg.hidden, (cfg.heads + 2 * cfg.kv_heads) * d, bias=False)
        self.dense = nn.Linear(cfg.heads * d, cfg.hidden, bias=False)
        self.q_norm = RMSNorm(d, cfg.eps)
        self.k_norm = RMSNorm(d, cfg.eps)

    def forward(self, x, mask, cos, sin):
        cfg = self.cfg
        b, t, _ = x.shape
        d, h, kv = cfg.head_dim, cfg.heads, cfg.kv_heads
        qkv = self.query_key_value(x).view(b, t, h + 2 * kv, d)
        q, k, v = qkv[:, :, :h], qkv[:, :, h : h + kv], qkv[:, :, h + kv :]
        q = _rope_partial(self.q_norm(q), cos, sin)
        k = _rope_partial(self.k_norm(k), cos, sin)
        y = _attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)
        return self.dense(y)


def _rope_partial(x, cos, sin):
    """x (B, T, heads, d); cos/sin (B, T, half): T:303-315."""
    half = cos.shape[-1]
    c, s = cos[:, :, None].to(x.dtype), sin[:, :, None].to(x.dtype)
    first, second, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return torch.cat([first * c - second * s, second * c + first * s, rest], -1)


class BailingBlock(nn.Module):
    def __init__(self, cfg: MingConfig, index: int):
        super().__init__()
        self.attention = BailingAttention(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.dense = index < cfg.first_dense
        self.mlp = GatedMLP(cfg.hidden, cfg.intermediate) if self.dense else SparseMoe(cfg)

    def forward(self, x, mask, cos, sin, image):
        x = x + self.attention(self.input_layernorm(x), mask, cos, sin)
        h = self.post_attention_layernorm(x)
        return x + (self.mlp(h) if self.dense else self.mlp(h, image))


class BailingModel(nn.Module):
    def __init__(self, cfg: MingConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(BailingBlock(cfg, i) for i in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps)


class ConnectorAttention(nn.Module):
    def __init__(self, cfg: MingConfig):
        super().__init__()
        self.cfg = cfg
        d, w = cfg.conn_head_dim, cfg.conn_hidden
        self.q_proj = nn.Linear(w, cfg.conn_heads * d)
        self.k_proj = nn.Linear(w, cfg.conn_kv_heads * d)
        self.v_proj = nn.Linear(w, cfg.conn_kv_heads * d)
        self.o_proj = nn.Linear(cfg.conn_heads * d, w, bias=False)

    def forward(self, x, cos, sin):
        cfg = self.cfg
        b, t, _ = x.shape
        d = cfg.conn_head_dim
        q = self.q_proj(x).view(b, t, cfg.conn_heads, d)
        k = self.k_proj(x).view(b, t, cfg.conn_kv_heads, d)
        v = self.v_proj(x).view(b, t, cfg.conn_kv_heads, d)
        q, k = _rope_partial(q, cos, sin), _rope_partial(k, cos, sin)
        return self.o_proj(_attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None))


class ConnectorLayer(nn.Module):
    def __init__(self, cfg: MingConfig):
        super().__init__()
        self.self_attn = ConnectorAttention(cfg)
        self.mlp = GatedMLP(cfg.conn_hidden, cfg.conn_intermediate)
        self.input_layernorm = RMSNorm(cfg.conn_hidden, cfg.eps)
        self.post_attention_layernorm = RMSNorm(cfg.conn_hidden, cfg.eps)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Connector(nn.Module):
    def __init__(self, cfg: MingConfig):
        super().__init__()
        self.layers = nn.ModuleList(ConnectorLayer(cfg) for _ in range(cfg.conn_layers))
        if cfg.conn_norm:
            self.norm = RMSNorm(cfg.conn_hidden, cfg.eps)


@dataclass
class MingOutput:
    caption: torch.Tensor  # (B, num_queries, caption_dim)
    direct: list  # per sample (P_i, diffusion_dim)
    states: list  # per sample (P_i, hidden * (len(direct_states) + 1)): hs[5], hs[12], final norm


def video_positions(prompt_len: int, num_queries: int, image: tuple | None = None):
    """(3, P + num_queries + 2) int64 t/h/w positions of one sequence and its (T,) bool image
    mask (T:818-875). Text counts up on all three axes; an image block (start, grid_h, grid_w)
    takes the next t for all its tokens with centred h / w offsets, and the text after it goes on
    at t + 1. The query bank is a (1, num_queries) block at the position after the prompt's
    <image>; `image` is an input image's run inside the prompt (an edit's reference)."""
    total = prompt_len + num_queries + 2
    pos = torch.zeros(3, total, dtype=torch.long)
    is_image = torch.zeros(total, dtype=torch.bool)
    blocks = ([image] if image is not None else []) + [(prompt_len + 1, 1, num_queries)]
    nxt = tok = 0
    for start, gh, gw in blocks:
        if start < tok or start + gh * gw > total:
            raise ValueError(f"image block {(start, gh, gw)} outside the sequence")
        pos[:, tok:start] = torch.arange(nxt, nxt + start - tok)
        nxt += start - tok
        i = torch.arange(gh * gw)
        span = slice(start, start + gh * gw)
        pos[0, span] = nxt
        pos[1, span] = nxt + i // gw - (gh - 1) // 2
        pos[2, span] = nxt + i % gw - (gw - 1) // 2
        is_image[span] = True
        tok, nxt = start + gh * gw, nxt + 1
    pos[:, tok:] = torch.arange(nxt, nxt + total - tok)
    return pos, is_image


def video_rope(pos: torch.Tensor, rope_dim: int, theta: float):
    """cos/sin (T, rope_dim / 2) float32 from (3, T) positions: frequency j reads h (even j) or
    w (odd j) below SPATIAL_FREQS, t above; angles in float64 as the engine (T:884-892)."""
    half = rope_dim // 2
    j = torch.arange(half, dtype=torch.float64)
    inv = 1.0 / torch.pow(torch.tensor(theta, dtype=torch.float64), 2 * j / rope_dim)
    axis = torch.where(j < SPATIAL_FREQS, torch.where(j % 2 == 0, 1, 2), 0).long()
    p = pos.to(torch.float64)[axis].T  # (T, half)
    ang = p * inv
    return ang.cos().float(), ang.sin().float()


def neox_rope(n: int, dim: int, theta: float):
    """Plain 1-D rope for positions 0..n-1 over `dim` channels (NEOX halves): cos/sin (n, dim/2)."""
    inv = 1.0 / torch.pow(torch.tensor(theta, dtype=torch.float64),
                          torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv
    return ang.cos().float(), ang.sin().float()


class MingTextEncoder(nn.Module):
    """MingImageTextModel (T:607-727) for text prompts (no input image)."""

    def __init__(self, cfg: MingConfig):
        super().__init__()
        self.cfg = cfg
        self.thinker = BailingModel(cfg)
        self.connector = Connector(cfg)
        self.query_tokens = nn.Parameter(torch.zeros(cfg.num_queries, cfg.hidden))
        self.proj_in = nn.Linear(cfg.hidden, cfg.conn_hidden)
        self.proj_out = nn.Linear(cfg.conn_hidden, cfg.caption_dim)
        n_direct = len(cfg.direct_states) + 1
        self.proj_directvlm = nn.Sequential(RMSNorm(cfg.hidden * n_direct, 1e-5),
                                            nn.Linear(cfg.hidden * n_direct, cfg.diffusion_dim))

    def sequence(self, prompt: list[int]) -> list[int]:
        return list(prompt) + [IMAGE_START] + [IMAGE_PATCH] * self.cfg.num_queries + [IMAGE_END]

    @torch.no_grad()
    def forward(self, prompts: list[list[int]], want_states: bool = False,
                images: list | None = None) -> MingOutput:
        """prompts: the Ling ids of each templated prompt (Ming's template, no generation block).
        images: per prompt None or (rows (n, hidden), start, grid_h, grid_w): an input image's
        tower rows (ming_vision.py) laid over its <imagePatch> run from `start` (T:672-693), its
        tokens routed through image_gate like the query bank's.
        Right-padded batch: each sequence ends with its query block and every layer is causal,
        so a real row never reads a pad and each sample equals its own unpadded run."""
        cfg = self.cfg
        nq = cfg.num_queries
        dev = self.query_tokens.device
        dtype = self.query_tokens.dtype
        lens = [len(p) for p in prompts]
        total = max(lens) + nq + 2
        b = len(prompts)
        ids = torch.full((b, total), IMAGE_END, dtype=torch.long)
        cos = torch.zeros(b, total, cfg.rope_dim // 2)
        sin = torch.zeros_like(cos)
        image = torch.zeros(b, total)
        images = images or [None] * b
        for i, p in enumerate(prompts):
            seq = self.sequence(p)
            ids[i, : len(seq)] = torch.tensor(seq)
            block = None if images[i] is None else tuple(images[i][1:])
            pos, is_image = video_positions(len(p), nq, block)
            c, s = video_rope(pos, cfg.rope_dim, cfg.rope_theta)
            cos[i, : len(seq)], sin[i, : len(seq)] = c, s
            image[i, : len(seq)] = is_image.float()
        x = self.thinker.embed_tokens(ids.to(dev)).to(dtype)
        for i, p in enumerate(prompts):
            x[i, len(p) + 1 : len(p) + 1 + nq] = self.query_tokens
            if images[i] is not None:
                rows, start = images[i][0], images[i][1]
                x[i, start : start + rows.shape[0]] = rows.to(dev, dtype)
        causal = torch.full((total, total), float("-inf")).triu(1).to(dev, dtype)
        mask = causal[None, None]
        cos, sin, image = cos.to(dev), sin.to(dev), image.to(dev)
        captured = []
        for li, layer in enumerate(self.thinker.layers):
            x = layer(x, mask, cos, sin, image)
            if li + 1 in cfg.direct_states:
                captured.append(x)
        final = self.thinker.norm(x)
        captured.append(final)
        states = [torch.cat([c[i, :n] for c in captured], -1) for i, n in enumerate(lens)]
        direct = [self.proj_directvlm(s) for s in states]
        q = torch.stack([final[i, n + 1 : n + 1 + nq] for i, n in enumerate(lens)])
        h = self.proj_in(q)
        c, s = neox_rope(nq, cfg.conn_head_dim, cfg.conn_theta)
        c, s = c[None].to(dev), s[None].to(dev)
        for layer in self.connector.layers:
            h = layer(h, c, s)
        if cfg.conn_norm:
            h = self.connector.norm(h)
        caption = self.proj_out(h)
        if cfg.caption_l2:
            caption = F.normalize(caption, dim=-1)
        return MingOutput(caption, direct, states if want_states else [])


def engine_tensors(model: MingTextEncoder) -> dict:
    """name -> float32 numpy array in torch layout, under the names MingImageTextRunner reads
    after `text_encoders.llm.` (the module's own state dict names)."""
    return {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}


def check_config(cfg: MingConfig) -> list[str]:
    """What the engine's detection (T:186-277) would read differently from this config."""
    p = []
    if cfg.experts % cfg.n_group or cfg.experts // cfg.n_group < 2:
        p.append("experts must be a multiple of 8 groups with >= 2 experts per group")
    if cfg.conn_hidden != 1536 or cfg.conn_head_dim != 128:
        p.append("the engine reads the connector as 1536 wide with 128-wide heads")
    if cfg.layers < max(cfg.direct_states):
        p.append(f"directvlm reads hidden state {max(cfg.direct_states)}: needs that many layers")
    if cfg.vocab < VOCAB:
        p.append("the Ling image tokens (157157-157159) need the full 157184-row table")
    if cfg.diffusion_dim < cfg.caption_dim:
        p.append("caption rows are zero-padded to the direct width: caption_dim <= diffusion_dim")
    if math.gcd(cfg.heads, cfg.kv_heads) != cfg.kv_heads:
        p.append("heads must be a multiple of kv_heads")
    return p
