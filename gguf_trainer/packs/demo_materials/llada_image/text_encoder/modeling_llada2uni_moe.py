"""A tiny LLaDA2-MoE-like backbone, shipped as remote code (trust_remote_code) for gguf-trainer's
demo and tests.

It keeps the interface of the released `text_encoder/modeling_llada2uni_moe.py` and, on purpose,
its traps under transformers 5 (reference: llada-remote-code.md):
1. it imports `transformers.modeling_attn_mask_utils`, which transformers 5 no longer ships;
2. the RoPE table `inv_freq` is a non-persistent buffer computed in `__init__`, which
   transformers 5 leaves uninitialised for remote models;
3. the top-level `LLaDA2MoeModelLM.forward` builds its output with `past_key_values=`, which
   transformers 5 renamed (`cache`): a TypeError; call `get_decoder()`;
4. the experts refuse to run under autograd.
Attention is never causal: a 4-D mask goes to SDPA as is; a 2-D mask with padding turns into
causal + padding (as in the original), an all-ones 2-D mask is dropped.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_attn_mask_utils import _prepare_4d_causal_attention_mask_for_sdpa
from transformers.modeling_outputs import BaseModelOutputWithPast, MoeCausalLMOutputWithPast
from transformers.modeling_utils import PreTrainedModel

from .configuration_llada2uni_moe import LLaDA2MoeConfig
from .fused_moe_ops import FusedExperts


def _default_rope_init(config, device=None):
    """The file's own "default" RoPE: 1 / theta^(arange(0, rd, 2) / rd), rd = partial dims."""
    rd = int(config.head_dim * config.partial_rotary_factor)
    inv = 1.0 / (
        config.rope_theta ** (torch.arange(0, rd, 2, dtype=torch.int64).float().to(device) / rd)
    )
    return inv, 1.0


class LLaDA2MoeRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class LLaDA2MoeRotaryEmbedding(nn.Module):
    def __init__(self, config, device=None):
        super().__init__()
        self.rope_type = "default"
        self.config = config
        self.rope_init_fn = _default_rope_init
        inv_freq, self.attention_scaling = self.rope_init_fn(config, device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.original_inv_freq = self.inv_freq

    @torch.no_grad()
    def forward(self, x, position_ids):
        freqs = position_ids[:, :, None].float() * self.inv_freq.float()[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (
            emb.sin() * self.attention_scaling
        ).to(x.dtype)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _apply_rope(x, cos, sin):
    rd = cos.shape[-1]  # partial rotary: only the first rd dims of each head turn
    x_rot, x_pass = x[..., :rd], x[..., rd:]
    x_rot = x_rot * cos[:, None] + _rotate_half(x_rot) * sin[:, None]
    return torch.cat((x_rot, x_pass), dim=-1)


class LLaDA2MoeAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        qkv = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.query_key_value = nn.Linear(config.hidden_size, qkv, bias=False)
        self.query_layernorm = LLaDA2MoeRMSNorm(self.head_dim, config.rms_norm_eps)
        self.key_layernorm = LLaDA2MoeRMSNorm(self.head_dim, config.rms_norm_eps)
        self.dense = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, attention_mask):
        b, t, _ = x.shape
        qkv = self.query_key_value(x).view(b, t, self.heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=2)
        q = _apply_rope(self.query_layernorm(q).transpose(1, 2), cos, sin)
        k = _apply_rope(self.key_layernorm(k).transpose(1, 2), cos, sin)
        v = v.transpose(1, 2)
        rep = self.heads // self.kv_heads
        out = F.scaled_dot_product_attention(
            q,
            k.repeat_interleave(rep, 1),
            v.repeat_interleave(rep, 1),
            attn_mask=attention_mask,
            is_causal=False,
        )
        return self.dense(out.transpose(1, 2).reshape(b, t, -1))


class LLaDA2MoeMLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LLaDA2MoeGate(nn.Module):
    """Grouped routing: sigmoid scores (+ bias for the choice), best `topk_group` of `n_group`
    groups, then the top `num_experts_per_tok` experts inside them."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        self.expert_bias = nn.Parameter(torch.zeros(config.num_experts), requires_grad=False)

    def forward(self, x):
        c = self.config
        scores = torch.sigmoid(F.linear(x.float(), self.weight.float()))  # (N, E)
        choice = scores + self.expert_bias.float()
        groups = (
            choice.view(x.shape[0], c.n_group, -1)
            .topk(min(2, c.num_experts // c.n_group), dim=-1)[0]
            .sum(-1)
        )
        keep = torch.zeros_like(groups).scatter_(1, groups.topk(c.topk_group, dim=-1)[1], 1.0)
        keep = keep.repeat_interleave(c.num_experts // c.n_group, dim=1).bool()
        ids = choice.masked_fill(~keep, float("-inf")).topk(c.num_experts_per_tok, dim=-1)[1]
        w = scores.gather(1, ids)
        return ids, w / (w.sum(-1, keepdim=True) + 1e-20) * c.routed_scaling_factor


class LLaDA2MoeSparseMoeBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate = LLaDA2MoeGate(config)
        self.experts = FusedExperts(
            config.num_experts, config.hidden_size, config.moe_intermediate_size
        )
        self.shared_experts = LLaDA2MoeMLP(
            config.hidden_size, config.moe_intermediate_size * config.num_shared_experts
        )

    def forward(self, x):
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        ids, w = self.gate(flat)
        return (self.experts(flat, ids, w) + self.shared_experts(flat)).view(shape)


class LLaDA2MoeDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.input_layernorm = LLaDA2MoeRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = LLaDA2MoeAttention(config)
        self.post_attention_layernorm = LLaDA2MoeRMSNorm(config.hidden_size, config.rms_norm_eps)
        dense = layer_idx < config.first_k_dense_replace
        self.mlp = (
            LLaDA2MoeMLP(config.hidden_size, config.intermediate_size)
            if dense
            else LLaDA2MoeSparseMoeBlock(config)
        )

    def forward(self, x, cos, sin, attention_mask):
        x = x + self.attention(self.input_layernorm(x), cos, sin, attention_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LLaDA2MoePreTrainedModel(PreTrainedModel):
    config_class = LLaDA2MoeConfig
    base_model_prefix = "model"
    _no_split_modules = ["LLaDA2MoeDecoderLayer"]
    _supports_sdpa = True

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(0.0, 0.02)


class LLaDA2MoeModel(LLaDA2MoePreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LLaDA2MoeDecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = LLaDA2MoeRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = LLaDA2MoeRotaryEmbedding(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.word_embeddings

    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, **kwargs
    ):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        x = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        b, t, _ = x.shape
        if position_ids is None:
            position_ids = torch.arange(t, device=x.device).unsqueeze(0).expand(b, -1)
        if attention_mask is not None and attention_mask.dim() == 2:
            # the original's 2-D path: causal + padding, or nothing for an all-ones mask
            attention_mask = _prepare_4d_causal_attention_mask_for_sdpa(
                attention_mask, (b, t), x, 0
            )
        cos, sin = self.rotary_emb(x, position_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, attention_mask)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(x))


class _Language(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.language_model = LLaDA2MoeModel(config)


class LLaDA2MoeModelLM(LLaDA2MoePreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = _Language(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_decoder(self):
        return self.model.language_model

    def get_input_embeddings(self):
        return self.model.language_model.word_embeddings

    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, **kwargs
    ):
        out = self.model.language_model(input_ids, attention_mask, position_ids, inputs_embeds)
        logits = self.lm_head(out.last_hidden_state)
        # 5.x renamed it: TypeError
        return MoeCausalLMOutputWithPast(logits=logits, past_key_values=None)
