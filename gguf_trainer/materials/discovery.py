"""Finding complete copies of a material already on disk, so it is linked, not downloaded.

Where it looks, in order: the folder named by `GGUF_TRAINER_MATERIALS`, the folder the app
was started from (and its `materials/`), the project and its `materials/`, every other
project's `materials/` under the projects root, and the Hugging Face cache
(`HF_HUB_CACHE`, `$HF_HOME/hub`). A snapshot material is looked for in `<root>/<subdir>`
and `<root>/<repo name>` (never in a root itself: a stray config.json there is not a
model), and it counts only when folder_check finds it complete; an incomplete copy is
never linked. The student is the best `pig_clip*.gguf` directly in those roots: names
with "f16" first, then the largest, and only files that start with the GGUF magic.

A found copy is linked only when its identity matches what the material declares, so a
demo's toy files never stand in for the real ones: the student must have pig_clip's layout
(hidden size, layers and vocabulary read from the GGUF header) and carry no stand-in key; a
snapshot must hold no stand-in marker, its saved listing (when it has one) must name the
material's repo, and `expect` (the tokenizer: the vocabulary and hidden size the student
declares) must match its config.json. Each copy passed over is named with the reason.

A snapshot without `expect` (a teacher, a dataset) is that repo only when a record says so:
the listing our download saved (it names the repo, and every listed file has its size) or
the Hugging Face cache (its folder names the repo). A complete folder copied in by hand has
neither: it is not linked but returned as unverified (`unverified_sentence` tells how to
accept it), and the caller may compare it with the Hub's listing (`listing_problem`).

Reads only; recording a link in project.json is the caller's job (runner.downloads).
"""

from __future__ import annotations

import itertools
import json
import os
import re
from pathlib import Path

from gguf_trainer.base import paths
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.gguf_bounds import check_gguf
from gguf_trainer.base.paths import TINY_GGUF_KEY, TINY_MARKER
from gguf_trainer.materials.folder_check import (
    LISTING_JSON,
    MANIFEST_DIR,
    check_folder,
    local_files,
)

GGUF_MAGIC = b"GGUF"
# The student every recipe trains against: Qwen3-0.6B's layout (engine-contract §5.1).
PIG_CLIP = {"hidden": 1024, "layers": 28, "vocab": 151936}
_EMBED_NAMES = ("model.embed_tokens.weight", "token_embd.weight")  # HF and llama.cpp names
_LAYER_RE = re.compile(r"^(?:model\.layers|blk)\.(\d+)\.")


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
        projects_root = paths.PROJECTS_ROOT  # read now: tests point it elsewhere
    if Path(projects_root).is_dir():
        roots += sorted(p / "materials" for p in Path(projects_root).iterdir()
                        if p.is_dir() and p.resolve() != project_dir)
    seen, out = set(), []
    for root in roots:
        try:
            key = root.resolve()
        except (OSError, RuntimeError):  # unreadable, or a symlink loop (3.11: RuntimeError)
            continue
        if key not in seen and root.is_dir():
            seen.add(key)
            out.append(root)
    return out


def hf_cache_snapshots(repo: str, repo_type: str = "model") -> list[tuple[Path, dict | None]]:
    """Snapshot folders of `repo` in the Hugging Face cache, newest first, each with the tree
    listing the Hub client cached for that commit (path -> size) when it has one."""
    if not repo:  # a snapshot no repo holds is never in the cache under a name
        return []
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


def snapshot_problem(material, folder: Path, expect: dict | None = None) -> str | None:
    """Why `folder` is not `material`'s snapshot (a sentence), or None when its identity
    matches: no stand-in marker, our saved listing (if any) names the material's repo, and
    config.json holds every `expect` key with that value."""
    if (folder / TINY_MARKER).exists():
        return (f"{folder} is a tiny stand-in made by gguf-trainer (demo or test), "
                f"not {material.repo}")
    try:
        saved = json.loads((folder / MANIFEST_DIR / LISTING_JSON).read_text("utf-8"))
    except FileNotFoundError:
        saved = {}
    except (OSError, ValueError):  # torn: folder_check falls back to the index files
        saved = {}
    repo = saved.get("repo") if isinstance(saved, dict) else None
    if repo and material.repo and repo != material.repo:
        return f"{folder} was downloaded from {repo}, not {material.repo}"
    if expect:
        try:
            config = json.loads((folder / "config.json").read_text("utf-8"))
        except (OSError, ValueError):
            config = None
        if not isinstance(config, dict):
            return f"{folder} has no readable config.json to compare with the student"
        wrong = [
            f"{k} {config.get(k)!r} (the student has {v})"
            for k, v in expect.items()
            if config.get(k) != v
        ]
        if wrong:
            return f"{folder} does not match the student: {', '.join(wrong)}"
    return None


def has_record(material, folder: Path) -> bool:
    """Whether something other than its name says `folder` is the material's repo: the
    listing our download saved there names it, or the folder is a Hugging Face cache snapshot
    (the Hub client files each repo under its own name)."""
    if is_hf_cache_snapshot(folder):
        return True
    try:
        saved = json.loads((folder / MANIFEST_DIR / LISTING_JSON).read_text("utf-8"))
    except (OSError, ValueError):  # none, or torn: no record
        return False
    return isinstance(saved, dict) and bool(material.repo) and saved.get("repo") == material.repo


def find_snapshot(
    material,
    roots: list[Path],
    exclude: Path | None = None,
    expect: dict | None = None,
    passed: list[str] | None = None,
    unverified: list[Path] | None = None,
) -> Path | None:
    """The first complete copy of an hf_snapshot material whose identity matches
    (`snapshot_problem`, and without `expect` a download record: `has_record`), or None.
    `passed` receives a sentence per complete copy refused; `unverified` each complete copy
    that nothing identifies (copied by hand: no download record to compare it with)."""
    names = [n for n in (material.subdir, material.repo.split("/")[-1], material.id) if n]
    cands = []
    for root in roots:
        for name in dict.fromkeys(names):
            cand = root / name
            is_other = exclude is None or cand.resolve() != exclude.resolve()
            if cand.is_dir() and is_other:
                cands.append((cand, None))
    cands += hf_cache_snapshots(material.repo, material.repo_type)
    for cand, listing in cands:
        if not check_folder(cand, material.patterns, listing).is_complete:
            continue  # an incomplete copy is never linked, and not worth a line
        problem = snapshot_problem(material, cand, expect)
        if problem is None and (expect or has_record(material, cand)):
            return cand
        if problem is None:
            if unverified is not None:
                unverified.append(cand)
        elif passed is not None:
            passed.append(problem)
    return None


def listing_problem(material, folder: Path, listing: dict[str, int]) -> str | None:
    """Why `folder` is not the repo whose file list and sizes the Hub gives (`listing`, path
    -> size, the material's patterns only), or None when every listed file is there with
    its size."""
    check = check_folder(folder, material.patterns, listing)
    if check.is_complete:
        return None
    return (f"{folder} is not {material.repo}: its files differ from the Hub's listing "
            f"({', '.join(check.missing[:3])})")


def unverified_sentence(material, folder: Path, project_dir) -> str:
    """The one sentence for a complete copy nothing identifies: why it was not linked and how
    the user accepts it (or has it checked against the Hub)."""
    link = (f"link it with `gguf-trainer link --project {project_dir} {material.id} {folder}` "
            "(or Replace under Setup → Materials)")
    if not material.repo:  # no repo to compare with: only the user can say what it is
        return (f"{folder} may be {material.title}, but nothing records where it came from, so "
                f"it was not linked; if it is, {link}")
    return (f"{folder} holds every file {material.repo} needs but has no download record to "
            f"compare with the repo's file list, so it was not linked; if it is "
            f"{material.repo}, {link}, or have it checked "
            f"against the Hub with `gguf-trainer materials --project {project_dir} --link-found "
            f"--online`")


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def student_layout(path: Path) -> dict:
    """{hidden, layers, vocab, tiny} of a student GGUF from its header (no tensor data read);
    a UserError when the file is not a whole GGUF."""
    layout = check_gguf(path, fix="choose the pig_clip .gguf file")
    embed = next((layout.shapes[n] for n in _EMBED_NAMES if n in layout.shapes), None)
    layers = {m.group(1) for n in layout.shapes if (m := _LAYER_RE.match(n))}
    hidden, vocab = (embed[0], embed[1]) if embed and len(embed) == 2 else (None, None)
    return {
        "hidden": hidden,
        "layers": len(layers),
        "vocab": vocab,
        "tiny": TINY_GGUF_KEY in layout.strings,
    }


def student_problem(path: Path) -> str | None:
    """Why `path` is not a pig_clip student (a sentence), or None."""
    try:
        got = student_layout(path)
    except UserError as e:
        return str(e).rstrip(".")
    if got["tiny"]:
        return f"{path} is a tiny stand-in made by gguf-trainer (demo or test), not pig_clip"
    wrong = [f"{k} {got[k]} (pig_clip has {v})" for k, v in PIG_CLIP.items() if got[k] != v]
    return f"{path} is not pig_clip: {', '.join(wrong)}" if wrong else None


def find_student(roots: list[Path], passed: list[str] | None = None) -> tuple[Path | None, str]:
    """The best pig_clip GGUF in the roots whose header has pig_clip's layout, and a sentence
    saying which and why. `passed` receives a sentence per pig_clip*.gguf refused."""
    found = {
        p.resolve(): p
        for root in roots
        for p in root.glob("pig_clip*.gguf")
        if p.is_file() and is_gguf(p)
    }
    good = []
    for p in found.values():
        problem = student_problem(p)
        if problem is None:
            good.append(p)
        elif passed is not None:
            passed.append(problem)
    if not good:
        return None, "no pig_clip*.gguf with pig_clip's layout found"
    ranked = sorted(good, key=lambda p: ("f16" not in p.name.lower(), -p.stat().st_size))
    best = ranked[0]
    why = "an f16 file" if "f16" in best.name.lower() else "no f16 file found; the largest"
    others = f" (also seen: {', '.join(p.name for p in ranked[1:4])})" if len(ranked) > 1 else ""
    return best, f"picked {best} as the student: {why}{others}"


def tokenizer_expect(student: Path | None) -> dict:
    """The config.json values a student tokenizer folder must hold: the vocabulary and hidden
    size of the project's student when it is a readable GGUF, else pig_clip's."""
    got = {}
    if student is not None and Path(student).is_file():
        try:
            got = student_layout(Path(student))
        except UserError:  # unreadable student: compare with pig_clip's own numbers
            got = {}
    hidden = got.get("hidden") or PIG_CLIP["hidden"]
    vocab = got.get("vocab") or PIG_CLIP["vocab"]
    return {"hidden_size": hidden, "vocab_size": vocab}


def folder_size(path: Path) -> int:
    return sum(local_files(path).values())
