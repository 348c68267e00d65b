"""Delete only what the tool wrote: the one rule every delete in the package goes through.

A hand-edited or copied record (exports.json, snapshots.json) must never make the tool
delete a stranger's file or folder. So:

* a RECORDED file (an export, a snapshot GGUF: outside the project, named by a record) is
  deleted or overwritten only if it lies where the project writes its exports, under a name
  it writes (`ExportPlaces`: directly in the project folder, its current export.output_dir or
  export.copy_to, compared by real path, named `<name>[-step<N>]-<dtype>.gguf` or a
  companion's name): a record is not proof of ownership, so `../victim/model.gguf` or
  `/home/u/notes.txt` in exports.json is never touched whatever size and hash it records.
  There, it must be a regular file (not a folder, not a symlink) whose size and sha256 equal
  what was recorded when it was written (`file_record`); for an old record without them,
  only if its GGUF metadata names this project (`general.name`);
* an OWNED path (data/, shards/, checkpoints/, checkpoints.stale-*, a project file) is
  deleted only if it lies inside the folder that owns it (the project), is not a symlink,
  and is the kind expected (folder or file); a folder whose files the tool names
  (paths.TOOL_FILES) only if it holds nothing else, so a project made in someone's folder
  never takes their data/ or checkpoints/ with it. Folders are removed with `shutil.rmtree`,
  which never follows a symlink inside them on Linux (fd-based), so a link to /home in
  shards/ removes the link, not /home.

A stage redone because its inputs changed (Stage.clear) follows the same rule through
`empty_owned`: it deletes the tool's files in the folder and keeps the folder with someone
else's file in it, named in the log.

Anything else is left alone and reported with the reason. `check_*` functions say what a
delete WOULD do (the reset dry-run uses them, so the plan equals what is deleted);
`remove_*` do it and return the same verdict.

    verdict = remove_recorded_file(path, record, project_name="pig_t5_adapter")
    verdict.deleted, verdict.reason
    remove_owned(paths.shards, inside=paths.root)
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from gguf_trainer.base.errors import UserError

CHUNK = 1 << 20
DAMAGED_SHARD = "a damaged shard cannot be deleted and recomputed there"  # unlink_owned's `what`


@dataclass
class Verdict:
    """What happened to one path: deleted, or left alone with the reason."""

    path: str
    deleted: bool
    reason: str | None = None  # None when deleted (or when absent: `absent` True)
    absent: bool = False
    foreign: str | None = None  # empty_owned: the file not the tool's that kept the folder

    def as_dict(self) -> dict:
        return {"path": self.path, "deleted": self.deleted, "reason": self.reason,
                "absent": self.absent}


# The tensor types an export is written in: `<name>[-step<N>]-<dtype>.gguf`.
EXPORT_DTYPES = ("f16", "bf16", "f32", "q8_0")


@dataclass(frozen=True)
class ExportPlaces:
    """Where a project writes its exports, and under which names: the only files a record
    (exports.json, snapshots.json) can make the tool delete or overwrite. `folders` are the
    project folder, export.output_dir and export.copy_to (as configured now); `name` the
    project's name; `companions` the exact file names of the companion GGUFs it may write
    (LLaDA's `<base>_sigvq-f16.gguf`). Built by store.project.Project.export_places."""

    folders: tuple[str, ...]
    name: str
    companions: tuple[str, ...] = ()

    def is_export_name(self, file_name: str) -> bool:
        dtypes = "|".join(EXPORT_DTYPES)
        pattern = rf"{re.escape(self.name)}(-step[0-9]+)?-({dtypes})\.gguf"
        return file_name in self.companions or re.fullmatch(pattern, file_name) is not None

    def why_not(self, path: str | os.PathLike) -> str | None:
        """None when `path` is a place and name this project writes an export; else why not."""
        path = Path(path)
        if not self.is_export_name(path.name):
            return (f"is not named as this project's exports are ({self.name}[-stepN]-<dtype>.gguf "
                    "or a companion); the record is ignored and the file left alone")
        try:
            parent = os.path.realpath(path.parent)
        except (OSError, RuntimeError):  # a link loop on the way: not a place we write
            parent = None
        if parent is None or parent not in {os.path.realpath(f) for f in self.folders}:
            return ("is not in this project's folder, export.output_dir or export.copy_to; "
                    "the record is ignored and the file left alone")
        return None


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_record(path: str | os.PathLike) -> dict:
    """{"size", "sha256"} of a file just written: store it with the path in the record
    (exports.json, snapshots.json) so a later delete can prove the file is still ours."""
    return {"size": os.stat(path).st_size, "sha256": sha256_file(path)}


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _gguf_names(path: Path) -> str | None:
    """general.name of a GGUF, read with bounds; None if unreadable."""
    from gguf_trainer.base.gguf_read import read_gguf  # bounded, and fast on a vocabulary

    try:
        field = read_gguf(path).fields.get("general.name")
    except Exception:  # noqa: BLE001 - anything unreadable is simply "not ours"
        return None
    value = None if field is None else field.contents()
    return value if isinstance(value, str) else None


def check_recorded_file(path: str | os.PathLike, record: dict | None,
                        project_name: str | None, places: ExportPlaces) -> str | None:
    """None if `path` may be deleted (or overwritten) as the file `record` describes; else
    the reason. An absent path returns None too (nothing to do; `remove_recorded_file` says
    absent), unless it is not a place the project writes (`places`)."""
    path = Path(path)
    where = places.why_not(path)
    if where:
        return where
    st = _lstat(path)
    if st is None:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink, not the file the tool wrote; left alone"
    if stat.S_ISDIR(st.st_mode):
        return "is a folder, not the file the tool wrote; left alone"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file; left alone"
    record = record if isinstance(record, dict) else {}
    size, digest = record.get("size"), record.get("sha256")
    if isinstance(size, int) and isinstance(digest, str):
        if st.st_size != size:
            return (f"its size changed since the tool wrote it ({size} bytes recorded, "
                    f"{st.st_size} now); left alone")
        try:
            if sha256_file(path) != digest:
                return "its content changed since the tool wrote it (sha256 differs); left alone"
        except OSError as e:
            return f"cannot be read ({e.strerror}); left alone"
        return None
    if project_name and _gguf_names(path) == project_name:
        return None
    return "no size and hash were recorded and its metadata does not name this project; left alone"


def check_replace(path: str | os.PathLike, record: dict | None, project_name: str | None,
                  places: ExportPlaces) -> str | None:
    """None if an export may be written at `path`: nothing is there, or the file there is the
    one this project recorded writing (`record`, its entry in exports.json or snapshots.json)
    by the same rule as a delete; else why not. A user's file under the project's names, or
    another project's snapshot in a shared output folder, is never overwritten."""
    if _lstat(Path(path)) is None:
        return places.why_not(path)
    if not isinstance(record, dict):
        return "already exists and this project did not write it (it records no such file)"
    return check_recorded_file(path, record, project_name, places)


def _inside(path: Path, folder: Path) -> bool:
    try:
        parent = path.parent.resolve()
        base = Path(folder).resolve()
    except OSError:
        return False
    return parent == base or base in parent.parents


def foreign_file(folder: Path, tool_files: tuple[str, ...]) -> str | None:
    """The first path under `folder` (relative) that is not one the tool writes there
    (`tool_files`: globs, one per depth, see paths.TOOL_FILES); None when all are. A link
    counts as foreign: the tool never makes one."""
    for dirpath, dirnames, filenames in os.walk(folder):
        base = Path(dirpath)
        for name in sorted(filenames) + sorted(d for d in dirnames if (base / d).is_symlink()):
            rel = (base / name).relative_to(folder).as_posix()
            if (base / name).is_symlink() or not _is_tool_name(rel, tool_files):
                return rel
    return None


def _is_tool_name(rel: str, tool_files: tuple[str, ...]) -> bool:
    name = rel.rsplit("/", 1)[-1]
    if name.startswith(".") and name.endswith(".tmp"):  # atomic's tmp file, left by a kill
        return True
    depth = rel.count("/")
    return any(g.count("/") == depth and fnmatch.fnmatchcase(rel, g) for g in tool_files)


def check_owned(path: str | os.PathLike, inside: str | os.PathLike,
                kind: str | None = None, tool_files: tuple[str, ...] | None = None) -> str | None:
    """None if `path` (a folder or file the tool makes inside `inside`) may be deleted;
    else the reason. `kind` "dir" or "file" also requires that kind. `tool_files`: a folder
    is deleted only when everything in it is a file the tool writes there."""
    path = Path(path)
    st = _lstat(path)
    if st is None:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink; the tool never deletes through one; left alone"
    if not _inside(path, Path(inside)):
        return f"is not inside {inside}; left alone"
    is_dir = stat.S_ISDIR(st.st_mode)
    if kind == "dir" and not is_dir:
        return "is not a folder (the tool makes a folder there); left alone"
    if kind == "file" and not stat.S_ISREG(st.st_mode):
        return "is not a regular file (the tool writes a file there); left alone"
    if not is_dir and not stat.S_ISREG(st.st_mode):
        return "is not a regular file or folder; left alone"
    if is_dir and tool_files is not None:
        foreign = foreign_file(path, tool_files)
        if foreign is not None:
            return (f"holds {foreign}, which gguf-trainer did not write; left alone (move your "
                    "files out of it, then reset again)")
    return None


def remove_recorded_file(path: str | os.PathLike, record: dict | None,
                         project_name: str | None, places: ExportPlaces) -> Verdict:
    path = Path(path)
    if _lstat(path) is None:
        return Verdict(str(path), False, None, absent=True)
    reason = check_recorded_file(path, record, project_name, places)
    if reason:
        return Verdict(str(path), False, reason)
    try:
        path.unlink()
    except OSError as e:
        return Verdict(str(path), False, f"cannot be deleted ({e.strerror}); left alone")
    return Verdict(str(path), True)


def remove_owned(path: str | os.PathLike, inside: str | os.PathLike,
                 kind: str | None = None, tool_files: tuple[str, ...] | None = None) -> Verdict:
    path = Path(path)
    st = _lstat(path)
    if st is None:
        return Verdict(str(path), False, None, absent=True)
    reason = check_owned(path, inside, kind, tool_files)
    if reason:
        return Verdict(str(path), False, reason)
    try:
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError as e:
        return Verdict(str(path), False, f"cannot be deleted ({e.strerror}); left alone")
    return Verdict(str(path), True)


def unlink_owned(path: str | os.PathLike, inside: str | os.PathLike, what: str) -> bool:
    """Delete one file the tool wrote inside `inside` (a damaged shard, a killed run's
    partial file) by the rule above: True when deleted, False when already absent, else
    UserError "<path> <reason>, so <what>; move it away and start again." (a linked folder on
    the way out of the project, a link, not a regular file)."""
    verdict = remove_owned(path, inside, "file")
    if verdict.reason:
        raise UserError(f"{path} {verdict.reason.removesuffix('; left alone')}, so {what}; "
                        "move it away and start again.")
    return verdict.deleted


def tool_paths(folder: Path, tool_files: tuple[str, ...]) -> list[Path]:
    """The regular files under `folder` the tool writes there (never a link), deepest first."""
    out = []
    for dirpath, _dirnames, filenames in os.walk(folder):  # never descends a linked folder
        base = Path(dirpath)
        for name in filenames:
            p = base / name
            if (not p.is_symlink() and p.is_file()
                    and _is_tool_name(p.relative_to(folder).as_posix(), tool_files)):
                out.append(p)
    return sorted(out, key=lambda p: -len(p.parts))


def empty_owned(path: str | os.PathLike, inside: str | os.PathLike,
                tool_files: tuple[str, ...]) -> Verdict:
    """A stage folder about to be refilled (its inputs changed): removed like `remove_owned`
    when it holds only the tool's files. When it holds someone else's file too, only the
    tool's own files in it are deleted and the folder stays with theirs (Verdict.foreign
    names the first). A link, a path outside `inside` or not a folder: nothing is touched,
    Verdict.reason says why."""
    path = Path(path)
    if _lstat(path) is None:
        return Verdict(str(path), False, None, absent=True)
    reason = check_owned(path, inside, "dir")
    if reason:
        return Verdict(str(path), False, reason)
    foreign = foreign_file(path, tool_files)
    if foreign is None:
        return remove_owned(path, inside, "dir", tool_files)
    for p in tool_paths(path, tool_files):
        try:
            p.unlink()
        except OSError as e:
            return Verdict(str(path), False, f"holds {p.relative_to(path)}, which cannot be "
                           f"deleted ({e.strerror}); left alone", foreign=foreign)
    return Verdict(str(path), False, None, foreign=foreign)
