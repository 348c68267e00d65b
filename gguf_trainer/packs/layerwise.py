"""What every layerwise pack shares: pig_clip + a layerwise adapter (engine-families §4) replaces a
Qwen3 / Qwen3-VL text encoder whose DiT conditions on a stack of its decoder layers.

A family pack is a declaration: its engine name, teacher architecture and taps, its template as
the engine builds it (`prefix` + the prompt range + `suffix`, or one piece where the engine
parses no prompt range), the first row the DiT reads (`start`), its pads, materials, settings and
ggk command. This class turns those into the template pieces, the tap teacher
(teachers/qwen_taps.py), the tiny teacher of the demo (tiny/qwen_taps.py) and the mock teacher.
Targets are the RAW taps concatenated in ascending order, one row per template id, pads
included: the engine hands the DiT exactly that stack (conditioner.hpp 2786-2927), and the
adapter runs over every row with no mask (2727-2735), so training does too.

Eval: no published pig_clip + layerwise run exists for any of these families, so there is no
healthy floor (`verdict` None, the health line "n/a"); judge by the whole-stack cosine and the
per-tap cosines against their mean baselines (eval.json `per_tap`).
"""

from __future__ import annotations

from gguf_trainer.engine.template_ids import Piece
from gguf_trainer.engine.template_padding import Padding

from .base import TrainerPack

# Shard bytes per template row: the student's state (1024) and the stack, both bf16, plus its id.
STUDENT_DIM = 1024
# The real rows (template + prompt, before the pads) of a typical corpus prompt: what a padded
# family's shards hold of its `typical_rows` when they store K pad rows (disk estimate).
TYPICAL_REAL_ROWS = 70


class LayerwisePack(TrainerPack):
    """Base of the layerwise family packs (not registered itself)."""

    adapter_kind = "layerwise"
    family = ""  # the engine's name for the family (its SDVersion's messages)
    serves = ""  # the engine models this adapter serves (the GUI's pack picker)
    teacher_arch = "qwen3_vl"  # "qwen3" | "qwen3_vl": the tap teacher's transformers class
    teacher_hidden = 2560  # one tap's width; out_dim = len(taps) x teacher_hidden
    prefix = "<|im_start|>user\n"
    suffix = "<|im_end|>\n<|im_start|>assistant\n"
    one_piece = False  # the engine parses no prompt range ({0, 0}): the template is one piece
    start = 0  # template rows the engine drops before the DiT (prompt_template_encode_start_idx)
    padding = Padding()
    typical_rows = 120  # template rows of a typical corpus prompt, pads included (disk estimate)
    headline = "cos"
    eval_keys = ("cos", "cos_slice", "rel_mse", "worst_sample_cos", "roundtrip_cos", "baseline_cos")
    max_len_student = 1024
    max_len_teacher = 1024
    verdict = None  # no reference run: eval's health line is n/a, `check` reports figures only
    na_note = "; the whole stack's cosine: see the per-tap cosines"
    health_reference = ""
    defaults = {
        "corpus.n_train": 100000, "corpus.n_val": 1024, "corpus.empty_frac": 0.015,
        "precompute.shard_size": 512, "precompute.val_shard_size": 256,
        "train.width": 1024, "train.depth": 4, "train.steps": 20000, "train.batch_size": 32,
        "train.lr": 2e-4, "train.warmup": 1000,
    }

    @property
    def recipe_defaults(self) -> dict:
        """Measured on a real pretrained model's activations (benchmarks/bench_recipe_real.py,
        README "Recipes on real activations"): massive activations (the attention-sink row,
        appended pads) need standardized targets folded at export, statistics over the rows the
        loss reads and the rows before the start row out. Without pads every row is whitened
        by the token rows' own sigma, the template's constant rows (the sink among them)
        weighing less (`sink` tempered: ahead of one whitening and of `token` at 150 steps,
        level with `token` at 600, where both beat one whitening on every token row set by
        0.03-0.04 centred cosine and halve their rel_mse, the sink row exact), and then one
        cosine over the whole stack beats a cosine per tap (+0.04 at 150 steps, +0.014 long
        prompts at 600). With pads neither is better on both row sets
        (FLUX.3's pads lose 0.04 at 600 steps under token whitening; SeFi's lose 0.01 with one
        cosine), so one whitening and a cosine per tap stay. Pads to a multiple (FLUX.3: every
        pad at one rope position, so one identical row per sample) weigh one row together;
        fixed-length
        pads, which differ by position, stay a row each (nothing measured beat it on both row
        sets)."""
        return {
            "train.target_space": "standardized",
            "train.cosine": "tap" if self.taps and self.padding.pads else "row",
            "train.sigma_floor": 0.05, "train.sigma_floor_mode": "relative",
            "train.pad_weight": "one" if self.padding.multiple else "row",
            "train.prefix_rows": "out", "train.stats_rows": "loss",
            "train.sink": "none" if self.padding.pads else "tempered",
        }

    @property
    def out_dim(self) -> int:  # type: ignore[override]
        return len(self.taps) * self.teacher_hidden

    @property
    def bytes_per_sample(self) -> int:  # type: ignore[override]
        return self.typical_rows * ((self.out_dim + STUDENT_DIM) * 2 + 4)

    def shard_bytes(self, pad_rows: int = 0, from_start: bool = False) -> int:
        """Every template row's student state and id, and the targets stored: every row, or
        those of a typical prompt from the start row on (`from_start`) and its real rows and K
        pads (pad_rows K), with each stored row's position."""
        pads = bool(pad_rows) and bool(self.padding.pads)
        skip = self.start if from_start else 0
        if not pads and not skip:
            return self.bytes_per_sample
        real = min(self.typical_rows, TYPICAL_REAL_ROWS) if self.padding.pads \
            else self.typical_rows
        kept_pads = min(pad_rows, self.typical_rows - real) if pads else self.typical_rows - real
        stored = max(real - skip, 0) + kept_pads
        return self.typical_rows * (STUDENT_DIM * 2 + 4) + stored * (self.out_dim * 2 + 4)

    def format_prompt(self, text: str) -> str:
        return self.prefix + text + self.suffix

    def student_pieces(self, sample, image_tokens=()):
        """The engine's pieces: prefix, the prompt range (parsed for weight syntax), suffix; one
        piece for a family whose engine branch sets no prompt range."""
        if self.one_piece:
            return (Piece(self.format_prompt(sample.text)),)
        return (Piece(self.prefix), Piece(sample.text, prompt=True), Piece(self.suffix))

    def template_start(self, sample) -> int:
        return self.start

    def tap_layout(self):
        from ..teachers.qwen_taps import TapLayout

        return TapLayout(taps=tuple(self.taps), start=self.start,
                         start_prefix=self.prefix if self.start else "", padding=self.padding)

    def load_teacher(self, materials, plan, device):
        """The tap teacher over the snapshot's text stack, placed as the planner says (gpu,
        offload: streamed through the card from RAM, cpu in fp32)."""
        from ..teachers.qwen_taps import load_tap_teacher

        return load_tap_teacher(materials["teacher"], device, student_pieces=self.student_pieces,
                                layout=self.tap_layout(), family=self.family, mode=plan.mode,
                                ram_limit_gib=plan.cpu_gib)

    def check_teacher(self, materials) -> str:
        """config.json only: a Qwen3 / Qwen3-VL deep enough for every tap, and its width."""
        from ..teachers.qwen_taps import ARCHITECTURES, check_layout, read_config, text_config

        config = read_config(materials["teacher"])
        check_layout(config, self.tap_layout(), f"the {self.family} teacher")
        tc = text_config(config)
        return (f"{ARCHITECTURES[config['model_type']]}: {tc['num_hidden_layers']} layers, hidden "
                f"{tc['hidden_size']}; taps {', '.join(map(str, self.taps))} -> "
                f"{len(self.taps) * int(tc['hidden_size'])} features per row")

    def teacher_gib(self, materials, device):
        """The text stack as it sits in memory (fp32 on a CPU, bf16 on a card), from the
        snapshot's weight headers: a broken snapshot fails here, in seconds."""
        import torch

        from ..teachers.qwen_taps import text_stack_params

        per = 2 if torch.device(device).type == "cuda" else 4
        return text_stack_params(materials["teacher"]) * per / 1024**3

    def demo_materials(self, folder):
        """A tiny real teacher of the family's architecture, as deep as its deepest tap."""
        from ..tiny.qwen_taps import write_tiny_tap_teacher

        return {
            "teacher": write_tiny_tap_teacher(
                folder / f"{self.id}-teacher-tiny", self.teacher_arch, max(self.taps)
            )
        }

    def build_mock_teacher(self, project):
        from .mock import MockTokenTeacher

        return MockTokenTeacher(self.id, self.out_dim, self.start)

    def describe(self) -> dict:
        return {
            **super().describe(),
            "family": self.family,
            "serves": self.serves,
            "taps": list(self.taps),
        }
