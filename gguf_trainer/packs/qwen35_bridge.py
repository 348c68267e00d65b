"""Qwen3.5 bridge pack: pig_clip + a slot-resampler adapter (model/slot_resampler.py) replaces
Qwen3.5-9B, MOSS-Image's text encoder (engine-families §2 row 20), whose tokenizer is not the
student's: one adapter slot per Qwen3.5 token of the MOSS template, seeded with a frozen PCA of
the 9B's 248320-row embedding table, emitting the 9B's last hidden state (after the final norm,
4096) of that token.

Engine (ggk 0.9.7 conditioner.hpp Qwen35BridgeEmbedder, 4175-4494; llm_adapter.hpp 654-897):
the file is a bridge when `slot_query` is in it without `cap_query` (llm_adapter.hpp 693-695,
called at gk-diffuser.cpp 1579 and 1599); the slots are the Qwen3.5 ids of
`<|im_start|>user\\n` + (prompt, or " ") +
`<|im_end|>\\n<|im_start|>assistant\\n<think>\\n`, tokenized as one string with the vocabulary
the adapter GGUF carries (`tokenizer.ggml.tokens` / `merges`, `tokenizer.ggml.pre` "qwen35",
gk-diffuser.cpp 1236-1277); the student reads the raw prompt (its own BPE, no template, no
emphasis parsing; empty -> [151643]); no pads. The same file serves FLUX.3 Klein through its
optional bank head (`bank_query`, `bank_in`, `out_bank` -> 20480): with `train.bank_slots` n > 0
(a multiple of 80) the pack also trains it on Qwen3-VL-4B's 8-tap stack of the prompt as
FLUX.3's template types it, token-aligned over the student's ids (teachers/qwen35_bank.py, the
`bank_teacher` material; data/bank_rows.py: the second target set, loss and figures); with 0
(the default) the export has no bank and ggk refuses it for FLUX.3 with its own sentence.

Teacher: Qwen/Qwen3.5-9B (transformers `qwen3_5`, hybrid Gated-DeltaNet). References (samples
with `images`: image datasets and folders, .jsonl `images`, as the other vision packs take them)
go through the snapshot's own Qwen3.5 tower on the engine's pixels (engine/qwen35_refs.py;
`mmproj-qwen3.5-9b` is that tower): the teacher reads the template with the rows spliced over
the `<|image_pad|>` runs at M-RoPE positions (teachers/qwen35.py), the shard stores the raw
rows at their slots, and the adapter reads them as the engine hands them (conditioner.hpp
4401-4418): every row a `vis_in` key, each row also on its slot through `vis_q`. No
vision_proj: the student never sees the picture. A corpus without references stores shards
byte for byte as before.

Eval: no published pig_clip + MOSS-Image run exists, so there is no healthy floor (`verdict`
None, the health line "n/a"); judge by cos against the mean baseline.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import zlib
from pathlib import Path

from gguf_trainer.engine.template_ids import Piece
from gguf_trainer.materials.spec import Material

from .base import MockIdentity, TrainerPack
from .teacher_repos import QWEN3VL_4B_TEACHER

QWEN35_9B = "Qwen/Qwen3.5-9B"
MAX_SLOTS = 1536  # the engine's default slot_query rows: template 11 + a 512-token prompt, twice
SEED_VOCAB = 248320  # the 9B's embedding rows (qwen35_bpe.VOCAB_SIZE)
VIS_DIM = 4096  # mmproj-qwen3.5-9b's output: vis_q / vis_in, always declared by the engine
HIDDEN = 4096  # the 9B's hidden size: the rows MOSS-Image reads
STUDENT_ROWS = 30  # student tokens of a reference-corpus prompt (the shard estimate)
TYPICAL_SLOTS = 42  # Qwen3.5 template tokens of a reference-corpus prompt
BANK_DIM = 20480  # FLUX.3's 8 taps of Qwen3-VL-4B (2560 each): the bank's rows
TYPICAL_BANK_ROWS = 39  # a reference-corpus prompt's FLUX.3 template rows + its one pad row

QWEN35_9B_TEACHER = Material(
    "teacher", "Teacher: Qwen3.5-9B", "hf_snapshot", repo=QWEN35_9B, subdir="Qwen3.5-9B",
    size_gb=19.3,  # 9.65B parameters in bf16, the vision tower included (the anchor's ~19 GB)
    patterns=("config.json", "model.safetensors.index.json", "model*.safetensors",
              "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
              "chat_template.jinja", "preprocessor_config.json"),
)
# FLUX.3's text encoder, for the bank head (train.bank_slots > 0): the FLUX.3 pack's snapshot
# under its own id, so the 9B stays `teacher`.
BANK_TEACHER = dataclasses.replace(QWEN3VL_4B_TEACHER, id="bank_teacher",
                                   title="FLUX.3 bank teacher: Qwen3-VL-4B-Instruct")


@functools.lru_cache(maxsize=2)
def _bpe(tokens: tuple, merges: tuple):
    from gguf_trainer.engine.qwen35_bpe import EngineQwen35BPE

    return EngineQwen35BPE(tokens, merges)


class MockBridgeTeacher:
    """Slot targets without the 9B: the released Qwen3.5 slot ids (tiny/qwen35.py's vocabulary),
    one row per slot from its id, its position and a causal running mean (like a decoder's final
    states), and a seeded random embedding table for the seed PCA."""

    is_mock = True

    vis_dim = VIS_DIM

    def __init__(self, pack_id: str, max_slots: int, out_dim: int, seed: int = 3535):
        import torch

        from gguf_trainer.tiny.qwen35 import qwen35_vocabulary

        g = torch.Generator().manual_seed(seed)
        self.identity = MockIdentity(pack_id, extra={"out_dim": out_dim}).as_dict()
        self.max_slots, self.out_dim = max_slots, out_dim
        self.bpe = _bpe(*qwen35_vocabulary())
        self.feat = torch.randn(251, 32, generator=g)
        self.proj = torch.randn(32, out_dim, generator=g) / 32**0.5
        self.table = torch.randn(SEED_VOCAB, 32, generator=g)
        self.vis_proj = torch.randn(3, self.vis_dim, generator=g)
        self.vis_back = torch.randn(self.vis_dim, out_dim, generator=g) / self.vis_dim**0.5

    def slot_ids(self, sample, image_tokens=()) -> list[int]:
        from gguf_trainer.engine.qwen35_bpe import moss_prompt

        return self.bpe.encode(moss_prompt(sample.text, image_tokens))

    def lengths(self, samples, student_ids, vision=None) -> list[int]:
        vision = vision or [()] * len(samples)
        return [len(self.slot_ids(s, [g.rows.shape[0] for g in segs or ()]))
                for s, segs in zip(samples, vision)]

    def vision(self, images) -> list:
        """Rows as many as the engine's tower gives (one per 32x32 block of the engine's
        pixels, engine/qwen35_refs.py), each from its block's mean colour."""
        import torch

        from gguf_trainer.engine.qwen35_refs import FACTOR, bridge_pixels, load_image

        out = []
        for path in images:
            x = torch.from_numpy(bridge_pixels(load_image(path)))
            blocks = torch.nn.functional.avg_pool2d(x[None], FACTOR)[0]  # (3, gh, gw)
            out.append(torch.tanh(blocks.flatten(1).T @ self.vis_proj))
        return out

    def vision_segments(self, rows) -> list:
        from ..teachers.qwen35 import vision_segments

        return vision_segments(self.bpe, rows)

    def targets(self, samples, student_ids, vision=None) -> list:
        import torch

        from ..teachers.base import TargetRows
        from ..teachers.qwen35 import PAD_SLOT

        out = []
        vision = vision or [()] * len(samples)
        for s, segs in zip(samples, vision):
            ids = self.slot_ids(s, [g.rows.shape[0] for g in segs or ()])
            base = self.feat[torch.tensor([zlib.crc32(str(i).encode()) % 251 for i in ids])]
            base = base @ self.proj
            for g in segs or ():  # the picture under its slots, spread on by the running mean
                base[g.start : g.start + g.rows.shape[0]] += g.rows.float() @ self.vis_back
            steps = torch.arange(1, len(ids) + 1, dtype=torch.float32)[:, None]
            rows = 0.6 * base + 0.4 * torch.cumsum(base, 0) / steps
            pads = [PAD_SLOT] * (self.max_slots - len(ids))
            out.append(TargetRows(rows=rows, seed_ids=ids + pads))
        return out

    def embed_table(self):
        return self.table

    def close(self) -> None:
        pass


class Qwen35BridgePack(TrainerPack):
    id = "qwen35_bridge"
    title = "MOSS-Image (Qwen3.5-9B, slot head)"
    description = (
        "Replaces Qwen3.5-9B, MOSS-Image's text encoder, with pig_clip + a slot-resampler "
        "adapter: one seeded query per Qwen3.5 template token emitting the 9B's last hidden "
        "state (4096); the file carries the Qwen3.5 vocabulary."
    )
    family = "MOSS-Image"
    serves = "MOSS-Image (text-to-image)"
    adapter_kind = "qwen35_bridge"
    out_dim = HIDDEN
    num_queries = MAX_SLOTS  # the adapter's slot_query rows (max_slots)
    seed_vocab = SEED_VOCAB
    vis_dim = 0  # no vision_proj: references reach the adapter alone (vis_q / vis_in, always)
    slot_vision = True  # references: the tower's rows at their template slots (takes_images)
    n_bank = 0  # the FLUX.3 bank's rows (train.bank_slots; configured)
    default_name = "qwen3.5_9b_adapter"
    shard_contract = "qwen35_bridge/1"
    max_len_student = 512
    max_len_teacher = MAX_SLOTS
    standardized = True
    headline = "cos"
    centered = False
    eval_keys = ("cos", "rel_mse", "cos_eos", "worst_sample_cos", "roundtrip_cos", "baseline_cos")
    teacher_materials = (QWEN35_9B_TEACHER,)
    teacher_memory_gib = 17.5  # the text stack in bf16 (the tower is dropped at load)
    teacher_offload = "stream"
    min_ggk = "0.9.1"  # the bridge (anchor 0.0.14 §1); the tier checks 0.9.7's code
    verdict = None
    na_keys = ("cos",)
    defaults = {
        "corpus.n_train": 100000, "corpus.n_val": 1024, "corpus.empty_frac": 0.015,
        "precompute.shard_size": 512, "precompute.val_shard_size": 256,
        "train.width": 1024, "train.depth": 6, "train.steps": 20000, "train.batch_size": 32,
        "train.lr": 2e-4, "train.warmup": 1000, "train.seed_rank": 384,
    }
    # the tiny teacher is 64 wide; the demo trains the FLUX.3 bank too (one 80-row block)
    demo_settings = {"train.seed_rank": 32, "train.bank_slots": 80}
    hints = {
        "train": "Targets: Qwen3.5-9B's last hidden state (4096) of every MOSS template token.",
        "eval": "Judge by cos against the mean baseline (no reference run).",
    }
    engine_command_template = (
        "ggk diffuser engine -- --diffusion-model <moss-image DiT .gguf> --vae <flux2 vae .gguf> "
        '--llm {student} --llm-adapter {adapter} -p "a lovely pig holding a sign says GGUF" '
        "--cfg-scale 7 --diffusion-fa -o out.png"
    )
    engine_teacher_args = "--llm <qwen3.5-9b .gguf>"
    engine_notes = (
        "The adapter carries the Qwen3.5 vocabulary: no Qwen3.5 GGUF is needed.",
        ("Edits: add --llm_vision <mmproj-qwen3.5-9b .gguf> --ref-image ref.png (trained when "
         "the corpus has reference images); FLUX.3 Klein needs a file with the bank head "
         "(train.bank_slots)."),
    )
    export_kv = {
        "adapter.teacher": QWEN35_9B,
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.student_prompt": "raw_text",
        "adapter.family": "MOSS-Image",
        "adapter.target": "last hidden state after the final norm, one row per template token",
    }

    @property
    def bytes_per_sample(self) -> int:  # type: ignore[override]
        bank = TYPICAL_BANK_ROWS * BANK_DIM * 2 if self.n_bank else 0
        return (TYPICAL_SLOTS * self.out_dim * 2 + STUDENT_ROWS * 1024 * 2 + self.num_queries * 4
                + bank)

    def configured(self, settings):
        """With train.bank_slots n > 0: the pack with the FLUX.3 bank head of n rows, its
        teacher material (Qwen3-VL-4B as `bank_teacher`) and a shard contract of its own."""
        n = settings.train.bank_slots
        if not n:
            return self
        from gguf_trainer.base.errors import UserError

        from ..teachers.qwen35_bank import check_n_bank

        try:
            check_n_bank(n)
        except ValueError as e:
            raise UserError(f"{e}.") from None
        pack = copy.copy(self)
        pack.n_bank = n
        pack.shard_contract = f"{self.shard_contract}+bank{n}"
        pack.teacher_materials = (*self.teacher_materials, BANK_TEACHER)
        pack.serves = "MOSS-Image (text-to-image) and FLUX.3 Klein (prompt upsampler slot)"
        pack.engine_notes = (
            "The adapter carries the Qwen3.5 vocabulary: no Qwen3.5 GGUF is needed.",
            ("FLUX.3 Klein: --llm <qwen3vl-4b .gguf> --prompt-upsampler {student} "
             "--prompt-upsampler-adapter {adapter} (the bank replaces the upsampler and 4B)."),
        )
        return pack

    def shard_extras(self, targets) -> dict:
        """The FLUX.3 bank's second target set (data/bank_rows.py), when the bank is on."""
        if not self.n_bank:
            return {}
        from gguf_trainer.data.bank_rows import shard_tensors

        return shard_tensors([t.bank for t in targets], self.n_bank)

    def takes_images(self, settings) -> bool:
        """Reference-image samples: MOSS-Image reads references through the 9B's tower."""
        return True

    def format_prompt(self, text: str) -> str:
        from gguf_trainer.engine.qwen35_bpe import moss_prompt

        return moss_prompt(text)

    def student_pieces(self, sample, image_tokens=()):
        """The raw prompt as one piece: the bridge parses no weights (conditioner.hpp 4388)."""
        return (Piece(sample.text),)

    def slot_ids_for_text(self, text: str, vocabulary=None) -> list[int]:
        """The engine's slot ids for `text` over `vocabulary` ((tokens, merges); default the
        released Qwen3.5 vocabulary of tiny/qwen35.py)."""
        from gguf_trainer.engine.qwen35_bpe import moss_prompt

        if vocabulary is None:
            from gguf_trainer.tiny.qwen35 import qwen35_vocabulary

            vocabulary = qwen35_vocabulary()
        return _bpe(tuple(vocabulary[0]), tuple(vocabulary[1])).encode(moss_prompt(text))

    def adapter_config(self, train, in_dim: int, out_dim: int = 0, vis_dim: int = 0,
                       bank_dim: int = 0):
        from gguf_trainer.model.adapters import AdapterConfig

        return AdapterConfig(kind=self.adapter_kind, in_dim=in_dim, out_dim=out_dim or self.out_dim,
                             width=train.width, depth=train.depth, num_queries=self.num_queries,
                             seed_vocab=self.seed_vocab, seed_rank=train.seed_rank or 384,
                             vis_dim=vis_dim or VIS_DIM, n_bank=self.n_bank,
                             bank_dim=(bank_dim or BANK_DIM) if self.n_bank else 0,
                             bank_align=bool(self.n_bank))

    # -- the teacher's vocabulary and embedding table (export and the seed PCA) --------------

    def vocabulary(self, project) -> tuple[list[str], list[str]]:
        """(tokens, merges) the adapter GGUF carries: the teacher snapshot's tokenizer.json,
        or with the mock teacher the released vocabulary (tiny/qwen35.py)."""
        if project.settings.precompute.mock_teacher:
            from gguf_trainer.tiny.qwen35 import qwen35_vocabulary

            return qwen35_vocabulary()
        from gguf_trainer.materials.materials import teacher_paths

        from ..teachers.qwen35 import read_vocabulary

        return read_vocabulary(teacher_paths(project)["teacher"])

    def export_tokenizer(self, project) -> dict:
        tokens, merges = self.vocabulary(project)
        return {"tokens": list(tokens), "merges": list(merges), "pre": "qwen35"}

    def seed_table(self, project, rank: int):
        """The frozen seed table (seed_vocab, rank): a PCA of the teacher's embedding table."""
        from gguf_trainer.model.slot_resampler import pca_seed

        if project.settings.precompute.mock_teacher:
            table = self.build_mock_teacher(project).embed_table()
        else:
            from gguf_trainer.materials.materials import teacher_paths

            from ..teachers.qwen35 import embed_table

            table = embed_table(teacher_paths(project)["teacher"])
        if table.shape[0] < self.seed_vocab:
            import torch

            pad = torch.zeros(self.seed_vocab - table.shape[0], table.shape[1])
            table = torch.cat([table, pad])
        return pca_seed(table[: self.seed_vocab], rank)

    def load_teacher(self, materials, plan, device):
        from ..teachers.qwen35 import load_qwen35_teacher

        slots = load_qwen35_teacher(materials["teacher"], device, self.num_queries, plan.mode,
                                    plan.cpu_gib)
        if not self.n_bank:
            return slots
        from ..teachers.qwen35_bank import PADDING, TAPS, BankTeacher, WithBank
        from ..teachers.qwen_taps import TapLayout, load_tap_teacher

        taps = load_tap_teacher(materials["bank_teacher"], device, student_pieces=None,
                                layout=TapLayout(taps=TAPS, padding=PADDING),
                                family="FLUX.3 bank", mode=plan.mode, ram_limit_gib=plan.cpu_gib)
        bank = BankTeacher(taps, self.n_bank)
        bank.check_template()
        return WithBank(slots, bank)

    def check_teacher(self, materials) -> str:
        from ..teachers.qwen35 import read_config, text_config

        tc = text_config(read_config(materials["teacher"]))
        return (f"Qwen3.5: {tc['num_hidden_layers']} layers, hidden {tc['hidden_size']}, vocab "
                f"{tc['vocab_size']}; the DiT reads the last hidden state")

    def teacher_gib(self, materials, device) -> float:
        import torch

        roots = [Path(materials[m]) for m in ("teacher", "bank_teacher")
                 if m == "teacher" or (self.n_bank and m in materials)]
        files = [f for r in roots if r.is_dir() for f in sorted(r.glob("*.safetensors"))]
        if not files:
            return self.teacher_memory_gib
        gib = sum(f.stat().st_size for f in files) / 2**30
        return gib if torch.device(device).type == "cuda" else 2 * gib

    def demo_materials(self, folder):
        """A tiny real Qwen3.5 (hybrid Gated-DeltaNet, the full vocabulary; tiny/qwen35.py) and
        a tiny real Qwen3-VL as deep as FLUX.3's deepest tap (the bank teacher)."""
        from gguf_trainer.tiny.qwen35 import copy_tiny_qwen35
        from gguf_trainer.tiny.qwen_taps import write_tiny_tap_teacher

        from ..teachers.qwen35_bank import TAPS

        return {"teacher": copy_tiny_qwen35(folder / f"{self.id}-teacher-tiny"),
                "bank_teacher": write_tiny_tap_teacher(folder / f"{self.id}-bank-teacher-tiny",
                                                       "qwen3_vl", max(TAPS))}

    def build_mock_teacher(self, project):
        slots = MockBridgeTeacher(self.id, self.num_queries, self.out_dim)
        if not self.n_bank:
            return slots
        from ..teachers.qwen35_bank import MockBank, WithBank

        return WithBank(slots, MockBank(self.n_bank, BANK_DIM))

    def describe(self) -> dict:
        return {**super().describe(), "family": self.family, "serves": self.serves,
                "max_slots": self.num_queries, "bank_slots": self.n_bank}


PACK = Qwen35BridgePack()
