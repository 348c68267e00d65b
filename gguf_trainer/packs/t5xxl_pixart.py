"""PixArt / T5-XXL pack (the original trainer recipe): pig_clip + a 120-query resampler
seeded with the T5 window ids replaces the 4.7B T5-XXL v1.1 encoder. Targets are the
encoder's last_hidden_state at the real slots (incl. EOS). Engine facts: contract §3.3."""

from __future__ import annotations

from .base import Material, TrainerPack

T5_WINDOW = 120  # PixArt-alpha caption_length
T5_VOCAB = 32128  # T5 v1.1 sentencepiece


class PixArtT5Pack(TrainerPack):
    id = "t5xxl_pixart"
    title = "PixArt (T5-XXL)"
    description = ("Replaces the T5-XXL v1.1 encoder with pig_clip + a 120-query resampler "
                   "seeded with the T5 token ids; the T5 tokenizer stays at inference.")
    adapter_kind = "seeded_resampler"
    out_dim = 4096
    num_queries = T5_WINDOW
    seed_vocab = T5_VOCAB
    default_name = "t5_adapter"
    shard_contract = "t5xxl_pixart/2"
    max_len_student = 512
    headline = "cos"  # slot-weighted over the real slots
    eval_keys = ("cos", "rel_mse", "cos_eos", "cos_rms", "worst_row_cos", "worst_sample_cos",
                 "roundtrip_cos", "baseline_cos")
    teacher_materials = (
        Material("teacher", "Teacher: T5-XXL v1.1 encoder (bf16)", "hf_snapshot",
                 repo="callgg/t5-v1_1-xxl-encoder-bf16", subdir="t5-v1_1-xxl-encoder-bf16", size_gb=9.5,
                 patterns=("config.json", "generation_config.json", "model.safetensors",
                           "special_tokens_map.json", "spiece.model", "tokenizer_config.json")),
    )
    defaults = {
        "corpus.n_train": 120000, "corpus.n_val": 2048,
        "precompute.shard_size": 1024, "precompute.val_shard_size": 512,
        "train.width": 1024, "train.depth": 6, "train.steps": 20000, "train.batch_size": 32,
        "train.sigma_floor": 0.03, "export.export_sigvq": False,
    }
    hints = {
        "train": "Reference: val cos 0.827 at 12.5k steps on 117k prompts; runs plateau at 0.80-0.83.",
        "eval": "Judge by cos over the real slots and rel_mse; cos_eos isolates the EOS slot. Under ~0.6 "
                "means the seed or tokenizer path is broken.",
    }
    teacher_memory_gib = 12.0
    engine_command_template = (
        "ggk diffuser engine -- --diffusion-model pixart-nvfp4.gguf --vae pig_pixart_vae_fp16-f16.gguf "
        "--llm {student} --llm-adapter {adapter} -p \"close-up portrait of a young lady\" "
        "--diffusion-fa -s 42 -o out.png")
    export_kv = {
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.target": "t5_v1_1_xxl encoder last_hidden_state, 120-slot PixArt window",
        "adapter.teacher": "callgg/t5-v1_1-xxl-encoder-bf16",
    }
    bytes_per_sample = 40 * 4096 * 2 + 30 * 1024 * 2 + T5_WINDOW * 4

    def build_mock_teacher(self, project):
        from .mock import MockSlotTeacher

        return MockSlotTeacher(self.id, self.num_queries, self.seed_vocab, self.out_dim)


PACK = PixArtT5Pack()
