"""The control API's packs and projects: the packs listed, a project created or opened, its
settings read and changed (compare-and-set), `train.steps` set also while running, and the
schema's field metadata for the GUI. Torch-free, like all of runner.control."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gguf_trainer.base.errors import NoProjectError, UserError
from gguf_trainer.base.paths import PROJECT_JSON
from gguf_trainer.runner import supervisor
from gguf_trainer.runner.control.helpers import (
    PathLike,
    _live_run,
    _paths,
    _root,
    _wait_steps_seen,
)
from gguf_trainer.runner.control.runs import status
from gguf_trainer.runner.views import ProjectView, SettingsRead, StepsResult, UpdateResult
from gguf_trainer.stages.stage_list import TRAINING, stages_from


# ---- packs and projects ---------------------------------------------------------------
def list_packs() -> list[dict]:
    """Every registered pack: {id, title, description, default_name, adapter_kind,
    materials, ...} (TrainerPack.describe())."""
    from gguf_trainer.packs import get_pack, pack_ids

    return [get_pack(pid).describe() for pid in pack_ids()]


def new_project(root: PathLike, pack_id: str, name: str | None = None,
                overrides: dict[str, Any] | None = None) -> ProjectView:
    """Create a project folder with a project.json for `pack_id` (schema defaults, then the
    pack's, then `overrides` as dotted keys). Refuses an existing project, an unknown pack,
    a bad name, a folder that is a file, or one that already holds files but no project
    (a later reset would then clear that folder's own data/, shards/ ...), before writing
    anything."""
    from gguf_trainer.store import project

    path = _root(root)
    if not (path / PROJECT_JSON).exists():
        _refuse_foreign_folder(path, "a project", f"gguf-trainer new --pack {pack_id} "
                               f"{path / 'gguf_project'}")
    project.create_project(path, pack_id, name, overrides)
    return open_project(root)


def check_demo_folder(root: PathLike) -> None:
    """`demo --dir`: refuse a folder that holds files but no project, so the demo never
    builds its materials and project.json inside someone's own folder (it was run on a home
    folder). Accepted: a folder that does not exist yet, an empty one, an existing project
    (the demo reuses it), and one holding only the `materials` folder a demo set-up that was
    cut short before writing project.json leaves behind."""
    path = _root(root)
    if (path / PROJECT_JSON).exists():
        return
    _refuse_foreign_folder(path, "the demo", f"--dir {path / 'gguf_demo'}", {"materials"})


def _refuse_foreign_folder(path: Path, what: str, example: str,
                           allowed: set[str] = frozenset()) -> None:
    """A folder that does not exist yet or is empty (but for `allowed` names) may become a
    project; one holding someone's files may not: the tool would mix its data/, shards/ and
    checkpoints/ with theirs, and a reset would delete them."""
    if not path.exists():
        return
    if not path.is_dir():
        raise UserError(f"{path} is a file, not a folder; choose a new folder for {what}.")
    try:
        names = {p.name for p in path.iterdir()}
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror}); choose a folder you can write to "
                        f"for {what}.") from None
    if names <= allowed:
        return
    raise UserError(f"{path} is not empty and holds no project, so {what} will not be made "
                    f"inside it; choose a new or empty folder (e.g. {example}).")


def open_project(root: PathLike) -> ProjectView:
    """The project's settings, pack description, status and errors. A broken project.json
    (not JSON, bad values) is reported in `errors` with ok=False, never as "idle".
    NoProjectError when the folder holds no project.json."""
    from gguf_trainer.packs import get_pack
    from gguf_trainer.store import project, schema_errors

    paths = _paths(root)
    errors: list[str] = []
    raw = None
    version = None
    settings = None
    pack = None
    try:
        raw, version = project.read_settings_versioned(paths)  # paths absolute, where it is
        settings = schema_errors.validate_settings(raw, str(paths.project_json)).model_dump(
            mode="json")
    except NoProjectError:
        raise
    except UserError as e:
        errors.append(str(e))
    pack_id = (settings or (raw if isinstance(raw, dict) else {}) or {}).get("pack")
    if isinstance(pack_id, str):
        try:
            pack = get_pack(pack_id).describe()
        except UserError:
            pack = None
    return ProjectView(root=str(paths.root), ok=not errors, settings=settings or raw,
                       version=version, pack=pack, errors=errors, status=status(paths.root))


def read_settings(root: PathLike) -> SettingsRead:
    """Validated settings (every key, defaults filled) and the version token.
    UserError when project.json is broken (the sentence says what to fix)."""
    from gguf_trainer.store import project, schema_errors

    paths = _paths(root)
    raw, version = project.read_settings_versioned(paths)  # paths absolute, where it is
    values = schema_errors.validate_settings(raw, str(paths.project_json)).model_dump(mode="json")
    return SettingsRead(values=values, version=version)


def update_settings(root: PathLike, changes: dict[str, Any],
                    expected: SettingsRead | dict | None) -> UpdateResult:
    """Compare-and-set of dotted-key `changes` (e.g. {"train.lr": 1e-4}).

    Under the project's settings lock (the pipeline's own writes take it too): re-read
    project.json; a changed field whose value on disk differs from `expected` (what the
    caller read: a SettingsRead, its as_dict() or its `values`) is a conflict, not written; a field
    whose change would invalidate a live run's outputs is refused with the reason; invalid
    values are reported per field and then nothing is written. The other fields are
    written atomically. `expected=None` skips the conflict check (the CLI's `set`).
    """
    from gguf_trainer.store import project

    paths = _paths(root)
    live = _live_run(paths)
    base = expected.values if isinstance(expected, SettingsRead) else expected
    if isinstance(base, dict) and isinstance(base.get("values"), dict) and "version" in base:
        base = base["values"]  # a SettingsRead that travelled as JSON (gradio_client)
    out = project.compare_and_set(paths, changes, base, live_run=live)
    return UpdateResult(**out)


def set_steps(root: PathLike, steps: Any, wait_s: float = 0.0) -> StepsResult:
    """Set `train.steps` (also while running: the trainer re-reads it every `log_every`
    steps). `steps` may be text ("12_000", "40k"). With wait_s > 0 and a live training
    stage, waits up to wait_s for the run to report the new count (`picked_up`)."""
    from gguf_trainer.store import project, project_schema

    paths = _paths(root)
    value = project_schema.parse_steps(steps)
    project.update_settings(paths.root, {"train.steps": value})
    info = status(paths.root)
    live = supervisor.is_active(info)
    picked = live and _wait_steps_seen(paths, value, wait_s)
    log_every = project.load_project(paths.root).settings.train.log_every
    if live and info.get("stage") not in stages_from(TRAINING)[1:]:  # not past training yet
        hint = (
            "the running pipeline picked it up"
            if picked
            else f"the running pipeline picks it up within {log_every} steps (log_every)"
        )
    elif live:
        hint = "training has already ended in this run; start again to train further"
    else:
        hint = f"`gguf-trainer start --project {paths.root}` continues from the last checkpoint"
    return StepsResult(
        steps=value, live=live, picked_up=picked, message=f"train.steps = {value}; {hint}"
    )


def field_metadata(pack_id: str | None = None) -> list[dict]:
    """Per-field GUI metadata for every setting, the pack's declarations over the schema's:
    [{"key": "train.lr", "section": "Training", "label": "Learning rate", "help": ...,
      "type": "float"|"int"|"bool"|"str"|"path"|"choice"|"list", "default": ...,
      "min": ..., "max": ..., "choices": [...], "live": bool (may change while running),
      "advanced": bool}], in display order. `pack_id` None: the schema's alone."""
    from gguf_trainer.store import schema_fields

    return schema_fields.field_metadata(pack_id)


def settings_table_markdown() -> str:
    """The README's table of every project.json key (generated from the schema)."""
    from gguf_trainer.store import schema_fields

    return schema_fields.settings_table_markdown()
