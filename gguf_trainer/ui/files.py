"""The GUI's file browser, confined to roots: nothing is uploaded, everything is a path.

Roots are the open project's folder and its parent, $HOME, `GGUF_TRAINER_MATERIALS`,
every `--root DIR` and the extra roots the user keeps in ~/.gguf-trainer/settings.json
(`browse_roots`). A folder is listed only when its real path (symlinks resolved) lies
inside a root's real path and outside the blocked places (SSH keys, the Hugging Face
token store); entries that resolve outside the roots (symlinks) are not shown. Typed
paths are accepted by the settings form anyway: confinement is about what the browser
reveals to whoever can reach the app, not about what the owner may type.

    roots = browse_roots(project_dir, cli_roots)
    listing = list_dir("/home/me/models", roots)    # UserError outside the roots
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from gguf_trainer.base import atomic
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import PROJECT_JSON
from gguf_trainer.runner import supervisor

SETTINGS_KEY = "browse_roots"
MAX_ENTRIES = 2000  # a folder with 100k files is cut, not sent whole


def _real(p: str | os.PathLike) -> Path:
    return Path(os.path.realpath(Path(p).expanduser()))


def blocked_paths() -> list[str]:
    """Never served: SSH keys and the Hugging Face token store."""
    home = Path.home()
    out = [home / ".ssh"]
    try:
        from huggingface_hub import constants

        out += [Path(constants.HF_TOKEN_PATH), Path(constants.HF_STORED_TOKENS_PATH)]
    except (ImportError, AttributeError):
        out += [home / ".cache" / "huggingface" / "token"]
    return [str(p) for p in out]


def blocked_real_paths() -> list[Path]:
    return [_real(p) for p in blocked_paths()]


_launch_roots: list[str] = []


def set_launch_roots(roots: list[str] | None) -> None:
    """The --root folders this GUI was launched with (app.build_app sets them)."""
    _launch_roots[:] = [str(r) for r in roots or []]


def launch_roots() -> list[str]:
    """The --root folders this GUI was launched with (configuration, not job state)."""
    return list(_launch_roots)


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def saved_roots() -> list[str]:
    roots = supervisor.read_settings().get(SETTINGS_KEY) or []
    return [str(r) for r in roots if isinstance(r, str)]


def save_roots(roots: list[str]) -> list[str]:
    """Keep the user's extra roots (existing absolute folders only) in the user settings."""
    clean: list[str] = []
    for raw in roots:
        text = raw.strip()
        if not text:
            continue
        p = Path(text).expanduser()
        if not p.is_absolute():
            raise UserError(f"browse root {text!r} must be an absolute folder path")
        if not p.is_dir():
            raise UserError(f"browse root {text} is not a folder")
        if any(_inside(_real(p), b) or _inside(b, _real(p)) for b in blocked_real_paths()):
            raise UserError(f"browse root {text} holds or is inside a blocked folder "
                            "(SSH keys, the Hugging Face token); pick another")
        if str(p) not in clean:
            clean.append(str(p))
    settings = supervisor.read_settings()
    settings[SETTINGS_KEY] = clean
    atomic.write_json(supervisor.settings_path(), settings)
    return clean


def browse_roots(project_dir: str | None, cli_roots: list[str] | None = None) -> list[str]:
    """Every root, in display order, existing folders only, without duplicates."""
    cands: list[Path] = []
    if project_dir:
        p = Path(project_dir).expanduser()
        cands += [p, p.parent]
    cands.append(Path.home())
    chosen: list[Path] = []  # roots a setting names: Browse roots' rule (not `/`, no ~/.ssh)
    if os.environ.get("GGUF_TRAINER_MATERIALS"):
        chosen.append(Path(os.environ["GGUF_TRAINER_MATERIALS"]))
    chosen += [Path(r) for r in (cli_roots or [])]
    chosen += [Path(r) for r in saved_roots()]
    blocked = blocked_real_paths()
    out: list[str] = []
    for c in cands + chosen:
        c = c.expanduser()
        if not c.is_absolute() or not c.is_dir():
            continue
        real = _real(c)
        if any(_inside(real, b) for b in blocked) or str(real) in out:
            continue
        if c in chosen and any(_inside(b, real) for b in blocked):
            continue  # `/` or a folder holding ~/.ssh: refused as Browse roots refuses it
        out.append(str(real))
    return out


def confine(path: str, roots: list[str]) -> Path:
    """The real path of `path` if it may be shown, else a UserError (one sentence)."""
    if not path or not str(path).strip():
        raise UserError("give a folder path")
    p = Path(str(path).strip()).expanduser()
    if not p.is_absolute():
        raise UserError(f"{path!r} is not an absolute path")
    real = _real(p)
    if any(_inside(real, b) for b in blocked_real_paths()):
        raise UserError(f"{path} is blocked (SSH keys and the Hugging Face token are never listed)")
    if not any(_inside(real, _real(r)) for r in roots):
        raise UserError(f"{path} is outside the browse roots; add a root in Setup › File browser")
    return real


@dataclass
class Entry:
    name: str
    path: str
    is_dir: bool
    size: int | None
    is_project: bool


def list_dir(path: str, roots: list[str],
             suffixes: tuple[str, ...] = ()) -> tuple[Path, list[Entry]]:
    """The folder (real path) and its visible entries: folders first, then files matching
    `suffixes` (all when empty). Dot entries, blocked entries and entries that resolve
    outside the roots are left out."""
    folder = confine(path, roots)
    if not folder.is_dir():
        folder = folder.parent
        confine(str(folder), roots)
    real_roots = [_real(r) for r in roots]
    blocked = blocked_real_paths()
    entries: list[Entry] = []
    try:
        names = sorted(os.listdir(folder), key=str.lower)
    except OSError as e:
        raise UserError(f"cannot list {folder}: {e.strerror}") from None
    for name in names:
        if name.startswith("."):
            continue
        full = folder / name
        real = _real(full)
        if not any(_inside(real, r) for r in real_roots) or any(_inside(real, b) for b in blocked):
            continue
        try:
            st = os.stat(real)
        except OSError:
            continue
        is_dir = stat.S_ISDIR(st.st_mode)
        if (
            not is_dir
            and suffixes
            and not name.lower().endswith(tuple(s.lower() for s in suffixes))
        ):
            continue
        entries.append(
            Entry(
                name,
                str(full),
                is_dir,
                None if is_dir else st.st_size,
                is_dir and (real / PROJECT_JSON).exists(),
            )
        )
        if len(entries) >= MAX_ENTRIES:
            break
    entries.sort(key=lambda e: (not e.is_dir, e.name.lower()))
    return folder, entries
