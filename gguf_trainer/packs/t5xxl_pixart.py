"""PixArt / T5-XXL pack (the original trainer recipe): pig_clip + a 120-query resampler
seeded with the T5 window ids replaces the 4.7B T5-XXL v1.1 encoder. Targets are the
encoder's last_hidden_state at the real slots (incl. EOS). Engine facts: contract §3.3."""

from __future__ import annotations

import copy
from pathlib import Path

from gguf_trainer.materials.spec import Material

from .base import TrainerPack, Verdict

T5_WINDOW = 120  # PixArt-alpha caption_length
# PixArtT5Embedder (conditioner.hpp 1781-1822): the raw prompt's weight chunks, no template
# (engine_template {}), for the student (the base pack's pieces) and for T5 (teachers/t5.py).
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
    # Prompts over the window are cut to it with EOS last, as the engine cuts them (the student
    # still reads the whole prompt), so no teacher length exceeds it and none is dropped.
    max_len_teacher = T5_WINDOW
    headline = "cos"  # slot-weighted over the real slots
    eval_keys = ("cos", "rel_mse", "cos_eos", "cos_rms", "worst_row_cos", "worst_sample_cos",
                 "roundtrip_cos", "baseline_cos")
    teacher_materials = (
        Material(
            "teacher",
            "Teacher: T5-XXL v1.1 encoder (bf16)",
            "hf_snapshot",
            repo="callgg/t5-v1_1-xxl-encoder-bf16",
            subdir="t5-v1_1-xxl-encoder-bf16",
            size_gb=9.5,
            patterns=(
                "config.json",
                "generation_config.json",
                "model.safetensors",
                "special_tokens_map.json",
                "spiece.model",
                "tokenizer_config.json",
            ),
        ),
    )
    defaults = {
        "corpus.n_train": 120000,
        "corpus.n_val": 2048,
        "precompute.shard_size": 1024,
        "precompute.val_shard_size": 512,
        "train.width": 1024,
        "train.depth": 6,
        "train.steps": 20000,
        "train.batch_size": 32,
        "train.sigma_floor": 0.03,
        "export.export_sigvq": False,
    }
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
    engine_notes = (
        (
            "run pig_clip at f16 or q8_0 in the engine: a 4-bit student loses ~0.09 cosine "
            "before the adapter runs"
        ),
    )
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
        "adapter.teacher": "callgg/t5-v1_1-xxl-encoder-bf16",
    }
    bytes_per_sample = 40 * 4096 * 2 + 30 * 1024 * 2 + T5_WINDOW * 4

    def configured(self, settings):
        """PixArt-Σ reads 300 caption slots, PixArt-α 120 (the DiT's caption_length; contract
        §3.3): `precompute.t5_window` sets the window, the adapter's num_queries (the engine
        takes it from the `query` shape and never adapts it on PixArt) and the shard contract.
        The 120 default is this pack as registered, so existing projects keep their
        fingerprints."""
        from ..teachers.t5 import check_window

        window = check_window(settings.precompute.t5_window)
        if window == self.num_queries:
            return self
        pack = copy.copy(self)
        pack.num_queries = pack.max_len_teacher = window
        pack.shard_contract = f"{self.shard_contract}/window{window}"
        pack.bytes_per_sample = self.bytes_per_sample + (window - self.num_queries) * 4
        pack.export_kv = {
            **self.export_kv,
            "adapter.target": f"t5_v1_1_xxl encoder last_hidden_state, {window}-slot PixArt window",
        }
        return pack

    def teacher_gib(self, materials, device):
        """The encoder's weights as they will sit in memory, from the snapshot's header: bf16 with
        a CUDA card (resident or streamed), fp32 on a CPU-only machine. A snapshot that would
        not load (no spiece.model, a missing or cut shard, wrong shapes) fails here, in
        seconds, before the student or any weights load."""
        import torch

        from ..teachers.t5 import check_snapshot, encoder_gib

        report = check_snapshot(materials["teacher"], vocab_limit=self.seed_vocab)
        return encoder_gib(report.n_params, "cpu" if torch.device(device).type != "cuda" else "gpu")

    def load_teacher(self, materials, plan, device):
        """T5EncoderModel from the snapshot, placed as the planner chose: gpu (resident),
        offload (weights in RAM, each module streamed through the card), cpu (fp32)."""
        from ..teachers.t5 import load_t5_teacher

        return load_t5_teacher(
            materials["teacher"],
            device,
            plan.mode,
            window=self.num_queries,
            vocab_limit=self.seed_vocab,
            ram_limit_gib=plan.cpu_gib,
        )

    def check_teacher(self, materials) -> str:
        """Header-only check of the teacher snapshot (names, shapes, tokenizer, complete shards;
        no weights read): its one-line summary, or a UserError naming the file to fix."""
        from ..teachers.t5 import check_snapshot

        return check_snapshot(materials["teacher"], vocab_limit=self.seed_vocab).summary()

    def seed_tokenizer_file(self, materials):
        """The snapshot's spiece.model: the seed ids' pieces (teachers/t5.py loads the same)."""
        from ..teachers.t5 import SPIECE

        return Path(materials["teacher"]) / SPIECE

    def demo_materials(self, folder):
        """The tiny real T5 snapshot shipped with the package (random 2-block encoder, d_model
        64, a 239-piece sentencepiece model): the demo runs the real teacher code offline."""
        import shutil

        from gguf_trainer.tiny.t5_tiny import DEMO_DIR

        dest = folder / "t5-tiny-encoder"
        shutil.copytree(DEMO_DIR, dest, dirs_exist_ok=True)
        return {"teacher": dest}

    def build_mock_teacher(self, project):
        from .mock import MockSlotTeacher

        return MockSlotTeacher(self.id, self.num_queries, self.seed_vocab, self.out_dim)


PACK = PixArtT5Pack()
