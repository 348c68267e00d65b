"""The project folder: reading and writing `project.json`, naming, output paths.

A project is one directory holding everything a run needs and makes (see paths.py for
the file names). This module loads and creates projects, writes their settings (the
schema is project_schema.py) and turns settings into file names; it refuses a run whose
GGUF another project would write. It never writes `state.json` (the pipeline does) and
imports no torch.

Every write of project.json (the CLI's `set`, the GUI's save, the pipeline pinning its
threads) goes through `update_settings`/`compare_and_set`, under the project's settings
lock, so two writers never lose each other's fields.

    proj = create_project(root / "llada_adapter", "llada_image")
    proj = load_project(root / "llada_adapter")
    proj.final_gguf        # <output_dir>/pig_llada_adapter-f16.gguf
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gguf_trainer.base import atomic, locks, places, project_file
from gguf_trainer.base.errors import QUOTE_MAX_CHARS, NoProjectError, UserError, quote
from gguf_trainer.base.paths import COMPANION_KINDS, PROJECT_JSON, ProjectPaths
from gguf_trainer.base.safe_delete import ExportPlaces, check_replace
from gguf_trainer.store.project_schema import ProjectSettings, default_name, get_dotted, parse_steps
from gguf_trainer.store.schema_errors import field_errors, validate_settings
from gguf_trainer.store.schema_fields import is_live_key, known_key, schema_fields, set_dotted

SETTINGS_LOCK = "settings.lock"  # flock taken by every project.json writer
SETTINGS_LOCK_WAIT_S = 10.0
MAX_PROJECT_JSON_BYTES = 1 << 20


# ---- the project object ----------------------------------------------------------------
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
        """The project's pack as its settings configure it (e.g. PixArt's T5 window)."""
        from gguf_trainer.packs import get_pack

        return get_pack(self.settings.pack).configured(self.settings)

    @property
    def output_dir(self) -> Path:
        out = self.settings.export.output_dir
        if not out:
            return self.dir.parent
        p = Path(out).expanduser()
        return (p if p.is_absolute() else self.dir / p).resolve()

    @property
    def base_name(self) -> str:
        """The name minus a trailing `_adapter`, for companion files
        (`pig_llada_sigvq-f16.gguf`)."""
        return self.settings.name.removesuffix("_adapter")

    @property
    def final_gguf(self) -> Path:
        """<name>-<export.dtype>.gguf: the file name carries the weight type."""
        return self.output_dir / f"{self.settings.name}-{self.settings.export.dtype}.gguf"

    def snapshot_gguf(self, step: int) -> Path:
        dtype = self.settings.export.dtype
        return self.output_dir / f"{self.settings.name}-step{step}-{dtype}.gguf"

    def companion_gguf(self, kind: str) -> Path:
        return self.output_dir / f"{self.base_name}_{kind}-f16.gguf"

    def export_places(self):
        """Where and under which names this project writes its exports now (the project
        folder, export.output_dir, export.copy_to): the only files its records may make the
        tool delete or overwrite (safe_delete.ExportPlaces)."""
        folders = [self.dir, self.output_dir]
        if self.settings.export.copy_to:
            folders.append(Path(self.settings.export.copy_to).expanduser())
        return ExportPlaces(tuple(str(f) for f in folders), self.settings.name,
                            tuple(self.companion_gguf(k).name for k in COMPANION_KINDS))

    def material_path(self, material_id: str) -> Path | None:
        ref = self.settings.materials.get(material_id)
        if ref and ref.path:
            p = Path(ref.path).expanduser()
            return p if p.is_absolute() else (self.dir / p)
        return None


# ---- reading and writing project.json --------------------------------------------------
def read_raw_versioned(paths: ProjectPaths) -> tuple[Any, str]:
    """(parsed project.json, version token of its bytes). NoProjectError if absent; a
    UserError with the fix for a folder, unreadable, oversized, non-UTF-8 or non-JSON file."""
    pj = paths.project_json
    if pj.is_dir():
        raise UserError(f"{pj} is a folder, not a file; remove it and recreate the project "
                        "(gguf-trainer new --pack ID DIR).")
    if not paths.exists():
        raise NoProjectError(f"{paths.root} is not a project (no project.json); create one with "
                             "`gguf-trainer new --pack ID DIR` or check the path.")
    try:
        # open_project returns these bytes: a project.json linked out of the folder is refused
        data = project_file.read_bytes(paths.root, pj, MAX_PROJECT_JSON_BYTES)
    except OSError as e:
        raise UserError(f"cannot read {pj} ({e.strerror}); check its permissions.") from None
    version = hashlib.sha256(data).hexdigest()[:16]
    if len(data) > MAX_PROJECT_JSON_BYTES:
        raise UserError(f"{pj} is over 1 MiB, far more than settings take; fix or recreate it.")
    # not UTF-8, not JSON, an integer Python will not parse, nesting that would recurse later
    return atomic.parse_json(data, pj, fix="fix or recreate it"), version


def read_raw(paths: ProjectPaths) -> Any:
    return read_raw_versioned(paths)[0]


def load_project(root: str | os.PathLike) -> Project:
    paths = ProjectPaths(Path(root))
    raw = read_settings_raw(paths)
    return Project(paths, validate_settings(raw, str(paths.project_json)))


def read_settings_raw(paths: ProjectPaths) -> Any:
    """project.json with its in-project paths made absolute (places.py): what every reader
    and client sees; a moved project's paths are where it is now."""
    return read_settings_versioned(paths)[0]


def read_settings_versioned(paths: ProjectPaths) -> tuple[Any, str]:
    raw, version = read_raw_versioned(paths)
    return places.from_stored_settings(raw, paths.root), version


def _stored_text(paths: ProjectPaths, settings: ProjectSettings) -> str:
    """project.json's text: in-project paths relative to the folder (an older project's
    absolute ones become relative at its first write)."""
    data = places.to_stored_settings(settings.model_dump(mode="json"), paths.root)
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"


def _check_folder(root: Path) -> None:
    if root.exists() and not root.is_dir():
        raise UserError(f"{root} is a file, not a folder; choose a folder for the project.")
    for parent in root.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"{parent} is a file, so {root} cannot be created; choose "
                                "another folder.")
            break


def create_project(root: str | os.PathLike, pack_id: str, name: str | None = None,
                   overrides: dict[str, Any] | None = None) -> Project:
    """Write a new project.json: schema defaults, then the pack's defaults, then `overrides`
    (dotted keys, e.g. {"train.steps": 40}). Refuses to overwrite an existing project;
    everything is validated before the folder is created."""
    from gguf_trainer.packs import get_pack

    paths = ProjectPaths(Path(root))
    _check_folder(paths.root)
    if paths.project_json.exists():
        raise UserError(f"{paths.root} already holds a project; open it instead or pick another "
                        "folder.")
    pack = get_pack(pack_id)
    data: dict = {"pack": pack_id, "name": default_name(pack.default_name, name)}
    for dotted, value in {**pack.all_defaults, **(overrides or {})}.items():
        set_dotted(data, dotted, value)
    settings = validate_settings(data, "the new project's settings")
    try:
        paths.root.mkdir(parents=True, exist_ok=True)
        atomic.write_text(paths.project_json, _stored_text(paths, settings))
    except OSError as e:
        raise UserError(f"cannot create {paths.project_json} ({e.strerror}); choose a folder you "
                        "can write to.") from None
    return Project(paths, settings)


class _SettingsLock:
    """flock on the project's settings lock file for one read-modify-write of project.json."""

    def __init__(self, paths: ProjectPaths):
        self.file = paths.root / SETTINGS_LOCK
        self._cm = None

    def __enter__(self):
        self._cm = locks.hold_file(self.file, "project.json is being saved by another process",
                                  retry_s=SETTINGS_LOCK_WAIT_S)
        return self._cm.__enter__()  # locks.hold_file turns OS refusals into DiskError

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


def compare_and_set(paths: ProjectPaths, changes: dict[str, Any], expected: dict | None,
                    live_run: dict | None = None) -> dict:
    """The compare-and-set write behind control.update_settings (see its docstring).
    Returns {applied, conflicts, refused, errors, version}."""
    out: dict = {"applied": {}, "conflicts": {}, "refused": {}, "errors": {}, "version": None}
    if not isinstance(changes, dict):
        raise UserError("settings changes must be a mapping of dotted keys to values.")
    for key in changes:
        if not isinstance(key, str) or not known_key(key):
            near = difflib.get_close_matches(str(key), [f["key"] for f in schema_fields()], n=1)
            shown = key if isinstance(key, str) and len(key) <= QUOTE_MAX_CHARS else quote(key)
            out["errors"][shown] = (f"{shown} is not a setting" +
                                       (f" (did you mean {near[0]}?)" if near else "") +
                                       "; see the README's settings table")
    if out["errors"]:
        return out
    with _SettingsLock(paths):
        raw, version = read_settings_versioned(paths)
        if not isinstance(raw, dict):
            raise UserError(f"{paths.project_json} does not hold a JSON object; fix or recreate "
                            "it.")
        try:
            disk = ProjectSettings.model_validate(raw).model_dump(mode="json")
        except (ValidationError, RecursionError):
            disk = raw
        todo = {}
        for key, value in changes.items():
            now = get_dotted(disk, key)
            if expected is not None:
                seen = get_dotted(expected, key)
                if seen != now and now != value:
                    out["conflicts"][key] = {"read": _echo(seen), "disk": _echo(now),
                                             "yours": _echo(value)}
                    continue
            if now == value:
                continue
            if live_run is not None and not is_live_key(key):
                out["refused"][key] = (
                    f"the pipeline is running (pid {live_run.get('pid')}) and this setting is an "
                    "input of its outputs (changing it would invalidate them); stop the run first")
                continue
            todo[key] = value
        if not todo:
            out["version"] = version
            return out
        new = copy.deepcopy(raw)
        for key, value in todo.items():
            set_dotted(new, key, value)
        try:
            settings = ProjectSettings.model_validate(new)
        except ValidationError as e:
            errs = field_errors(e)
            out["errors"] = {k: v for k, v in errs.items()}
            return out
        text = _stored_text(paths, settings)
        if len(text.encode()) > MAX_PROJECT_JSON_BYTES:  # it could never be read back
            out["errors"] = {k: f"{k}: a value of {len(json.dumps(v))} characters would make "
                             "project.json larger than 1 MiB; give a shorter value"
                             for k, v in todo.items() if len(json.dumps(v)) > 4096} or {
                "(top level)": "project.json would grow over 1 MiB; give shorter values"}
            return out
        try:
            atomic.write_text(paths.project_json, text)
        except OSError as e:
            raise UserError(f"cannot save {paths.project_json} ({e.strerror}); nothing was "
                            "changed.") from None
        out["applied"] = todo
        out["version"] = hashlib.sha256(text.encode()).hexdigest()[:16]
        return out


def _echo(value: Any) -> Any:
    """A value as a conflict shows it: itself when short, else its first 80 characters
    (errors.quote), so a 3 MB value sent in is not sent back."""
    return value if len(repr(value)) <= QUOTE_MAX_CHARS else quote(value)


def update_settings(root: str | os.PathLike, changes: dict[str, Any]) -> Project:
    """Apply dotted-key changes to project.json atomically under the settings lock
    (validated first; nothing is written when a value is bad: UserError listing every
    bad field). For the pipeline and the CLI; clients with a form use compare_and_set."""
    paths = ProjectPaths(Path(root))
    res = compare_and_set(paths, changes, None)
    if res["errors"]:
        lines = [f"  {v}" for v in res["errors"].values()]
        n = len(lines)
        head = (f"{paths.project_json}: {n} bad setting{'s' if n > 1 else ''}; "
                "nothing was changed:")
        raise UserError("\n".join([head, *lines]))
    return load_project(paths.root)


def set_steps(root: str | os.PathLike, steps: Any) -> int:
    steps = parse_steps(steps)
    update_settings(root, {"train.steps": steps})
    return steps


def read_steps(paths: ProjectPaths) -> int | None:
    """`train.steps` as it is on disk now, or None when project.json is mid-edit or broken
    (the trainer then keeps the count it has)."""
    try:
        data = json.loads(paths.project_json.read_text(encoding="utf-8"))
        return parse_steps(data["train"]["steps"])
    except (OSError, ValueError, KeyError, TypeError, UserError, RecursionError):
        return None


# ---- checks before a run, and where its results are -------------------------------------
def check_name_clash(project: Project) -> None:
    """Refuse when another project would write the same GGUF: a sibling project folder
    with the same name and output folder, or a final GGUF already there that this project
    did not record writing. One sentence with the fix."""
    out, name = project.output_dir, project.settings.name
    parent = project.dir.parent
    try:
        siblings = [p for p in parent.iterdir() if p != project.dir and p.is_dir()]
    except OSError:
        siblings = []
    for other in siblings:
        pj = other / PROJECT_JSON
        try:
            if not pj.is_file():
                continue
            theirs = load_project(other)
        except (UserError, OSError):
            continue
        if theirs.settings.name == name and theirs.output_dir == out:
            raise UserError(f"{other} is another project named {name!r} writing to {out}: both "
                            f"would write {project.final_gguf.name}; give this one another "
                            f"\"name\" in {project.paths.project_json} or another "
                            "export.output_dir.")
    final = project.final_gguf
    if final.exists() or final.is_symlink():
        recorded = _recorded_exports(project.dir)
        if not any(k in recorded for k in (str(final.resolve()), str(final))):
            raise UserError(f"{final} already exists and this project did not write it (another "
                            "project with the same name?); give this project another \"name\" or "
                            "export.output_dir, or move that file away.")
        refuse_anothers_file(project, final)


def refuse_anothers_file(project: Project, path: Path) -> None:
    """UserError when the export about to be written at `path` (the final GGUF, a snapshot,
    export.copy_to's copy) is a file another project wrote and still records: this project
    is a copy of it (written_by_another), and writing would overwrite the original's GGUF."""
    recorded = _recorded_exports(project.dir)
    key = next((k for k in (str(Path(path).resolve()), str(path)) if k in recorded), None)
    writer = written_by_another(Path(path), project.dir, recorded[key]) if key else None
    if writer is not None:
        raise UserError(f"{path} was written by the project {writer}, which still records it "
                        "(this one is a copy of it?); give this project another \"name\" or "
                        "export.output_dir so the original's GGUF is not overwritten.")


def refuse_overwrite(project: Project, path: Path) -> None:
    """UserError, one sentence naming the file and the fix, unless an export may be written
    at `path`: nothing is there, or the file there is the one this project recorded writing,
    where and as it writes exports (safe_delete.check_replace). Never overwrites a user's
    file under the project's names, nor another project's in a shared output folder."""
    refuse_anothers_file(project, path)
    recorded = _recorded_exports(project.dir)
    key = next((k for k in (os.path.realpath(path), str(path)) if k in recorded), None)
    why = check_replace(path, recorded[key] if key else None, project.settings.name,
                        project.export_places())
    if why:
        raise UserError(f"{path} {why.split('; ')[0]}, so no export is written over it; give this "
                        "project another \"name\" or export.output_dir, or move that file away.")


def _recorded_exports(root: Path) -> dict:
    try:
        man = atomic.read_json(ProjectPaths(root).exports_json, {}, inside=root) or {}
    except (ValueError, OSError):
        return {}
    files = man.get("files") if isinstance(man, dict) else None
    # keys are relative to the project's parent (places.py) or absolute (older versions)
    return {str(places.recorded_path(k, Path(root).resolve())): v
            for k, v in files.items()} if isinstance(files, dict) else {}


def written_by_another(path: Path, root: Path, record: dict | None) -> Path | None:
    """The project that wrote the recorded export `path`, when that is another project than
    `root` and it still records the file: a copied project (`cp -a`) carries the original's
    records, and with an output folder outside both (an absolute export.output_dir,
    export.copy_to) they name the original's very file, which the copy must neither delete
    nor overwrite. Such a record (an absolute one) keeps its writer's real path
    (outputs.record_export); a moved project's writer is gone (or no longer records the file),
    so a move is not a copy."""
    writer = record.get("project") if isinstance(record, dict) else None
    if not isinstance(writer, str) or not writer or not os.path.isabs(writer):
        return None  # an older record: reset's sibling search is all there is
    if os.path.realpath(writer) == os.path.realpath(root):
        return None
    theirs = _recorded_exports(Path(writer)) if ProjectPaths(Path(writer)).exists() else {}
    mine = {str(path), os.path.realpath(path)}
    return Path(writer) if mine & set(theirs) else None
