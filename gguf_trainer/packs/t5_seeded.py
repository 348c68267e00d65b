"""The T5 kind: pig_clip + a seeded resampler (learned queries, each seeded with the engine's T5 id
at its slot) replaces a T5-XXL / UMT5-XXL encoder. PixArt, Chroma and Wan are its families.

This class owns the behaviour every T5 family shares: the window (the adapter's num_queries, one
row per T5 slot; prompts over it are cut with EOS last, as the engine cuts them, so none is
dropped), the T5 teacher (teachers/t5.py) run in the family's mask mode, its header check and
memory figure, the seed tokenizer `check` reads, the tiny demo teacher, the mock teacher, and the
rows `gguf-trainer check` compares. A family module declares facts only:

  * `embedder`: the engine's conditioner. PIXART_EMBEDDER (PixArtT5Embedder, conditioner.hpp
    1655-1891): the window is the DiT's caption length, 120 or 300, which
    `precompute.t5_window` picks (`configured`). T5CLIP_EMBEDDER (T5CLIPEmbedder): chunk_len 512
    (conditioner.hpp 1199), the adapter's num_queries (1240-1245), one window for every model;
  * `num_queries` (the window), `seed_vocab` (the seed table's rows: the T5 vocabulary);
  * the mask mode: `masked` (the T5 attends to real slots only) and `dit_pad_rows` (how many pad
    slots after the real ones the DiT reads: the engine unmasks that many, conditioner.hpp
    1396-1410, 1533); the supervised rows and `check`'s rows are the real slots plus those;
  * the teacher snapshot (`teacher_materials`, `diffusers_layout`, `encoder_name`), hints,
    reference figures, export KVs and the ggk command.
"""

from __future__ import annotations

import copy
from pathlib import Path

from .base import TrainerPack

PIXART_EMBEDDER = "PixArtT5Embedder"
T5CLIP_EMBEDDER = "T5CLIPEmbedder"
T5CLIP_WINDOW = 512  # conditioner.hpp:1199
T5_VOCAB = 32128  # T5 v1.1 sentencepiece (32000 pieces + 100 sentinels, rounded up)
STUDENT_ROWS = 30  # student tokens of a reference-corpus prompt (the shard estimate)
F16_NOTE = (
    "run pig_clip at f16 or q8_0 in the engine: a 4-bit student loses ~0.09 cosine "
    "before the adapter runs"
)


class T5SeededPack(TrainerPack):
    """Base of the T5 family packs (not registered itself)."""

    adapter_kind = "seeded_resampler"
    out_dim = 4096  # T5-XXL / UMT5-XXL d_model
    max_len_student = 512
    headline = "cos"  # slot-weighted over the supervised slots
    eval_keys = ("cos", "rel_mse", "cos_eos", "cos_rms", "worst_row_cos", "worst_sample_cos",
                 "roundtrip_cos", "baseline_cos")
    # The recipe of the reference runs (PixArt, the same T5-XXL teacher); no other T5 family has
    # a measured recipe of its own yet.
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
    export_kv = {"adapter.qwen_hidden_source": "final_norm"}
    # both T5 embedders dump SD_DUMP_COND only when they run the adapter (conditioner.hpp
    # 1460-1483 T5CLIPEmbedder, 1844-1867 PixArtT5Embedder): a T5 dump is always the engine's
    # run of this very file
    port_check_dump = "adapter_out.bin"
    engine_notes = (F16_NOTE,)

    # The family's facts (module docstring); these defaults are T5CLIPEmbedder's.
    embedder = T5CLIP_EMBEDDER
    num_queries = T5CLIP_WINDOW
    seed_vocab = T5_VOCAB
    masked = True
    dit_pad_rows = 0
    encoder_name = "t5_encoder"  # the teacher's fingerprint name
    diffusers_layout = False  # the snapshot is text_encoder/ + tokenizer/ (else one folder)
    typical_rows = 40  # supervised rows of a reference-corpus prompt (the shard estimate)

    @property
    def max_len_teacher(self) -> int:  # type: ignore[override]
        """The window: prompts over it are cut to it with EOS last, so none is dropped."""
        return self.num_queries

    @property
    def bytes_per_sample(self) -> int:  # type: ignore[override]
        """Shard bytes: the supervised rows of the teacher and the student's states (bf16),
        and the window's int32 ids."""
        return self.typical_rows * self.out_dim * 2 + STUDENT_ROWS * 1024 * 2 + self.num_queries * 4

    def configured(self, settings):
        """A PixArtT5Embedder family reads 300 caption slots (PixArt-Σ) or 120 (PixArt-α), the
        DiT's caption_length (contract §3.3): `precompute.t5_window` sets the window, the
        adapter's num_queries (the engine takes it from the `query` shape and never adapts it
        on PixArt) and the shard contract. The window the family declares is the pack as
        registered, so existing projects keep their fingerprints. A T5CLIPEmbedder family has
        one window for every model: the pack itself."""
        if self.embedder != PIXART_EMBEDDER:
            return self
        from ..teachers.t5 import check_window

        window = check_window(settings.precompute.t5_window)
        if window == self.num_queries:
            return self
        pack = copy.copy(self)
        pack.num_queries = window
        pack.shard_contract = f"{self.shard_contract}/window{window}"
        if "adapter.target" in self.export_kv:
            pack.export_kv = {
                **self.export_kv,
                "adapter.target": self.export_kv["adapter.target"].replace(
                    f"{self.num_queries}-slot", f"{window}-slot"
                ),
            }
        return pack

    def teacher_files(self, materials: dict[str, Path]) -> tuple[Path, Path]:
        """(encoder folder, spiece.model) of the linked teacher: a diffusers layout's
        text_encoder/ and tokenizer/spiece.model (`diffusers_layout`), else one folder holding
        both."""
        from ..teachers.t5 import SPIECE

        root = Path(materials["teacher"])
        if self.diffusers_layout and (root / "text_encoder").is_dir():
            return root / "text_encoder", root / "tokenizer" / SPIECE
        return root, root / SPIECE

    def teacher_windows(self):
        """The windows the engine builds for the family (teachers/t5.py refuses any other)."""
        from ..teachers.t5 import CAPTION_LENGTHS, T5CLIP_WINDOWS

        return CAPTION_LENGTHS if self.embedder == PIXART_EMBEDDER else T5CLIP_WINDOWS

    def teacher_identity(self) -> dict:
        """The teacher's part of the shard fingerprint: a mask mode other than the default is part
        of what the targets are."""
        identity = {"teacher": self.encoder_name, "window": self.num_queries}
        if not self.masked or self.dit_pad_rows:
            identity.update(masked=self.masked, pad_rows=self.dit_pad_rows)
        return identity

    def teacher_gib(self, materials, device):
        """The encoder's weights as they will sit in memory, from the snapshot's header: bf16 with
        a CUDA card (resident or streamed), fp32 on a CPU-only machine. A snapshot that would
        not load (no spiece.model, a missing or cut shard, wrong shapes) fails here, in
        seconds, before the student or any weights load."""
        import torch

        from ..teachers.t5 import check_snapshot, encoder_gib

        encoder, spiece = self.teacher_files(materials)
        report = check_snapshot(encoder, vocab_limit=self.seed_vocab, spiece=spiece)
        return encoder_gib(report.n_params, "cpu" if torch.device(device).type != "cuda" else "gpu")

    def check_teacher(self, materials) -> str:
        """Header-only check of the teacher snapshot (names, shapes, tokenizer, complete shards;
        no weights read): its one-line summary, or a UserError naming the file to fix."""
        from ..teachers.t5 import check_snapshot

        encoder, spiece = self.teacher_files(materials)
        return check_snapshot(encoder, vocab_limit=self.seed_vocab, spiece=spiece).summary()

    def seed_tokenizer_file(self, materials):
        """The snapshot's spiece.model: the seed ids' pieces (the teacher loads the same)."""
        return self.teacher_files(materials)[1]

    def load_teacher(self, materials, plan, device):
        """The T5 / UMT5 encoder from the snapshot in the family's mask mode, placed as the
        planner chose: gpu (resident), offload (weights in RAM, each module streamed through the
        card), cpu (fp32). Targets: the real slots and the `dit_pad_rows` pads after them."""
        from ..teachers.t5 import load_t5_teacher

        encoder, spiece = self.teacher_files(materials)
        return load_t5_teacher(
            encoder,
            device,
            plan.mode,
            window=self.num_queries,
            identity=self.teacher_identity(),
            vocab_limit=self.seed_vocab,
            ram_limit_gib=plan.cpu_gib,
            windows=self.teacher_windows(),
            masked=self.masked,
            pad_rows=self.dit_pad_rows,
            spiece=spiece,
        )

    def check_rows(self, seed_ids) -> list[bool]:
        """`gguf-trainer check`: the dump rows the DiT reads, by the dump's t5_ids.txt: the real
        slots (id != 0, EOS included) and the first `dit_pad_rows` pads, which the engine
        unmasks in order (modify_mask_to_attend_padding, conditioner.hpp 1396-1410). The other
        pads are masked (PixArt, Chroma) or zeroed (Wan, zero_out_masked 1485-1489) before the
        DiT."""
        rows, pads = [], 0
        for i in seed_ids:
            rows.append(i != 0 or pads < self.dit_pad_rows)
            pads += i == 0
        return rows

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
