"""Where a project's recorded paths are stored relative, so that a moved, renamed or copied
project folder runs on where it is.

Relative inside, absolute outside: a path inside the project folder (materials, corpus
files, an output folder inside it, as the demo's) is stored relative to the folder; a
recorded export (exports.json, snapshots.json) inside the project or beside it (under the
project's parent, where the default output folder is) is stored relative to the project
folder (`../pig_t5_adapter-f16.gguf`), so a renamed folder still names it; every other path
stays absolute. In memory, and everywhere a client reads or
writes settings, paths are absolute: only the files hold the relative form. An absolute
path written by an older version is read as it is and stored relative on the next write.
Must not: read or write any file (pure path arithmetic, no symlink resolution: a project
reached through a link keeps its own spelling).

    stored = to_stored_settings(settings_dict, root)    # before project.json is written
    settings_dict = from_stored_settings(raw, root)     # as project.json is read
    key = record_key(path, root); path = recorded_path(key, root)
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path

# The settings that name places inside a project (dotted; "*" = every material).
LIST_KEYS = (("corpus", "files"), ("corpus", "image_folders"))
TEXT_KEYS = (("corpus", "train_file"), ("corpus", "val_file"))
# "" is the default output folder, beside the project; one inside it (the demo's) is relative
# to the folder, as Project.output_dir reads a relative value.
OUTPUT_KEYS = (("export", "output_dir"),)


def _absolute(base: Path) -> Path:
    return Path(os.path.abspath(Path(base).expanduser()))


def to_relative(path: str, base: Path) -> str:
    """`path` relative to `base` when it lies inside it (posix form), else unchanged."""
    if not isinstance(path, str) or not path or path.startswith("~"):
        return path
    p = Path(path)
    if not p.is_absolute():
        return path
    p = Path(os.path.abspath(p))
    # the folder as spelled, or its real path (a resolved download path under a linked root)
    for folder in (_absolute(base), Path(os.path.realpath(base))):
        if p != folder and folder in p.parents:
            return p.relative_to(folder).as_posix()
    return path


def to_absolute(path: str, base: Path) -> str:
    """A stored path as an absolute one: relative ones are taken from `base`."""
    if not isinstance(path, str) or not path or path.startswith("~") or Path(path).is_absolute():
        return path
    return os.path.abspath(os.path.join(_absolute(base), path))


def _map_settings(data, fn: Callable[[str], str]):
    """A copy of a settings dict with `fn` applied to every in-project path setting. Values
    of the wrong type are left for validation to name."""
    if not isinstance(data, dict):
        return data
    out = copy.deepcopy(data)
    materials = out.get("materials")
    if isinstance(materials, dict):
        for ref in materials.values():
            if isinstance(ref, dict) and isinstance(ref.get("path"), str):
                ref["path"] = fn(ref["path"])
    for section, key in LIST_KEYS + TEXT_KEYS + OUTPUT_KEYS:
        node = out.get(section)
        if not isinstance(node, dict) or key not in node:
            continue
        value = node[key]
        if isinstance(value, list):
            node[key] = [fn(v) if isinstance(v, str) else v for v in value]
        elif isinstance(value, str):
            node[key] = fn(value)
    return out


def to_stored_settings(data, root: Path):
    """Settings as project.json stores them: in-project paths relative to `root`."""
    return _map_settings(data, lambda p: to_relative(p, root))


def from_stored_settings(data, root: Path):
    """Settings as read from project.json, with every stored relative path absolute."""
    return _map_settings(data, lambda p: to_absolute(p, root))


def record_key(path: Path | str, root: Path) -> str:
    """How exports.json / snapshots.json record an export of the project at `root`: relative
    to the project folder when it lies inside it or beside it (under its parent: `../x.gguf`),
    else absolute."""
    path, root = str(path), _absolute(root)
    if to_relative(path, root.parent) == path:  # outside the parent (or already relative)
        return path
    return Path(os.path.relpath(os.path.abspath(path), root)).as_posix()


def recorded_path(key: str, root: Path) -> Path:
    """The file a recorded export names, for the project at `root`."""
    return Path(to_absolute(key, root))
