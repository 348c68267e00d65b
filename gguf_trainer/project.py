"""The project folder: `project.json` settings (validated), naming, output paths.

A project is one directory holding everything a run needs and makes (see paths.py for
the file names). This module owns the settings schema and the rules that turn settings
into file names. It never writes `state.json` (the pipeline does) and imports no torch.

    proj = create_project(root / "llada_adapter", "llada_image")
    proj = load_project(root / "llada_adapter")
    proj.final_gguf        # <output_dir>/pig_llada_adapter-f16.gguf
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import atomic
from .errors import NoProjectError, UserError
from .paths import ProjectPaths

PROJECTS_ROOT = Path(os.environ.get("GGUF_TRAINER_PROJECTS", "~/gguf-trainer/projects")).expanduser()
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def parse_steps(value: Any) -> int:
    """'12000', '12_000', '12,000', '40k', 40000.0 -> int; anything else is a UserError."""
    if isinstance(value, bool):
        raise UserError(f"steps must be a positive whole number like 12000 or 40k, not {value!r}.")
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        text = str(value).strip().lower().replace("_", "").replace(",", "")
        scale = 1000 if text.endswith("k") else 1
        text = text[:-1] if scale == 1000 else text
        try:
            number = float(text) * scale
        except ValueError:
            raise UserError(f"steps must be a positive whole number like 12000 or 40k, not {value!r}.") from None
    if not math.isfinite(number) or number != int(number) or number < 1:
        raise UserError(f"steps must be a positive whole number like 12000 or 40k, not {value!r}.")
    return int(number)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class MaterialRef(_Section):
    path: str = ""


class CorpusSettings(_Section):
    files: list[str] = Field(default_factory=list, description="local .txt/.jsonl prompt files")
    train_file: str = Field("", description="a ready-made train.txt (with val_file)")
    val_file: str = ""
    n_train: int = Field(60000, ge=1)
    n_val: int = Field(1024, ge=1)
    empty_frac: float = Field(0.01, ge=0.0, le=0.5)
    min_chars: int = Field(8, ge=0)
    max_chars: int = Field(1200, ge=1)
    seed: int = 8


class PrecomputeSettings(_Section):
    device: str = "auto"
    shard_size: int = Field(1024, ge=1)
    val_shard_size: int = Field(512, ge=1)
    teacher_batch: int = Field(0, ge=0, description="0 = chosen for the card")
    tok_budget: int = Field(0, ge=0, description="teacher tokens per batch, 0 = auto")
    student_batch: int = Field(0, ge=0)
    student_tok_budget: int = Field(0, ge=0)
    teacher_mode: Literal["auto", "gpu", "offload"] = "auto"
    placement: Literal["sequential", "balanced"] = "sequential"
    gpu_mem_gib: float = Field(0.0, ge=0)
    cpu_mem_gib: float = Field(0.0, ge=0)
    student_dtype: Literal["auto", "f32", "f16", "bf16"] = "auto"
    mock_teacher: bool = False


class TrainSettings(_Section):
    device: str = "auto"
    width: int = Field(1024, ge=64)
    depth: int = Field(6, ge=1)
    steps: int = 20000
    batch_size: int = Field(32, ge=1)
    lr: float = Field(2e-4, gt=0)
    warmup: int = Field(1000, ge=0)
    weight_decay: float = Field(0.01, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    cos_weight: float = Field(0.5, ge=0)
    sigma_floor: float = Field(0.03, gt=0)
    grad_checkpoint: Literal["auto", "on", "off"] = "auto"
    log_every: int = Field(25, ge=1)
    val_every: int = Field(500, ge=1)
    save_every: int = Field(250, ge=1)
    seed: int = 42
    threads: int = Field(0, ge=0, description="CPU threads; 0 = pinned at the first start")

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
            raise ValueError(f"width {v} must be a multiple of 64 (the engine's head size), e.g. 1024")
        return v


class ExportSettings(_Section):
    output_dir: str = Field("", description="empty = the project's parent folder")
    copy_to: str = ""
    run_eval: bool = True
    export_sigvq: bool = True


class ProjectSettings(_Section):
    pack: str
    name: str
    auto_resume: bool = True
    materials: dict[str, MaterialRef] = Field(default_factory=dict)
    corpus: CorpusSettings = Field(default_factory=CorpusSettings)
    precompute: PrecomputeSettings = Field(default_factory=PrecomputeSettings)
    train: TrainSettings = Field(default_factory=TrainSettings)
    export: ExportSettings = Field(default_factory=ExportSettings)

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if not NAME_RE.match(v) or ".." in v:
            raise ValueError(
                f"name {v!r} must be letters, digits, '.', '_' or '-' (no folders), e.g. pig_t5_adapter"
            )
        return v

    @field_validator("pack")
    @classmethod
    def _pack(cls, v):
        from .packs import pack_ids

        if v not in pack_ids():
            raise ValueError(f"unknown pack {v!r}; choose one of {', '.join(pack_ids())}")
        return v


def _describe_errors(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "is not a setting; remove it"
        elif e["type"] == "missing":
            msg = "is required; add it"
        lines.append(f"  {where}: {msg}")
    n = len(lines)
    head = f"{source} has {n} bad setting{'s' if n > 1 else ''}; fix {'them' if n > 1 else 'it'}:"
    return "\n".join([head, *lines])


def validate_settings(data: dict, source: str = "project.json") -> ProjectSettings:
    """Every bad field is reported at once, each with what to do."""
    try:
        return ProjectSettings.model_validate(data)
    except ValidationError as e:
        raise UserError(_describe_errors(e, source)) from None


def default_name(pack_default: str, name: str | None = None) -> str:
    """`pig_` + the pack's default name unless the name already starts with `pig_`."""
    name = name or pack_default
    return name if name.startswith("pig_") else "pig_" + name


def _set_dotted(data: dict, dotted: str, value: Any) -> None:
    node = data
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = copy.deepcopy(value)


class Project:
    """A loaded project: its folder, validated settings and the names derived from them."""

    def __init__(self, paths: ProjectPaths, settings: ProjectSettings):
        self.paths = paths
        self.settings = settings

    @property
    def dir(self) -> Path:
        return self.paths.root

    @property
    def pack(self):
        from .packs import get_pack

        return get_pack(self.settings.pack)

    @property
    def output_dir(self) -> Path:
        out = self.settings.export.output_dir
        return Path(out).expanduser().resolve() if out else self.dir.parent

    @property
    def base_name(self) -> str:
        """The name minus a trailing `_adapter`, for companion files (`pig_llada_sigvq-f16.gguf`)."""
        return self.settings.name.removesuffix("_adapter")

    @property
    def final_gguf(self) -> Path:
        return self.output_dir / f"{self.settings.name}-f16.gguf"

    def snapshot_gguf(self, step: int) -> Path:
        return self.output_dir / f"{self.settings.name}-step{step}-f16.gguf"

    def companion_gguf(self, kind: str) -> Path:
        return self.output_dir / f"{self.base_name}_{kind}-f16.gguf"

    def material_path(self, material_id: str) -> Path | None:
        ref = self.settings.materials.get(material_id)
        if ref and ref.path:
            p = Path(ref.path).expanduser()
            return p if p.is_absolute() else (self.dir / p)
        return None


def read_raw(paths: ProjectPaths) -> dict:
    if not paths.exists():
        raise NoProjectError(f"{paths.root} is not a project (no project.json); create one or check the path.")
    try:
        return json.loads(paths.project_json.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(
            f"{paths.project_json} is not valid JSON (line {e.lineno}: {e.msg}); fix or recreate it."
        ) from None


def load_project(root: str | os.PathLike) -> Project:
    paths = ProjectPaths(Path(root))
    raw = read_raw(paths)
    return Project(paths, validate_settings(raw, str(paths.project_json)))


def create_project(root: str | os.PathLike, pack_id: str, name: str | None = None,
                   overrides: dict[str, Any] | None = None) -> Project:
    """Write a new project.json: schema defaults, then the pack's defaults, then `overrides`
    (dotted keys, e.g. {"train.steps": 40}). Refuses to overwrite an existing project."""
    from .packs import get_pack

    paths = ProjectPaths(Path(root))
    if paths.exists():
        raise UserError(f"{paths.root} already holds a project; open it instead or pick another folder.")
    pack = get_pack(pack_id)
    data: dict = {"pack": pack_id, "name": default_name(pack.default_name, name)}
    for dotted, value in {**pack.defaults, **(overrides or {})}.items():
        _set_dotted(data, dotted, value)
    settings = validate_settings(data, "the new project's settings")
    paths.root.mkdir(parents=True, exist_ok=True)
    atomic.write_json(paths.project_json, settings.model_dump(mode="json"))
    return Project(paths, settings)


def update_settings(root: str | os.PathLike, changes: dict[str, Any]) -> Project:
    """Apply dotted-key changes to project.json atomically (validated first; nothing is
    written when a value is bad). Clients use this while a run goes on: the trainer
    re-reads `train.steps` every `log_every` steps."""
    paths = ProjectPaths(Path(root))
    raw = read_raw(paths)
    for dotted, value in changes.items():
        _set_dotted(raw, dotted, value)
    settings = validate_settings(raw, str(paths.project_json))
    atomic.write_json(paths.project_json, settings.model_dump(mode="json"))
    return Project(paths, settings)


def set_steps(root: str | os.PathLike, steps: Any) -> int:
    steps = parse_steps(steps)
    update_settings(root, {"train.steps": steps})
    return steps


def read_steps(paths: ProjectPaths) -> int | None:
    """`train.steps` as it is on disk now, or None when project.json is mid-edit or broken
    (the trainer then keeps the count it has)."""
    try:
        return parse_steps(json.loads(paths.project_json.read_text(encoding="utf-8"))["train"]["steps"])
    except (OSError, ValueError, KeyError, TypeError, UserError):
        return None
