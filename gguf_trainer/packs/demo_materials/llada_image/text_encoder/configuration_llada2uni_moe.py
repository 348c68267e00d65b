"""A tiny LLaDA2-MoE-like config, shipped as remote code (trust_remote_code) for gguf-trainer's
demo and tests. Same interface as the released `text_encoder/configuration_llada2uni_moe.py`."""

from transformers.configuration_utils import PretrainedConfig


class LLaDA2MoeConfig(PretrainedConfig):
    model_type = "llada2_moe_veomni"

    def __init__(self, vocab_size=512, hidden_size=64, intermediate_size=128,
                 moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
                 n_group=2, topk_group=1, num_shared_experts=1, first_k_dense_replace=1,
                 routed_scaling_factor=1.0, rms_norm_eps=1e-6, rope_theta=600000.0,
                 partial_rotary_factor=0.5, max_position_embeddings=4096, pad_token_id=0,
                 **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.moe_intermediate_size = moe_intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.num_experts = num_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.n_group = n_group
        self.topk_group = topk_group
        self.num_shared_experts = num_shared_experts
        self.first_k_dense_replace = first_k_dense_replace
        self.routed_scaling_factor = routed_scaling_factor
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.partial_rotary_factor = partial_rotary_factor
        self.max_position_embeddings = max_position_embeddings
        super().__init__(pad_token_id=pad_token_id, **kwargs)
