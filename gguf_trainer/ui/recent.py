"""Recent projects, kept in ~/.gguf-trainer/settings.json (`recent_projects`, newest first).

`last_project` (what `--auto-resume` relaunches) is the supervisor's key; opening or
creating a project in the GUI sets both.
"""

from __future__ import annotations

from pathlib import Path

from gguf_trainer.base import atomic, paths
from gguf_trainer.base.paths import ProjectPaths
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
    """Recent projects that still exist, newest first (the last project included), then the
    demo projects under the projects folder (`gguf-trainer demo` makes them from the CLI)."""
    settings = supervisor.read_settings()
    cands = [settings.get("last_project"), *(settings.get(KEY) or []), *demo_projects()]
    out: list[str] = []
    for p in cands:
        if isinstance(p, str) and p not in out and ProjectPaths(p).exists():
            out.append(p)
    return out


def demo_projects() -> list[str]:
    """`<projects folder>/demo_*` projects, by name."""
    root = Path(paths.PROJECTS_ROOT)
    try:
        found = sorted(p for p in root.glob("demo_*") if ProjectPaths(p).exists())
    except OSError:  # an unreadable projects folder: no demos to offer
        return []
    return [str(p.resolve()) for p in found]


def last() -> str | None:
    p = supervisor.read_settings().get("last_project")
    return p if isinstance(p, str) and ProjectPaths(p).exists() else None
