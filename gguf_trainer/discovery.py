"""Finding complete copies of a material already on disk, so it is linked, not downloaded.

Where it looks, in order: the folder named by `GGUF_TRAINER_MATERIALS`, the folder the app
was started from (and its `materials/`), the project and its `materials/`, every other
project's `materials/` under the projects root, and the Hugging Face cache
(`HF_HUB_CACHE`, `$HF_HOME/hub`). A snapshot material is looked for in `<root>/<subdir>`
and `<root>/<repo name>` (never in a root itself: a stray config.json there is not a
model), and it counts only when folder_check finds it complete; an incomplete copy is
never linked. The student is the best `pig_clip*.gguf` directly in those roots: names
with "f16" first, then the largest, and only files that start with the GGUF magic.

Reads only; recording a link in project.json is the caller's job (runner.downloads).
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

from .folder_check import check_folder, local_files

GGUF_MAGIC = b"GGUF"


def location(project, material) -> Path:
    """Where a project's material is (its recorded path) or will be downloaded to."""
    return project.material_path(material.id) or project.paths.materials / (
        material.subdir or material.id)


def candidate_roots(project_dir: Path, projects_root: Path | None = None) -> list[Path]:
    """Existing folders to search, first match wins, each once (by resolved path)."""
    project_dir = Path(project_dir).resolve()
    roots: list[Path] = []
    env = os.environ.get("GGUF_TRAINER_MATERIALS")
    if env:
        roots += [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    cwd = Path.cwd()
    roots += [cwd, cwd / "materials", project_dir / "materials", project_dir]
    if projects_root is None:
        from .project import PROJECTS_ROOT

        projects_root = PROJECTS_ROOT
    if Path(projects_root).is_dir():
        roots += sorted(p / "materials" for p in Path(projects_root).iterdir()
                        if p.is_dir() and p.resolve() != project_dir)
    seen, out = set(), []
    for root in roots:
        try:
            key = root.resolve()
        except OSError:  # unreadable or a symlink loop: skip it
            continue
        if key not in seen and root.is_dir():
            seen.add(key)
            out.append(root)
    return out


def hf_cache_snapshots(repo: str, repo_type: str = "model") -> list[tuple[Path, dict | None]]:
    """Snapshot folders of `repo` in the Hugging Face cache, newest first, each with the tree
    listing the Hub client cached for that commit (path -> size) when it has one."""
    hub_cache = os.environ.get("HF_HUB_CACHE") or str(
        Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "hub")
    storage = Path(hub_cache) / f"{repo_type}s--{repo.replace('/', '--')}"
    snapshots = sorted((storage / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime,
                       reverse=True) if (storage / "snapshots").is_dir() else []
    out = []
    for snap in snapshots:
        listing = None
        try:
            data = json.loads((storage / "trees" / f"{snap.name}.json").read_text("utf-8"))
            listing = {p: int(f["size"]) for p, f in data["files"].items()}
        except (OSError, ValueError, KeyError, TypeError):  # no or foreign tree cache
            pass
        out.append((snap, listing))
    return out


def is_hf_cache_snapshot(path: Path) -> bool:
    """True for `<hub cache>/<type>s--org--name/snapshots/<commit>` folders (and below)."""
    parts = Path(path).parts
    return any(a.startswith(("models--", "datasets--")) and b == "snapshots"
               for a, b in itertools.pairwise(parts))


def find_snapshot(material, roots: list[Path], exclude: Path | None = None) -> Path | None:
    """The first complete copy of an hf_snapshot material, or None."""
    names = [n for n in (material.subdir, material.repo.split("/")[-1], material.id) if n]
    for root in roots:
        for name in dict.fromkeys(names):
            cand = root / name
            is_other = exclude is None or cand.resolve() != exclude.resolve()
            if cand.is_dir() and is_other and check_folder(cand, material.patterns).is_complete:
                return cand
    for snap, listing in hf_cache_snapshots(material.repo, material.repo_type):
        if check_folder(snap, material.patterns, listing).is_complete:
            return snap
    return None


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def find_student(roots: list[Path]) -> tuple[Path | None, str]:
    """The best pig_clip GGUF in the roots and a sentence saying which and why."""
    found = {p.resolve(): p for root in roots for p in root.glob("pig_clip*.gguf")
             if p.is_file() and is_gguf(p)}
    if not found:
        return None, "no pig_clip*.gguf found"
    ranked = sorted(found.values(), key=lambda p: ("f16" not in p.name.lower(), -p.stat().st_size))
    best = ranked[0]
    why = "an f16 file" if "f16" in best.name.lower() else "no f16 file found; the largest"
    others = f" (also seen: {', '.join(p.name for p in ranked[1:4])})" if len(ranked) > 1 else ""
    return best, f"picked {best} as the student: {why}{others}"


def folder_size(path: Path) -> int:
    return sum(local_files(path).values())
