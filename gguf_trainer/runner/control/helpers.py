"""The control API's helpers: the folder argument a client sent checked (`check_folder_arg`),
the incremental log reader (`read_tail`, also used by the CLI), and the small private readers
the other control modules share (the project's paths, the live run, a quiet JSON read).
Torch-free, like all of runner.control."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gguf_trainer.base import atomic, project_file
from gguf_trainer.base.errors import UserError, quote
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import status as status_mod
from gguf_trainer.runner import supervisor

PathLike = str | os.PathLike
TAIL_MAX_BYTES = 256 * 1024


# ---- helpers (also used by the CLI) ----------------------------------------------------
def read_tail(
    path: Path, offset: int, max_bytes: int = TAIL_MAX_BYTES, inside: PathLike | None = None
) -> tuple[str, int]:
    """Incremental reader of any text log (see tail_log). With `inside` (the project) a log
    that leads outside it is UnsafeProjectFile, never read (project_file)."""
    try:
        offset = max(0, int(offset))
    except (TypeError, ValueError):
        offset = 0
    try:
        with open(path, "rb") if inside is None else project_file.open_file(inside, path) as f:
            size = os.fstat(f.fileno()).st_size
            if offset > size:
                offset = 0
            start_at = max(offset, size - max_bytes)
            f.seek(start_at)
            data = f.read(size - start_at)
    except (
        FileNotFoundError,
        IsADirectoryError,
        NotADirectoryError,
        PermissionError,
        project_file.NotAFile,
    ):  # a folder or FIFO in its place: nothing to show
        return "", 0 if offset == 0 else offset
    end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
    return data[:end].decode("utf-8", errors="replace"), start_at + end


def check_folder_arg(root: Any, what: str = "the project folder") -> Path:
    """A folder path as a client sent it (the GUI API takes any JSON): text or a path, not
    empty, no NUL byte; else one sentence, never a TypeError from deep inside."""
    if not isinstance(root, str | os.PathLike) or isinstance(root, bytes):
        raise UserError(f"{what} must be a path (text), not {type(root).__name__} {quote(root)}.")
    text = os.fspath(root)
    if not isinstance(text, str) or not text.strip():
        raise UserError(f"{what} is empty; give the folder's path.")
    if "\0" in text:
        raise UserError(f"{what} {quote(text)} holds a NUL byte, which no path can; fix it.")
    return Path(text).expanduser()


def _root(root: PathLike) -> Path:
    return check_folder_arg(root).resolve()


def _paths(root: PathLike) -> ProjectPaths:
    return supervisor.project_paths(check_folder_arg(root))


def _live_run(paths: ProjectPaths) -> dict | None:
    info = status_mod.derive_status(paths)
    return info if supervisor.is_active(info) else None


def _set_steps_idle(paths: ProjectPaths, steps: Any) -> int:
    from gguf_trainer.store import project

    return project.set_steps(paths.root, steps)


def _wait_steps_seen(paths: ProjectPaths, steps: int, wait_s: float) -> bool:
    import time

    deadline = time.monotonic() + max(0.0, wait_s)
    while True:
        st = status_mod.read_state(paths) or {}
        if st.get("steps") == steps:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def _read_json_quiet(path: Path, inside: Path) -> Any:
    """The file's JSON, or None when absent or unreadable; a file leading outside the
    project is not quiet: the caller asked to see it, so the sentence goes out."""
    try:
        return atomic.read_json(path, inside=inside)
    except project_file.LeadsOutside:
        raise
    except (ValueError, OSError):
        return None
