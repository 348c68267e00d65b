"""Ming-Image pack: pig_clip + a Ming adapter (model/ming_adapter.py) replaces Ming-Image 0.1's
16B text encoder (Ling-mini-2.0 + its connector; engine-families §2 row 19), whose tokenizer is
not the student's. One file serves Ming-Image 0.1 Design and Design-Layer (the engine picks the
version from the DiT).

Engine (ggk 0.9.7 conditioner.hpp MingImageAdapterEmbedder 3951-4158, llm_adapter.hpp 447-652):
the file is a Ming adapter when `adapter.cap_query` is in it (gk-diffuser.cpp 1785-1786); the
slots are the Ling ids of Ming's template around the prompt (ming_image_te.hpp 1240-1266:
the prefix `<role>SYSTEM</role>你是一个友好的AI助手。\\n\\ndetailed thinking off<|role_end|>`
`<role>HUMAN</role>` encoded alone, then prompt + `<|role_end|><role>ASSISTANT</role>`),
tokenized with the Ling tokenizer.json the adapter GGUF carries as `tokenizer_json`; the
student reads the raw prompt
(Qwen BPE, no template; empty -> [151643]). The output is the 256 caption rows (c_crossattn,
2560 wide, zero-padded to 3840) then one 3840-wide direct row per Ling token
(extra_c_crossattns): the teacher's targets in that layout, row for row (teachers/ming_snapshot).

Teacher: inclusionAI/Ming-Image-0.1-Design. Its Ling thinker (hidden states 5, 12 and the final
norm through proj_directvlm) and connector (caption rows) are ported in teachers/ming.py and
checked against the engine's own port (tests/engine/test_ming_teacher_engine.py); the released
snapshot's mllm/, connector/ and mlp/ are read into that port (teachers/ming_release.py, checked
on a tiny snapshot in the released layout). Edits: a sample's first reference through the
release's Qwen2.5-VL tower + linear_proj (teachers/ming_vision.py), read by the thinker over the
template's <imagePatch> run and stored at those slots for the adapter's vis_in / vis_q (the engine
shows the text encoder one reference); the export writes the pig_ming_vision companion.

Caption width: the connector's proj_out (2560) is two thirds of the direct width (3840); the
adapter's out_cap follows that rule (the tiny teacher keeps it: 128 of 192), checked at load.
"""

from __future__ import annotations

from pathlib import Path

from gguf_trainer.engine.template_ids import Piece
from gguf_trainer.materials.spec import Material

from .base import TrainerPack

MING_DESIGN = "inclusionAI/Ming-Image-0.1-Design"
MAX_SLOTS = 1280  # the engine's default slot_query rows (MingAdapterConfig)
SEED_VOCAB = 157184  # the Ling embedding rows
VIS_DIM = 2048  # the Ling tower + linear_proj rows: vis_q / vis_in, always declared by the engine
DIRECT = 3840  # proj_directvlm: the DiT's width
N_CAP = 256  # the connector's query tokens
TYPICAL_SLOTS = 40  # Ling template tokens of a reference-corpus prompt
STUDENT_ROWS = 30

MING_TEACHER = Material(
    "teacher", "Teacher: Ming-Image-0.1-Design (Ling-mini-2.0 + connector)", "hf_snapshot",
    repo=MING_DESIGN, subdir="Ming-Image-0.1-Design",
    size_gb=38.0,  # the anchor's reading: ~32 GB thinker, ~5.8 GB connector, ~0.1 GB projections
    patterns=("mllm/config.json", "mllm/model-*.safetensors", "mllm/model.safetensors.index.json",
              "mllm/preprocessor_config.json", "mllm/tokenizer.json", "mllm/tokenizer_config.json",
              "mllm/special_tokens_map.json", "connector/config.json",
              "connector/model-*.safetensors", "connector/model.safetensors.index.json",
              "mlp/config.json", "mlp/model.safetensors"),
)


def caption_dim(direct: int) -> int:
    """out_cap's width for a direct width: 2560 of 3840 (module docstring)."""
    return direct * 2 // 3


class MingImagePack(TrainerPack):
    id = "ming_image"
    title = "Ming-Image 0.1 Design / Design-Layer (Ling-mini-2.0)"
    description = (
        "Replaces Ming-Image's 16B text encoder (Ling-mini-2.0 + connector) with pig_clip + a "
        "Ming adapter: 256 caption rows (2560) and one seeded slot per Ling template token "
        "(3840); the file carries the Ling tokenizer.json."
    )
    family = "Ming-Image"
    serves = "Ming-Image 0.1 Design and Design-Layer (text-to-image)"
    adapter_kind = "ming_image"
    out_dim = DIRECT
    num_queries = MAX_SLOTS
    seed_vocab = SEED_VOCAB
    vis_dim = 0  # no vision_proj: a reference reaches the adapter alone (vis_q / vis_in, always)
    slot_vision = True  # an edit's reference: the tower's rows at its <imagePatch> slots
    default_name = "ming_adapter"
    shard_contract = "ming_image/1"
    max_len_student = 512
    max_len_teacher = MAX_SLOTS
    # Raw targets: the caption and direct rows share one row layout but not one scale, and a
    # per-dim standardization folded into out_proj alone would leave out_cap unfolded.
    standardized = False
    headline = "cos"
    centered = False
    eval_keys = ("cos", "rel_mse", "worst_sample_cos", "roundtrip_cos", "baseline_cos")
    teacher_materials = (MING_TEACHER,)
    teacher_memory_gib = 32.0  # the thinker in bf16 (the anchor's ~32 GB)
    teacher_offload = "disk"  # a release streams its layers from its shards (ming_stream.py)
    min_ggk = "0.7.7"  # the anchor's engine command needs ggk 0.7.7+; the tier checks 0.9.7's code
    verdict = None
    na_keys = ("cos",)
    defaults = {
        "corpus.n_train": 16000, "corpus.n_val": 384, "corpus.empty_frac": 0.015,
        "precompute.shard_size": 256, "precompute.val_shard_size": 128,
        "train.width": 1024, "train.depth": 6, "train.steps": 20000, "train.batch_size": 32,
        "train.lr": 2e-4, "train.warmup": 1000, "train.seed_rank": 512,
    }
    demo_settings = {"train.seed_rank": 32}  # the tiny teacher is 64 wide
    hints = {
        "train": "Targets: the connector's 256 caption rows (zero-padded) then Ling-mini's "
                 "directvlm row (hidden states 5, 12, final norm) of every template token.",
        "eval": "Judge by cos against the mean baseline (no reference run).",
    }
    engine_command_template = (
        "ggk diffuser engine -- --diffusion-model ming-image-0.1-design-nvfp4.gguf "
        "--vae pig_ming_image_vae_bf16.gguf --llm {student} --llm-adapter {adapter} "
        '-p "a sheep in sunglasses" --steps 12 --diffusion-fa --offload-to-cpu -o out.png'
    )
    engine_teacher_args = "--llm <ming-image ling-mini text encoder .gguf>"
    engine_notes = (
        "The adapter carries the Ling tokenizer.json: no Ling GGUF is needed.",
        "Design-Layer: the same adapter with the -layer DiT.",
        ("Edits: the export writes pig_ming_vision-f16.gguf from the released snapshot; add "
         "--llm_vision <it> --ref-image ref.png (trained when the corpus has references)."),
    )
    export_kv = {
        "adapter.teacher": MING_DESIGN,
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.student_prompt": "raw_text",
        "adapter.family": "Ming-Image",
        "adapter.target": "ming_image caption tokens (connector proj_out, 256 rows) + directvlm "
                          "rows (one per Ling token)",
    }

    @property
    def bytes_per_sample(self) -> int:  # type: ignore[override]
        return ((N_CAP + TYPICAL_SLOTS) * self.out_dim * 2 + STUDENT_ROWS * 1024 * 2
                + self.num_queries * 4)

    def takes_images(self, settings) -> bool:
        """Edit samples: the engine shows Ming's text encoder the first reference."""
        return True

    def format_prompt(self, text: str) -> str:
        from gguf_trainer.engine.ling_bpe import PREFIX, SUFFIX

        return PREFIX + text + SUFFIX

    def student_pieces(self, sample, image_tokens=()):
        """The raw prompt as one piece (conditioner.hpp 4103-4107: no template, no weights)."""
        return (Piece(sample.text),)

    def slot_ids_for_text(self, text: str, tokenizer_json: str | None = None) -> list[int]:
        """The engine's slot ids for `text` over a Ling tokenizer.json's text (default the
        tests' own, tiny/ming.py: no Ling vocabulary installs offline)."""
        from gguf_trainer.engine.ling_bpe import EngineLingBPE, ming_prompt_ids

        if tokenizer_json is None:
            from gguf_trainer.tiny.ming import ling_tokenizer_json

            tokenizer_json = ling_tokenizer_json()
        return ming_prompt_ids(EngineLingBPE(tokenizer_json), text)[0]

    def adapter_config(self, train, in_dim: int, out_dim: int = 0, vis_dim: int = 0):
        from gguf_trainer.model.adapters import AdapterConfig

        out = out_dim or self.out_dim
        return AdapterConfig(kind=self.adapter_kind, in_dim=in_dim, out_dim=out,
                             width=train.width, depth=train.depth, num_queries=self.num_queries,
                             seed_vocab=self.seed_vocab, seed_rank=train.seed_rank or 512,
                             vis_dim=vis_dim or VIS_DIM, n_bank=N_CAP, bank_dim=caption_dim(out))

    # -- the teacher's vocabulary and embedding table (export and the seed PCA) --------------

    def _teacher_root(self, project):
        from gguf_trainer.materials.materials import teacher_paths

        return teacher_paths(project)["teacher"]

    def export_tokenizer(self, project) -> dict:
        from ..teachers.ming_snapshot import read_tokenizer

        if project.settings.precompute.mock_teacher:
            from gguf_trainer.tiny.ming import ling_tokenizer_json

            return {"json": ling_tokenizer_json()}
        return {"json": read_tokenizer(self._teacher_root(project))}

    def seed_table(self, project, rank: int):
        """The frozen seed table (seed_vocab, rank): a PCA of the Ling embedding table."""
        from gguf_trainer.model.slot_resampler import pca_seed

        if project.settings.precompute.mock_teacher:
            table = self.build_mock_teacher(project).embed_table()
        else:
            from ..teachers.ming_snapshot import embed_table, read_config

            root = self._teacher_root(project)
            read_config(root)  # a snapshot it cannot run: one sentence, as at precompute
            table = embed_table(root)
        return pca_seed(table[: self.seed_vocab], rank)

    def load_teacher(self, materials, plan, device):
        from ..teachers.ming_snapshot import load_ming_teacher

        teacher = load_ming_teacher(materials["teacher"], device, self.num_queries, mode=plan.mode)
        self._check_widths(teacher.model.cfg)
        return teacher

    def _check_widths(self, cfg) -> None:
        from gguf_trainer.base.errors import UserError

        if cfg.caption_dim != caption_dim(cfg.diffusion_dim) or cfg.num_queries != N_CAP:
            raise UserError(f"the teacher's caption rows are {cfg.num_queries} x "
                            f"{cfg.caption_dim} but the pack expects {N_CAP} x "
                            f"{caption_dim(cfg.diffusion_dim)} for a {cfg.diffusion_dim}-wide "
                            "direct head.")

    def check_teacher(self, materials) -> str:
        from ..teachers.ming_snapshot import read_config

        cfg = read_config(materials["teacher"])
        return (f"Ming-Image: {cfg.layers} Bailing layers ({cfg.experts} experts), connector "
                f"{cfg.conn_layers} x {cfg.conn_hidden}; caption {cfg.caption_dim} + direct "
                f"{cfg.diffusion_dim}")

    def teacher_gib(self, materials, device) -> float:
        """The snapshot's own weights (fp32 on disk in gguf-trainer's layout; the release's
        mllm + connector + mlp shards), else the released thinker's bf16 size."""
        from ..teachers.ming_snapshot import WEIGHTS_FILE

        root = Path(materials["teacher"]) if materials.get("teacher") else None
        if root is not None and (root / WEIGHTS_FILE).is_file():
            return (root / WEIGHTS_FILE).stat().st_size / 2**30
        files = [] if root is None else [f for d in ("mllm", "connector", "mlp")
                                         for f in (root / d).glob("*.safetensors")]
        if not files:
            return self.teacher_memory_gib
        return sum(f.stat().st_size for f in files) / 2**30

    def teacher_streamed_gib(self, materials) -> float | None:
        """A release in offload / cpu holds its resident tensors and one layer; gguf-trainer's
        own layout (a tiny teacher) loads whole."""
        from ..teachers.ming_release import is_released, streamed_bytes
        from ..teachers.ming_snapshot import read_config

        root = Path(materials["teacher"]) if materials.get("teacher") else None
        if root is None or not is_released(root):
            return None
        return streamed_bytes(root, read_config(root)) / 2**30

    def write_companions(self, project, adapter_path, may_write=None):
        """`<base>_vision-f16.gguf` (pig_ming_vision-f16.gguf, ggk's --llm_vision for edits)
        from the released snapshot's tower, rebuilt only when a shard is newer; none, said in
        one line, for a teacher without one (the demo's, a mock)."""
        import logging

        from ..teachers.ming_release import is_released
        from ..teachers.ming_vision_export import vision_file_for, write_ming_vision_gguf

        root = None if project.settings.precompute.mock_teacher else \
            project.material_path("teacher")
        if root is None or not is_released(root):
            logging.getLogger(__name__).info(
                "export: no pig_ming_vision companion (the teacher is not the released "
                "Ming-Image snapshot); the ggk command leaves --llm_vision out: text-to-image "
                "works, edits need it")
            return []
        dest = vision_file_for(adapter_path)
        if may_write is not None:
            may_write(Path(dest))
        return [Path(write_ming_vision_gguf(root, dest)["path"])]

    def demo_materials(self, folder):
        """A tiny real Ming text encoder (tiny/ming.py) and the tests' Ling-like tokenizer."""
        from gguf_trainer.tiny.ming import copy_tiny_ming

        return {"teacher": copy_tiny_ming(folder / f"{self.id}-teacher-tiny")}

    def build_mock_teacher(self, project):
        """No download: the tiny Ming text encoder built in memory (seeded, the same weights as
        the demo snapshot), marked mock."""
        import torch

        from gguf_trainer.engine.ling_bpe import EngineLingBPE
        from gguf_trainer.tiny.ming import (
            build_tiny_ming,
            build_tiny_ming_vision,
            ling_tokenizer_json,
        )

        from ..teachers.ming_snapshot import MingTeacher
        from .base import MockIdentity

        teacher = MingTeacher(build_tiny_ming(), EngineLingBPE(ling_tokenizer_json()),
                              torch.device("cpu"), self.num_queries,
                              MockIdentity(self.id).as_dict(), build_tiny_ming_vision())
        teacher.is_mock = True
        return teacher

    def describe(self) -> dict:
        return {**super().describe(), "family": self.family, "serves": self.serves,
                "max_slots": self.num_queries}


PACK = MingImagePack()
