"""Recent projects, kept in ~/.gguf-trainer/settings.json (`recent_projects`, newest first).

`last_project` (what `--auto-resume` relaunches) is the supervisor's key; opening or
creating a project in the GUI sets both.
"""

from __future__ import annotations

from pathlib import Path

from gguf_trainer import atomic
from gguf_trainer.paths import ProjectPaths
from gguf_trainer.runner import supervisor

KEY = "recent_projects"
KEEP = 12


def remember(root: str) -> None:
    root = str(Path(root).expanduser().resolve())
    supervisor.remember_project(root)
    settings = supervisor.read_settings()
    old = [p for p in settings.get(KEY) or [] if isinstance(p, str) and p != root]
    settings[KEY] = [root, *old][:KEEP]
    atomic.write_json(supervisor.settings_path(), settings)


def projects() -> list[str]:
    """Recent projects that still exist, newest first (the last project included)."""
    settings = supervisor.read_settings()
    cands = [settings.get("last_project"), *(settings.get(KEY) or [])]
    out: list[str] = []
    for p in cands:
        if isinstance(p, str) and p not in out and ProjectPaths(p).exists():
            out.append(p)
    return out


def last() -> str | None:
    p = supervisor.read_settings().get("last_project")
    return p if isinstance(p, str) and ProjectPaths(p).exists() else None
