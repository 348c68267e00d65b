"""The settings schema of `project.json`: every field with its GUI metadata and bounds.

This module owns the schema — each field's label, help, range, section, whether it may
change while a run is live (`live`: no output is built from it) and its physical bounds,
each with its reason — and the parsers its fields share (`parse_steps`, `check_device`).
The one-sentence error for every bad value and `validate_settings` are schema_errors.py's;
the per-field metadata the GUI builds its form from and the README's settings table are
schema_fields.py's. It reads and writes no file (project.py does) and imports no torch.

    ProjectSettings.model_validate({"pack": "t5xxl_pixart"})   # the sections and their defaults
    parse_steps("40k")                                         # 40000
"""

from __future__ import annotations

import decimal
import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gguf_trainer.base.errors import UserError, quote
from gguf_trainer.base.jsonvals import get_dotted  # noqa: F401  (re-exported: settings code reads it from here)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
MAX_STEPS = 100_000_000
_STEPS_RE = re.compile(r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)(e\+?[0-9]+)?(k)?$")
_STEPS_HELP = "steps must be a positive whole number like 12000, 12_000 or 40k"


def parse_steps(value: Any) -> int:
    """'12000', '12_000', '12,000', '40k', '1.5k', 40000.0 -> int, exactly (no float
    rounding: a 21-digit count stays those digits, then the range check refuses it).
    Anything else, or outside 1..MAX_STEPS, is a UserError naming the value and the fix."""
    if isinstance(value, bool):
        raise UserError(f"{_STEPS_HELP}, not {quote(value)}.")
    if isinstance(value, int):
        number = decimal.Decimal(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise UserError(f"{_STEPS_HELP}, not {quote(value)}.")
        number = decimal.Decimal(value)
    else:
        text = str(value).strip().lower().replace("_", "").replace(",", "")
        if not _STEPS_RE.match(text):
            raise UserError(f"{_STEPS_HELP}, not {quote(str(value))}.")
        scale = 1000 if text.endswith("k") else 1
        try:
            number = decimal.Decimal(text.removesuffix("k")) * scale
        except decimal.InvalidOperation:
            raise UserError(f"{_STEPS_HELP}, not {quote(str(value))}.") from None
    if number != number.to_integral_value() or number < 1:
        raise UserError(f"{_STEPS_HELP}, not {quote(value)}.")
    if number > MAX_STEPS:
        raise UserError(f"steps {int(number)} is more than {MAX_STEPS:,}: that would train for "
                        "months; a recipe needs 10k-50k. Choose a smaller count.")
    return int(number)


# ---- schema building blocks -----------------------------------------------------------
def _no_bool(v):
    if isinstance(v, bool):
        raise PydanticCustomError("bool_not_number", "true/false is not a number")
    return v


Int = Annotated[int, BeforeValidator(_no_bool)]
Float = Annotated[float, BeforeValidator(_no_bool)]


def S(default: Any = ..., label: str = "", help: str = "", *, why: str = "", live: bool = False,
      advanced: bool = False, kind: str = "", choices_from: str = "", default_factory=None,
      packs: tuple[str, ...] = (), **bounds) -> Any:
    """A setting: its default, GUI label/help, bounds (ge/le/gt/lt) and why they are so,
    `live` (may change while a run is live: no output is built from it), `advanced`,
    `kind` ("path" for file/folder fields), `choices_from` (a list whose allowed items are
    corpus_sources.known_ids(choices_from): the GUI shows a multi-select), `packs` (the
    only packs that read it; the GUI hides it for the others). Floats are always finite."""
    extra = {"label": label, "live": live, "advanced": advanced, "why": why, "kind": kind,
             "choices_from": choices_from, "packs": list(packs)}
    kw = dict(description=help, json_schema_extra=extra, **bounds)
    if default_factory is not None:
        return Field(default_factory=default_factory, **kw)
    return Field(default, **kw)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class MaterialRef(_Section):
    path: str = S("", "Path", "where this material is on disk (file or folder)", kind="path")


SEED_WHY = "seeds are 32-bit"


class CorpusSettings(_Section):
    files: list[str] = S(label="Prompt files",
                         help="local .txt/.jsonl prompt files (one prompt a line)",
                         kind="paths", default_factory=list)
    presets: list[str] = S(label="Prompt datasets",
                           help="public prompt datasets, downloaded as materials",
                           choices_from="presets", default_factory=list)
    weights: dict[str, float] = S(label="Source weights",
                                  help="share of the prompts per source (a dataset id or 'files'); "
                                       "unset = in proportion to size", default_factory=dict,
                                  advanced=True)
    image_presets: list[str] = S(label="Image datasets",
                                 help="image + caption datasets for image packs, downloaded as "
                                      "materials", choices_from="image_presets",
                                 default_factory=list)
    image_folders: list[str] = S(label="Image folders",
                                 help="local folders of images (searched recursively; an optional "
                                      "<name>.txt caption beside each image)", kind="paths",
                                 default_factory=list)
    # LingBot Video's reference-image samples (image sources, .jsonl `images`): read by that
    # pack only (TrainerPack.takes_images); default on, so a project made before the key keeps
    # the corpus it was built from; LingBot's `new` writes it off (packs/qwen3vl_lingbot.py).
    reference_images: bool = S(
        True, "Reference-image samples", "train samples with reference images (image datasets, "
        "image folders, .jsonl `images`); no ggk up to 0.9.7 hands LingBot Video's text encoder "
        "reference images (no reference preset: pass_to_vlm off; -M vid_gen passes none), so "
        "they serve a later ggk whose LingBot path does; off: those samples train as text",
        advanced=True, packs=("qwen3vl_lingbot",))
    train_file: str = S("", "Ready-made train file", "a train.txt to use as is (with the val file)",
                        kind="path")
    val_file: str = S("", "Ready-made val file", "the val.txt that goes with the train file",
                      kind="path")
    n_train: Int = S(60000, "Train prompts", "prompts in the training split", ge=1, le=10_000_000,
                     why="more than 10 million prompts would fill any disk with shards")
    n_val: Int = S(1024, "Val prompts", "held-out prompts scored during and after training", ge=1,
                   le=1_000_000,
                   why="a million val prompts would take longer to score than to train")
    empty_frac: Float = S(0.01, "Empty-prompt share",
                          "share of empty prompts (unconditional generation)", ge=0.0, le=0.5,
                          advanced=True, why="a share, and above half starves training")
    min_chars: Int = S(8, "Min prompt length", "shorter prompts are dropped (characters)", ge=0,
                       le=100_000, advanced=True, why="a prompt is never that long")
    max_chars: Int = S(1200, "Max prompt length", "longer prompts are dropped (characters)", ge=1,
                       le=1_000_000, advanced=True, why="a prompt is never that long")
    seed: Int = S(8, "Corpus seed", "shuffle and split seed", ge=0, le=2**32 - 1, advanced=True,
                  why=SEED_WHY)
    # Upsampled captions (stages/corpus_captions.py; README "Captions from the upsampler").
    caption_endpoint: str = S(
        "", "Caption endpoint", "an OpenAI-compatible /v1 address (a local llama.cpp server with "
        "the Qwen3.5 upsampler GGUF, e.g. http://127.0.0.1:8080/v1) that rewrites a share of "
        "the prompts with FLUX.3's prompt-upsampler request, each caption an extra sample; "
        "empty = off")
    caption_model: str = S("", "Caption model", "the model id to ask (one the endpoint's "
                           "/v1/models lists); empty = the first it lists", advanced=True)
    caption_share: Float = S(0.25, "Caption share", "share of the prompts of each split "
                             "rewritten by the caption endpoint", ge=0.0, le=1.0, advanced=True,
                             why="a share of the prompts")
    caption_max_tokens: Int = S(3584, "Caption max tokens", "most tokens one caption may have "
                                "(ggk's upsampler: 3584)", ge=16, le=16384, advanced=True,
                                why="past the upsampler's context with its system prompt")
    caption_workers: Int = S(2, "Caption requests in flight", "caption requests sent at once "
                             "(match the server's parallel slots)", ge=1, le=64, live=True,
                             advanced=True, why="no local server serves more at once")

    @field_validator("caption_endpoint")
    @classmethod
    def _http_address(cls, v: str) -> str:
        v = v.strip()
        if v and not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"{quote(v)} is not an http(s) address; set it like "
                             "http://127.0.0.1:8080/v1, or leave it empty")
        return v

    @field_validator("presets", "image_presets")
    @classmethod
    def _known_sources(cls, v, info):
        from gguf_trainer.materials.corpus_sources import known_ids

        known = known_ids(info.field_name)
        bad = [x for x in v if x not in known]
        if bad:
            raise ValueError(f"unknown {'dataset' if len(bad) == 1 else 'datasets'} "
                             f"{quote(', '.join(map(str, bad)))}; choose from {', '.join(known)}")
        return list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _lengths(self):
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) is above max_chars "
                             f"({self.max_chars}), so every prompt would be dropped; lower "
                             "min_chars or raise max_chars")
        return self


BATCH_WHY = "no card holds a bigger batch"
BUDGET_WHY = "no card holds more tokens in one batch"
MEM_WHY = "more memory than any machine has"


class PrecomputeSettings(_Section):
    device: str = S("auto", "Device", "auto, cpu, cuda, cuda:N or mps", live=True)
    shard_size: Int = S(1024, "Train shard size", "samples per train shard", ge=1, le=1_000_000,
                        advanced=True, why="one shard must fit in memory")
    val_shard_size: Int = S(512, "Val shard size", "samples per val shard", ge=1, le=1_000_000,
                            advanced=True, why="one shard must fit in memory")
    teacher_batch: Int = S(0, "Teacher batch", "samples per teacher batch; 0 = chosen for the card",
                           ge=0, le=65536, live=True, why=BATCH_WHY)
    tok_budget: Int = S(0, "Teacher token budget", "teacher tokens per batch; 0 = auto", ge=0,
                        le=1 << 24, live=True, why=BUDGET_WHY)
    student_batch: Int = S(0, "Student batch", "samples per student batch; 0 = auto", ge=0,
                           le=65536, live=True, advanced=True, why=BATCH_WHY)
    student_tok_budget: Int = S(0, "Student token budget", "student tokens per batch; 0 = auto",
                                ge=0, le=1 << 24, live=True, advanced=True, why=BUDGET_WHY)
    teacher_mode: Literal["auto", "gpu", "offload", "cpu"] = S(
        "auto", "Teacher mode", "gpu: resident on the card; offload: streamed from RAM; cpu; "
        "auto: chosen from the memory budgets", live=True)
    placement: Literal["sequential", "balanced"] = S(
        "sequential", "Placement", "several cards: fill one then the next, or spread evenly",
        live=True, advanced=True)
    gpu_mem_gib: Float = S(0.0, "GPU memory budget (GiB)", "0 = what the card has free", ge=0,
                           le=4096, live=True, why=MEM_WHY)
    cpu_mem_gib: Float = S(0.0, "CPU memory budget (GiB)", "0 = what the machine has free", ge=0,
                           le=65536, live=True, why=MEM_WHY)
    student_dtype: Literal["auto", "f32", "f16", "bf16"] = S(
        "auto", "Student compute dtype", "auto = f32, as the engine computes", advanced=True)
    @field_validator("device")
    @classmethod
    def _device(cls, v):
        return check_device(v, "precompute.device")

    mock_teacher: bool = S(False, "Mock teacher", "synthetic targets with the real shapes: a smoke "
                           "test, never a usable adapter")
    # PixArt's caption window: the DiT's caption_length (contract §3.3), read by the pack
    # (TrainerPack.configured) and nowhere else; it sets the adapter's num_queries.
    t5_window: Literal[120, 300] = S(
        120, "T5 window", "caption slots of the PixArt model the adapter is for: 120 PixArt-α, "
        "300 PixArt-Σ (the DiT's caption_length; the adapter's num_queries must equal it)",
        packs=("t5xxl_pixart",))
    processes: Int = S(1, "Processes", "ranks computing shards in parallel (one per GPU); shard k "
                       "goes to rank k mod N, the shards are the same for any N", ge=1, le=1024,
                       advanced=True,
                       why="one process per card; more than 1024 ranks is no machine")


class TrainSettings(_Section):
    device: str = S("auto", "Device", "auto, cpu, cuda, cuda:N or mps", live=True)
    width: Int = S(1024, "Width", "adapter hidden size (a multiple of 64)", ge=64, le=16384,
                   why="the engine's heads are 64 wide, and wider than 16384 fits no card")
    depth: Int = S(6, "Depth", "adapter blocks", ge=1, le=64, why="deeper than 64 blocks does not "
                   "train in any recipe's budget")
    steps: int = S(20000, "Steps", "planned training steps (also while running)", ge=1,
                   le=MAX_STEPS, live=True, why="more would train for months")
    batch_size: Int = S(32, "Batch size", "samples per step", ge=1, le=65536, why=BATCH_WHY)
    lr: Float = S(2e-4, "Learning rate", "peak AdamW learning rate", gt=0, le=1.0,
                  why="above 1 training diverges")
    warmup: Int = S(1000, "Warmup steps", "linear warmup steps", ge=0, le=MAX_STEPS, advanced=True,
                    why="more than any run's steps")
    weight_decay: Float = S(0.01, "Weight decay", "AdamW weight decay", ge=0, le=10.0,
                            advanced=True, why="above 10 it erases the weights")
    grad_clip: Float = S(1.0, "Gradient clip", "max gradient norm", gt=0, le=1e6, advanced=True,
                         why="0 would stop training; beyond 1e6 it clips nothing")
    cos_weight: Float = S(0.5, "Cosine loss weight", "weight of the cosine term in the loss", ge=0,
                          le=100.0, advanced=True, why="a weight, not a scale of magnitude")
    sigma_floor: Float = S(0.03, "Sigma floor", "floor of the per-dimension std used to "
                           "standardise targets", gt=0, le=10.0, advanced=True,
                           why="0 divides by zero; above 10 it flattens every target")
    # The recipe (data/recipe.py; README "Recipes on real activations"). A project.json written
    # before these keys keeps the recipe it trained with: each default is that old behaviour
    # (target_space "pack" = the pack's old fixed space); new projects store their pack's
    # measured defaults.
    target_space: Literal["raw", "standardized", "pack"] = S(
        "pack", "Target space", "raw: predict the teacher's rows; standardized: predict (t - mu) "
        "/ sigma and fold mu, sigma into out_proj/skip at export (massive activations need it); "
        "pack: the space the pack trained in before this setting (LLaDA standardized, others raw)",
        advanced=True)
    cosine: Literal["row", "tap"] = S(
        "row", "Cosine over", "row: one cosine over the whole output row; tap: the mean of each "
        "tap's cosine (a layerwise stack's deep taps would own a whole-row cosine)", advanced=True)
    sigma_floor_mode: Literal["absolute", "relative"] = S(
        "absolute", "Sigma floor mode", "absolute: sigma floored at train.sigma_floor; relative: "
        "at train.sigma_floor x each tap's median sigma", advanced=True)
    pad_weight: Literal["row", "one"] = S(
        "row", "Pad weight", "row: every appended pad row weighs one row; one: all of a "
        "sample's pads together weigh one row", advanced=True)
    prefix_rows: Literal["in", "out"] = S(
        "in", "Rows before the start row", "in or out of the loss and the statistics (the DiT "
        "never reads them: the engine drops them after the adapter)", advanced=True)
    stats_rows: Literal["all", "loss"] = S(
        "all", "Statistics over", "all: every stored row; loss: the rows weighted as the loss "
        "weighs them", advanced=True)
    sink: Literal["none", "token", "tempered", "apart"] = S(
        "none", "Whitening", "none: every row whitened by the fold's sigma; token: every row by "
        "the token rows' own sigma (the attention-sink row keeps its exact fit but no longer sets "
        "the scale of ordinary rows); tempered: as token, the template's constant rows (the sink "
        "among them) weighing less, so fitting them does not crowd out the token rows; apart: "
        "token and pad rows each by their own", advanced=True)
    # Seeded packs: the export writes t5_embed_a/_b (engine-families §4) instead of the table.
    # The Qwen3.5 bridge: the rank of the frozen PCA seed table (model/slot_resampler.py).
    seed_rank: Int = S(0, "Seed rank", "0 = the full seed table; r = the export factorizes it "
                       "by truncated SVD into t5_embed_a (vocab x r) + t5_embed_b (r -> width), "
                       "a smaller file; the reconstruction error is logged. qwen35_bridge: the "
                       "rank of the frozen PCA of the teacher's embedding table that seeds the "
                       "slots (0 = 384)", ge=0, le=16384,
                       advanced=True,
                       packs=("t5xxl_pixart", "t5xxl_chroma", "umt5xxl_wan", "qwen35_bridge"),
                       why="the rank cannot exceed the adapter width (at most 16384)")
    # The Qwen3.5 bridge's FLUX.3 bank head (data/bank_rows.py): its rows, 0 = no bank.
    bank_slots: Int = S(0, "FLUX.3 bank rows", "qwen35_bridge: 0 = the MOSS-Image slot head "
                        "only; n (a multiple of 80, e.g. 240) = also train the FLUX.3 Klein bank "
                        "head of n rows on Qwen3-VL-4B's 8-tap stack of the prompt (needs the "
                        "bank_teacher material), so --prompt-upsampler pig_clip "
                        "--prompt-upsampler-adapter serves FLUX.3", ge=0, le=4080,
                        advanced=True, packs=("qwen35_bridge",),
                        why="the engine's bank holds the FLUX.3 template of at most 4080 rows")
    grad_checkpoint: Literal["auto", "on", "off"] = S(
        "auto", "Gradient checkpointing", "trade compute for memory", live=True, advanced=True)
    log_every: Int = S(25, "Log every", "steps between log lines (and live steps checks)", ge=1,
                       le=1_000_000, live=True, advanced=True, why="nothing would ever be logged")
    val_every: Int = S(500, "Validate every", "steps between validations", ge=1, le=MAX_STEPS,
                       live=True, advanced=True, why="more than any run's steps")
    save_every: Int = S(250, "Save every", "steps between last.pt saves", ge=1, le=MAX_STEPS,
                        live=True, advanced=True, why="more than any run's steps")
    seed: Int = S(42, "Seed", "initialisation and batch order", ge=0, le=2**32 - 1, advanced=True,
                  why=SEED_WHY)
    threads: Int = S(0, "CPU threads", "0 = pinned at the first start", ge=0, le=4096, live=True,
                     advanced=True, why="no machine has more cores")
    # Kept steps (data/kept_steps.py; README "Kept steps"): the published trainer's names.
    history: bool = S(False, "Keep steps for later export", "keep a weights-only copy of chosen "
                      "steps (checkpoints/history/) that exports later exactly as a snapshot taken "
                      "then; read when training starts")
    history_every: Int = S(0, "Keep every", "steps between kept steps; 0 = at every validation "
                           "(train.val_every)", ge=0, le=MAX_STEPS,
                           why="more than any run's steps")
    history_from: Int = S(0, "Keep from step", "the first step that may be kept", ge=0,
                          le=MAX_STEPS, why="more than any run's steps")
    history_to: Int = S(0, "Keep to step", "the last step that may be kept; 0 = the end", ge=0,
                        le=MAX_STEPS, why="more than any run's steps")
    history_keep: Int = S(0, "Keep at most", "the newest kept steps that stay on disk (older ones "
                          "are deleted); 0 = all", ge=0, le=1_000_000,
                          why="a million files is no folder anyone reads")
    processes: Int = S(1, "Processes", "data-parallel ranks (one per GPU), each a slice of every "
                       "batch; the batch size stays the global batch", ge=1, le=1024,
                       advanced=True,
                       why="one process per card; more than 1024 ranks is no machine")

    @field_validator("steps", mode="before")
    @classmethod
    def _steps(cls, v):
        try:
            return parse_steps(v)
        except UserError as e:
            raise ValueError(str(e)) from None

    @field_validator("width")
    @classmethod
    def _width(cls, v):
        if v % 64:
            raise ValueError(f"{v} is not a multiple of 64 (the engine's head size); "
                             f"set it to e.g. {max(64, v // 64 * 64)} or 1024")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v):
        return check_device(v, "train.device")


class ExportSettings(_Section):
    output_dir: str = S("", "Output folder", "where the GGUF goes; empty = the project's parent "
                        "folder", kind="path", live=True)
    copy_to: str = S("", "Copy to", "also copy the final GGUF into this folder (e.g. ggk's models)",
                     kind="path", live=True)
    run_eval: bool = S(True, "Evaluate after export", "score the exported GGUF on the val shards",
                       live=True)
    dtype: Literal["f16", "q8_0", "bf16"] = S(
        "f16", "Weight type", "f16: the engine's reference; q8_0: Q8_0 for each Linear whose "
        "input width is a multiple of 32 (f16 otherwise), about half the size, its cosine drop "
        "measured by the eval; bf16: every Linear weight bf16. Norms, biases, queries and "
        "layer_map stay f32; the file name carries the type", live=True)
    export_sigvq: bool = S(True, "Export SigVQ companion", "also write the SigVQ companion GGUF "
                           "(packs that have one)", live=True)


DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:[0-9]{1,2})?)$")


def check_device(value: Any, field: str = "device") -> str:
    """auto | cpu | cuda | cuda:N | mps, checked without torch; ValueError with the fix."""
    if not isinstance(value, str) or not DEVICE_RE.match(value.strip()):
        raise ValueError(f"{quote(value)} is not a device; use auto, cpu, cuda, cuda:0 (one card) "
                         "or mps")
    return value.strip()


class ProjectSettings(_Section):
    pack: str = S(..., "Pack", "the distillation recipe (gguf-trainer demo --help lists them)")
    name: str = S("", "Name", "the GGUF's base name; empty = the pack's default (pig_ + its name)",
                  live=True)
    auto_resume: bool = S(True, "Auto-resume", "`gguf-trainer --auto-resume` relaunches this "
                          "project if its run died", live=True)
    materials: dict[str, MaterialRef] = S(label="Materials", help="materials.<id>.path: where "
                                          "each material is", default_factory=dict)
    corpus: CorpusSettings = S(label="Corpus", default_factory=CorpusSettings)
    precompute: PrecomputeSettings = S(label="Precompute", default_factory=PrecomputeSettings)
    train: TrainSettings = S(label="Training", default_factory=TrainSettings)
    export: ExportSettings = S(label="Output", default_factory=ExportSettings)

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if v and (not NAME_RE.match(v) or ".." in v):
            raise ValueError(f"{quote(v)} must be letters, digits, '.', '_' or '-' (no folders, at "
                             "most 100 characters), e.g. pig_t5_adapter")
        return v

    @field_validator("pack")
    @classmethod
    def _pack(cls, v):
        from gguf_trainer.packs import pack_ids

        if v not in pack_ids():
            raise ValueError(f"unknown pack {quote(v)}; choose one of {', '.join(pack_ids())}")
        return v

    @model_validator(mode="after")
    def _default_name(self):
        if not self.name:
            from gguf_trainer.packs import get_pack

            self.name = default_name(get_pack(self.pack).default_name)
        return self


SECTIONS = {"": "Project", "materials": "Materials", "corpus": "Corpus",
            "precompute": "Precompute", "train": "Training", "export": "Output"}


def default_name(pack_default: str, name: str | None = None) -> str:
    """`pig_` + the pack's default name unless the name already starts with `pig_`."""
    name = name or pack_default
    return name if name.startswith("pig_") else "pig_" + name

