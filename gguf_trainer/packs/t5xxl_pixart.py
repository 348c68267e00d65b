"""PixArt / T5-XXL pack (the original trainer recipe): pig_clip + a 120-query resampler
seeded with the T5 window ids replaces the 4.7B T5-XXL v1.1 encoder. Targets are the
encoder's last_hidden_state at the real slots (incl. EOS). Engine facts: contract §3.3.
Facts only: the T5 kind (t5_seeded.py) owns the behaviour."""

from __future__ import annotations

from .base import Verdict
from .t5_seeded import F16_NOTE, PIXART_EMBEDDER, T5_VOCAB, T5SeededPack
from .teacher_repos import T5_V1_1_XXL, T5_V1_1_XXL_TEACHER

T5_WINDOW = 120  # PixArt-alpha caption_length
# PixArtT5Embedder (conditioner.hpp 1655-1891): the raw prompt's weight chunks, no template
# (engine_template {}), for the student (the base pack's pieces) and for T5 (teachers/t5.py).


class PixArtT5Pack(T5SeededPack):
    id = "t5xxl_pixart"
    title = "PixArt (T5-XXL)"
    description = ("Replaces the T5-XXL v1.1 encoder with pig_clip + a 120-query resampler "
                   "seeded with the T5 token ids; the T5 tokenizer stays at inference.")
    # the window is the DiT's caption length: 120 (PixArt-α) as registered, 300 (PixArt-Σ)
    # through precompute.t5_window
    embedder = PIXART_EMBEDDER
    num_queries = T5_WINDOW
    seed_vocab = T5_VOCAB
    default_name = "t5_adapter"
    shard_contract = "t5xxl_pixart/2"
    teacher_materials = (T5_V1_1_XXL_TEACHER,)
    field_meta = {
        "train.steps": {
            "help": "planned training steps; the reference run reached val cos 0.827 "
            "at 12.5k steps on 117k prompts (20k is the recipe)"
        },
        "corpus.n_train": {"help": "training prompts; the reference recipe used ~117k-120k"},
    }
    hints = {
        "train": "Reference: val cos 0.827 at 12.5k steps on 117k prompts; "
                 "runs plateau at 0.80-0.83.",
        "eval": "Judge by cos over the real slots and rel_mse; cos_eos isolates "
                "the EOS slot. Under ~0.6 "
        "means the seed or tokenizer path is broken.",
    }
    # 4.76B parameters in bf16 (8.87 GiB, the snapshot's own header says the same); the planner
    # adds its activation headroom for a resident teacher (~11 GiB, the "~12 GiB budget").
    teacher_memory_gib = 8.9
    # the health floor (cos ~0.6) reads a broken seed/tokenizer from here on
    health_after_steps = 2000
    health_early_hint = "cos at or under ~0.6 means a broken seed or tokenizer path"
    health_reference = "val cos 0.827 at 12.5k steps, runs plateau at 0.80-0.83"
    verdict = Verdict("cos", 0.80, 0.60, "under ~0.6 the seed or tokenizer path is broken")
    check_default_for_kind = True  # `check` reads a seeded resampler naming no pack as PixArt's
    reference = {
        "val cos": 0.827,
        "at step": 12500,
        "prompts": 117000,
        "plateau of both reference runs": "0.80-0.83 (the 0.6B student is the ceiling)",
    }
    engine_notes = (F16_NOTE,)
    # the T5-XXL encoder itself (engine-contract §3.3: without --llm-adapter ggk runs --t5xxl)
    engine_teacher_args = "--t5xxl t5xxl_fp16.safetensors"
    engine_command_template = (
        "ggk diffuser engine -- --diffusion-model pixart-nvfp4.gguf --vae "
        "pig_pixart_vae_fp16-f16.gguf "
        '--llm {student} --llm-adapter {adapter} -p "close-up portrait of a young lady" '
        "--diffusion-fa -s 42 -o out.png"
    )
    export_kv = {
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.target": "t5_v1_1_xxl encoder last_hidden_state, 120-slot PixArt window",
        "adapter.teacher": T5_V1_1_XXL,
    }
    typical_rows = 40  # real slots of a reference-corpus prompt (bytes_per_sample)


PACK = PixArtT5Pack()
