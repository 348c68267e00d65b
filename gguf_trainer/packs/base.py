"""What a trainer pack is: the declarative description of one distillation recipe.

A pack names its adapter kind and dimensions, the materials it needs, its config
defaults and GUI hints, the student prompt template, its teacher (real and mock), the
headline metric and the export key/values. Pipeline, CLI and GUI read everything
pack-specific from here. Packs hold no loops and do no I/O; torch is imported only
inside the teacher hooks.

Adding a family of an existing kind: subclass its kind base (t5_seeded.T5SeededPack,
layerwise.LayerwisePack, token_aligned_qwen*.Qwen*TokenAlignedPack), which owns the behaviour,
and declare the family's facts; never subclass another family. A new kind: subclass
`TrainerPack`, fill the class attributes, implement `format_prompt`, `load_teacher` (from
resolved material paths and a placement plan) and `build_mock_teacher`, optionally
`demo_materials`. Register an instance with `gguf_trainer.packs.register`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf_trainer.engine.qwen_vl_images import target_size
from gguf_trainer.engine.template_ids import Piece, student_ids
from gguf_trainer.engine.template_padding import Padding
from gguf_trainer.materials.spec import STUDENT_MATERIALS, Material

from ..teachers.base import Teacher

# token_aligned: text-only families (no vision tensors); token_aligned_vision splices images;
# layerwise: a stack of teacher taps per token (the pack's `taps`; with vis_dim > 0 also
# vision_proj + vis_in: Fibo 2.0 edits).
ADAPTER_KINDS = (
    "resampler", "seeded_resampler", "token_aligned", "token_aligned_vision", "layerwise",
    "qwen35_bridge",  # a slot resampler (model/slot_resampler.py): one query per teacher token
    "ming_image",  # the slot trunk with a caption bank (model/ming_adapter.py)
)


@dataclass(frozen=True)
class Verdict:
    """How a pack reads an adapter's figures against its teacher (eval's health line and
    `gguf-trainer check`): the headline figure, its healthy floor, and below `broken_below`
    the failure it usually means."""

    headline: str
    healthy: float
    broken_below: float
    broken_means: str

    def line(self, figures: dict) -> str:
        x = figures[self.headline]
        if x >= self.healthy:
            return f"healthy: {self.headline} {x:.4f} >= {self.healthy}"
        if x < self.broken_below:
            return f"broken: {self.headline} {x:.4f} < {self.broken_below} ({self.broken_means})"
        return f"weak: {self.headline} {x:.4f} is below the {self.healthy} of a healthy adapter"


class TrainerPack:
    """Base class; a pack module defines a subclass and registers one instance."""

    id: str = ""
    title: str = ""
    description: str = ""
    adapter_kind: str = ""
    in_dim: int = 1024  # pig_clip's hidden size; the adapter takes the student's actual size
    out_dim: int = 0
    num_queries: int = 0
    seed_vocab: int = 0
    vis_dim: int = 0
    # layerwise: the teacher's 1-based tap layers, ascending (the engine's out_layers for the
    # family); out_dim = len(taps) x the teacher width, and the export refuses another count.
    taps: tuple[int, ...] = ()
    # The pads the engine appends to the template ids (template_padding.py): masked as student
    # keys, read by the adapter. Default: none.
    padding: Padding = Padding()
    default_name: str = ""
    shard_contract: str = ""  # bump when stored rows change meaning: old shards are recomputed
    max_len_student: int = 512
    max_len_teacher: int = 1024  # teacher tokens per sample; a sample over either limit is dropped
    headline: str = "cos"  # RowMetrics key that is `val_cos`
    centered: bool = False  # headline over rows centred by the train mean
    standardized: bool = False  # train on (t-mu)/sigma_f and fold at export
    eval_keys: tuple[str, ...] = ()
    teacher_materials: tuple[Material, ...] = ()
    optional_materials: tuple[Material, ...] = ()  # wanted when their `wanted_when` setting is on
    defaults: dict[str, Any] = {}
    hints: dict[str, str] = {}
    # Per-field GUI metadata for the settings this pack changes (dotted key -> label, help,
    # ge/le, choices ...), laid over the schema's own (schema_fields.field_metadata merges them).
    field_meta: dict[str, dict] = {}
    teacher_memory_gib: float = 0.0  # the teacher's weights in memory; the placement planner's need
    teacher_offload: str = "stream"  # how offload mode holds the weights: hardware.OFFLOAD_KINDS
    min_ggk: str = ""
    engine_command_template: str = ""
    export_kv: dict[str, Any] = {}
    bytes_per_sample: int = 0  # shard bytes per sample at the reference corpus
    image_pad_id: int = 0  # vision packs: the student token whose runs receive image embeds
    # Vision packs: the family's reference-image resize rule, (h, w) -> (h̄, w̄), read by the
    # tower, the corpus refusals and the engine tier; default the Qwen-VL processor's
    # (qwen_vl_images.target_size: long side <= 384, multiples of 32).
    image_size = staticmethod(target_size)
    # Vision packs: the DiT reads the adapter's rows at the image slots (the image_pad runs).
    # False where the engine's DiT replaces them (Qwen Image 2.1 puts the reference latents
    # there): they stay in the adapter's input and attention, but precompute marks them
    # `target_keep` 0, so the loss, every eval figure and the target moments leave them out.
    dit_reads_vision_rows: bool = True
    remote_code: bool = False  # the teacher snapshot runs its own Python: trust records first
    # The recipe's published run (figures and where it ran), copied into eval.json to compare.
    reference: dict[str, Any] = {}
    engine_notes: tuple[str, ...] = ()  # advice printed under the ggk command (results.py)
    # The teacher's own text encoder in ggk, in place of `--llm S --llm-adapter A` in the
    # engine command (the render's teacher half); "" = ggk has no teacher path for the family.
    engine_teacher_args: str = ""
    # healthy / weak / broken floors of a real teacher's eval and of `gguf-trainer check`;
    # None: no verdict (no reference run to judge by): eval's health line reads "n/a" with the
    # first of `na_keys` the metrics hold, against the mean baseline, then `na_note`.
    verdict: Verdict | None = None
    na_keys: tuple[str, ...] = ("cos",)
    na_note = ""
    # `gguf-trainer check` reads an adapter of this pack's kind that names no pack
    # (adapter.pack) as this pack's: at most one pack per adapter kind sets it.
    check_default_for_kind: bool = False
    # `gguf-trainer check`: the dump file the engine writes only when it runs this very adapter
    # (the T5 kind's adapter_out.bin): a figure against it is a port check, not a verdict.
    port_check_dump = ""

    @property
    def fixed_rows(self) -> int:
        """Targets are padded to this window (seeded resampler: its T5 slots), else 0."""
        return self.num_queries if self.adapter_kind == "seeded_resampler" else 0

    @property
    def recipe_defaults(self) -> dict[str, Any]:
        """The training recipe a new project stores (data/recipe.py, `train.*`): here the one
        every pack trained with before the recipe keys; a kind measured on real activations
        overrides it (README "Recipes on real activations")."""
        return {
            "train.target_space": "standardized" if self.standardized else "raw",
            "train.cosine": "row", "train.sigma_floor_mode": "absolute", "train.pad_weight": "row",
            "train.prefix_rows": "in", "train.stats_rows": "all", "train.sink": "none",
        }

    @property
    def pad_rows_stored(self) -> int:
        """K: the pad rows per sample the shards store when the recipe weighs a sample's pads
        as one row (`train.pad_weight` "one", data/recipe.py stored_pad_rows): K evenly spaced
        pads sharing that weight; 0 for a family without pads. Pads at one rope position whose
        keys are masked (FLUX.3) all attend to the same real keys from the same position: one
        row repeated, so 1 is exact. Pads at their own positions differ by position: 32 kept
        a pad loss within 5 % of all of them on the demo's tiny teachers (SeFi 1,002 pads:
        0.95, FLUX.2 klein 486: 0.96, Ovis 232: 1.00) and at a median 1.01 of it on SmolLM2-135M's
        ~110 index-position pads (README "Shards store only what training reads")."""
        if not self.padding.pads:
            return 0
        return 1 if self.padding.pad_position is not None else 32

    def shard_bytes(self, pad_rows: int = 0, from_start: bool = False) -> int:
        """Shard bytes per sample at the reference corpus when the shards store `pad_rows` pad
        rows of each sample's targets (0: every row) and, `from_start`, none before the start
        row (data/recipe.py stored_rows; the disk pre-flight): a family without pads or a
        fixed start row stores every row either way."""
        return self.bytes_per_sample

    @property
    def all_defaults(self) -> dict[str, Any]:
        """What `new --pack` writes: the recipe, then the pack's own defaults over it."""
        return {**self.recipe_defaults, **self.defaults}

    @property
    def materials(self) -> tuple[Material, ...]:
        return STUDENT_MATERIALS + self.teacher_materials + self.optional_materials

    def configured(self, settings) -> TrainerPack:
        """This pack as a project's settings configure it (Project.pack): itself, unless the pack
        reads a setting that changes its shapes (PixArt's precompute.t5_window)."""
        return self

    def export_teacher_kv(self, project, ck: dict) -> dict[str, Any]:
        """GGUF KV naming the teacher this project's shards were computed from, merged over
        `export_kv` at export (stages/export.py); default none (`export_kv` names it)."""
        return {}

    def takes_images(self, settings) -> bool:
        """Whether the corpus keeps reference-image samples for a project with these settings
        (image sources, .jsonl `images`): a vision pack's, unless the pack reads a setting
        that turns them off (LingBot Video: corpus.reference_images)."""
        return self.vis_dim > 0

    def format_prompt(self, text: str) -> str:
        """The template around a corpus prompt as one string (no template = raw): what a
        teacher that runs its own released pipeline tokenizes."""
        return text

    # Where the engine builds this pack's template: {"file": path in vendor/engine, "lines":
    # (first, last), "version": its SDVersion}, the LLMEmbedder branch of conditioner.hpp that
    # sets `prompt` and its prompt range; {} = the raw prompt (PixArtT5Embedder, T5CLIPEmbedder).
    # tests/engine compiles those lines and compares the pack's student ids with the engine's.
    engine_template: dict = {}

    def student_pieces(self, sample, image_tokens: Sequence[int] = ()) -> tuple[Piece, ...]:
        """The student's template for a sample whose images have `image_tokens` vision rows
        each, in the pieces the engine tokenizes one by one (template_ids.py); default: the
        raw prompt, parsed for weight syntax (PixArt). A pack with a template declares its
        pieces here, citing the engine lines they come from (tests/engine reads them there)."""
        return (Piece(sample.text, prompt=True),)

    def vision_inputs(self, sample) -> list:
        """What the teacher's vision tower takes for each of the sample's images, in order:
        their paths, unless the family sizes a picture by more than the file (Qwen Image 2.1:
        by the sample's render)."""
        return list(sample.images)

    def template_start(self, sample) -> int:
        """The first template row the engine hands the DiT (prompt_template_encode_start_idx):
        the rows before it are dropped after the adapter."""
        return 0

    def student_text(self, sample, image_tokens: Sequence[int] = ()) -> str:
        """The student's template joined into one string (logs, teachers that read text)."""
        return "".join(p.text for p in self.student_pieces(sample, image_tokens))

    def student_ids(self, encode, sample, image_tokens: Sequence[int] = ()) -> list[int]:
        """The engine's student ids for a sample: `encode` (qwen_bpe.engine_bpe(tok).encode)
        over each piece's chunks (the one rule every pack follows, template_ids.student_ids),
        then the family's pads (`padding`)."""
        return self.padding.apply(student_ids(encode, self.student_pieces(sample, image_tokens)))

    def load_teacher(self, materials: dict[str, Path], plan, device) -> Teacher:
        """The real teacher from resolved material paths ({material id: path}, see
        gguf_trainer.materials.materials.teacher_paths) placed as `plan` says (a hardware.Plan: mode
        gpu|offload|cpu, memory caps, placement). It must not resolve paths itself, and its
        close() frees what it loaded."""
        from gguf_trainer.base.errors import UserError

        raise UserError(f"the {self.title} pack has no real teacher; turn on "
                        "precompute.mock_teacher (or set GGUF_TRAINER_MOCK_TEACHER=1) to run the "
                        "pipeline.")

    def check_teacher(self, materials: dict[str, Path]) -> str | None:
        """A header-only check of the teacher files (tensor names and shapes, the tokenizer; no
        weights read): a one-line summary, or UserError naming the file to fix. None: the pack
        has no such check (the default); material status then checks file presence only."""
        return None

    def teacher_gib(self, materials: dict[str, Path], device) -> float:
        """The memory the teacher in these folders takes once loaded on `device` (the
        pre-flight's need); default: the pack's reference figure."""
        return self.teacher_memory_gib

    def teacher_streamed_gib(self, materials: dict[str, Path]) -> float | None:
        """The RAM a teacher that reads its layers from disk as they run (teacher_offload
        "disk") holds in offload / cpu: its resident parts + the largest layer. None (the
        default): it holds its whole weights (teacher_gib)."""
        return None

    def shard_extras(self, targets: Sequence) -> dict:
        """Tensors a shard stores beside the targets, from the teacher's per-sample output
        (the Qwen3.5 bridge's FLUX.3 bank, data/bank_rows.py); default none."""
        return {}

    def check_rows(self, seed_ids: Sequence[int]) -> list[bool] | None:
        """`gguf-trainer check`: which rows of a dump of a seeded adapter the DiT reads, by the
        dump's seed ids; None (the default): every row (a layerwise family: from `start`)."""
        return None

    def seed_tokenizer_file(self, materials: dict[str, Path]) -> Path | None:
        """The file in the resolved teacher `materials` whose pieces make the engine's seed ids
        (a T5 pack's spiece.model): `check` compares a dump's t5_ids.txt with the prompt's
        through it. None (the default): the pack's adapter reads no seed ids."""
        return None

    # Settings the demo lays over its laptop-sized ones (demo.py), for a pack whose tiny run
    # needs them (Wan: a 256384-row seed table); dotted keys like `defaults`.
    demo_settings: dict[str, Any] = {}

    def demo_materials(self, folder: Path) -> dict[str, Path]:
        """Tiny teacher files for `gguf-trainer demo` written under `folder`, by material id
        ({} = the demo uses the mock teacher). Teacher packs supply theirs here, so the demo
        never needs editing for a new teacher."""
        return {}

    def demo_corpus(self, folder: Path, prompts: list[str]) -> Path:
        """The demo's corpus file written under `folder` from `prompts` (one per line); image
        packs write sample records with small synthetic images instead (see samples.py)."""
        from gguf_trainer.base.atomic import write_text

        path = folder / "demo_prompts.txt"
        write_text(path, "".join(p + "\n" for p in prompts))
        return path

    def build_mock_teacher(self, project) -> Teacher:
        raise NotImplementedError

    def export_tokenizer(self, project) -> dict | None:
        """The teacher's vocabulary the adapter GGUF carries ({"tokens", "merges", "pre"}: a
        slot kind whose engine tokenizes with it); None (the default): the file carries none."""
        return None

    def seed_table(self, project, rank: int):
        """A slot kind's frozen seed table (seed_vocab, rank), installed before step 0; None
        (the default): the kind has none."""

    def write_companions(self, project, adapter_path: Path, may_write=None) -> list[Path]:
        """Companion files the export writes next to the adapter (LLaDA: its SigVQ GGUF); the
        export records them so the "output" reset removes them. `may_write(path)` raises
        before a file the project did not write would be replaced (the export's ownership
        rule, which lives above the packs)."""
        return []

    # Health verdicts: early in a run every adapter is under the floor, so before
    # `health_after_steps` a verdict short of "healthy" reads "too early" with `health_early_hint`;
    # `health_reference` (the reference run's figures) ends every line.
    health_after_steps = 0
    health_early_hint = ""
    health_reference = ""

    def health_line(self, metrics: dict, lead: dict | None = None) -> str | None:
        """For a real teacher's eval: healthy / weak / broken against the pack's reference
        figures (one table, shared with `gguf-trainer check`), in the published run's own
        metric; "n/a" for a pack without them, leading with the centred cosine of the DiT's
        token rows (`lead`, data/dit_rows.py) and its mean baseline, the plain figure after
        it; None when the metrics lack the figure."""
        v = self.verdict
        if v is None:
            key = next((k for k in self.na_keys if metrics.get(k) is not None), None)
            if key is None:
                return None
            from gguf_trainer.data.lead import lead_value

            cc = lead_value(lead)
            head = "" if cc is None else (
                f"tokens centred cos {cc:.4f} (mean baseline "
                f"{lead_value(lead, figure='baseline_centred_cos'):.4f}); plain ")
            return (
                f"n/a: no published pig_clip + {self.title} run to compare with; {head}{key} "
                f"{metrics[key]:.4f} (mean baseline "
                f"{metrics.get('baseline_cos', float('nan')):.4f}){self.na_note}"
            )
        if metrics.get(v.headline) is None:
            return None
        line = v.line(metrics)
        steps = metrics.get("trained_steps")
        early = isinstance(steps, int) and steps < self.health_after_steps
        if early and not line.startswith("healthy"):
            line = (f"too early to judge at {steps} steps: from {self.health_after_steps} steps "
                    f"on, {self.health_early_hint}")
        return f"{line}; reference: {self.health_reference}" if self.health_reference else line

    def engine_command(self, student: str = "<pig_clip.gguf>", adapter: str = "<adapter.gguf>",
                       extras: dict[str, str] | None = None) -> str:
        return self.engine_command_template.format(
            student=student, adapter=adapter, **(extras or {})
        )

    def adapter_config(self, train, in_dim: int, out_dim: int = 0, vis_dim: int = 0):
        """The AdapterConfig for these train settings and the dims read from the shards
        (0 = the pack's declared out_dim / vis_dim)."""
        from gguf_trainer.model.adapters import AdapterConfig

        return AdapterConfig(kind=self.adapter_kind, in_dim=in_dim, out_dim=out_dim or self.out_dim,
                             width=train.width, depth=train.depth, num_queries=self.num_queries,
                             seed_vocab=self.seed_vocab, vis_dim=vis_dim or self.vis_dim,
                             taps=self.taps)

    def describe(self) -> dict:
        return {
            "id": self.id, "title": self.title, "description": self.description,
            "adapter_kind": self.adapter_kind, "in_dim": self.in_dim, "out_dim": self.out_dim,
            "num_queries": self.num_queries, "seed_vocab": self.seed_vocab, "vis_dim": self.vis_dim,
            "default_name": self.default_name, "headline": self.headline,
            "eval_keys": list(self.eval_keys), "hints": dict(self.hints),
            "materials": [m.__dict__ for m in self.materials], "min_ggk": self.min_ggk,
            "teacher_memory_gib": self.teacher_memory_gib,
            "bytes_per_sample": self.bytes_per_sample,
            "engine_command": self.engine_command(),
        }


@dataclass
class MockIdentity:
    """Fingerprint part of a mock teacher: its pack and version of the mock function."""

    pack: str
    version: int = 1
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"mock": self.pack, "version": self.version, **self.extra}
