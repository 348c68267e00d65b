"""Material status: which materials a project has, where they are, and how complete.

One status dict per material, shared by the CLI (`gguf-trainer materials`) and the GUI:

    id, title, kind, repo, repo_type, required, wanted, size_gb, path, linked,
    source       where it came from: downloaded | in the project folder | linked from <folder>
    state        missing | partial | downloading | ready | failed
    files_done, files_total, bytes_done, bytes_total, bytes_partial, missing_files (first 5)
    rate_bps, eta_s, pid   while downloading (from the job's state file)
    error        why it failed (one sentence; with `verified` False: every file is there but the
                 pack's content check refused it), note (e.g. "interrupted; start again to
                 resume", or why the Hub listing could not be fetched), log (the job log)

Ready = folder_check found every expected file whole: against the Hub's listing when
`online` (cached LISTING_TTL_S, and a failure to list is shown in `note`, never silently
replaced by a guess), else the listing saved at download time or the snapshot's own index
files; a file the saved listing gives a hash must hold those bytes (compared with the hash
the download recorded by size and mtime; a changed file is hashed once). Never starts or
links anything; writes nothing but folder_check's hash records.
"""

from __future__ import annotations

import time
from pathlib import Path

from gguf_trainer.base.errors import UserError
from gguf_trainer.materials import discovery, hub
from gguf_trainer.materials.corpus_sources import corpus_materials
from gguf_trainer.materials.folder_check import (
    LISTING_JSON,
    MANIFEST_DIR,
    FolderCheck,
    check_folder,
)
from gguf_trainer.materials.spec import link_sentence
from gguf_trainer.runner import jobs

JOB_NAME = "download"
LISTING_TTL_S = 600.0  # an online listing is reused this long, then asked again
STALL_S = 15.0  # a running download that reported no bytes for this long shows rate 0
_listing_cache: dict[tuple, tuple[float, hub.Listing]] = {}


# ---- which materials, where -------------------------------------------------------------
def all_materials(project) -> tuple:
    """Every material the pack declares (wanted or not), student's first, then the datasets
    the corpus selects."""
    pack = project.pack
    return tuple(dict.fromkeys(tuple(pack.materials) + tuple(pack.optional_materials)
                               + corpus_materials(project.settings)))


def wanted_ids(project) -> set[str]:
    from gguf_trainer.materials.materials import materials_for

    return {m.id for m in materials_for(project) + corpus_materials(project.settings)}


def revision(material) -> str:
    return getattr(material, "revision", "main")  # datasets may name a branch (HubDataset)


def destination(project, material) -> Path:
    """Where a material is, and where a download of it writes: its recorded path, except a
    snapshot inside the Hugging Face cache (linked, read-only by contract: its files are
    symlinks into shared blobs), which is re-downloaded into the project instead."""
    path = discovery.location(project, material)
    if material.kind == "hf_snapshot" and discovery.is_hf_cache_snapshot(path):
        return project.paths.materials / (material.subdir or material.id)
    return path


def job_folder(dest: Path) -> Path:
    return Path(dest) / MANIFEST_DIR


def select(project, ids: list[str] | None, required_only: bool) -> list:
    known = {m.id: m for m in all_materials(project)}
    unknown = [i for i in ids or () if i not in known]
    if unknown:
        raise UserError(f"unknown material {', '.join(unknown)}; this pack has "
                        f"{', '.join(known)}.")
    if ids:
        return [known[i] for i in ids]
    wanted = wanted_ids(project)
    return [m for m in known.values() if m.id in wanted and (m.required or not required_only)]


# ---- status -------------------------------------------------------------------------------
def hub_listing(material, online: bool = True) -> tuple[hub.Listing | None, str | None]:
    """The Hub's listing of the material's files (cached LISTING_TTL_S) and None, or None and
    why the Hub could not be asked; (None, None) when not `online`."""
    if not online or not material.repo:  # no repo (link a local copy): nothing to ask
        return None, None
    key = (material.repo, material.repo_type, tuple(material.patterns), revision(material))
    hit = _listing_cache.get(key)
    if hit and time.monotonic() - hit[0] < LISTING_TTL_S:
        return hit[1], None
    try:
        listing = hub.list_remote(material.repo, material.repo_type, tuple(material.patterns),
                                  revision(material))
    except UserError as e:  # shown with the status, never silently replaced by a guess
        return None, str(e)
    _listing_cache[key] = (time.monotonic(), listing)
    return listing, None


def _base(project, material, wanted: set[str]) -> dict:
    path = project.material_path(material.id)
    return {"id": material.id, "title": material.title, "kind": material.kind,
            "repo": material.repo, "repo_type": material.repo_type,
            "required": material.required, "wanted": material.id in wanted,
            "size_gb": material.size_gb, "path": str(path) if path else "",
            "linked": bool(path) and not _is_inside(path, project.paths.materials),
            "source": source_of(project, material, path),
            "state": "missing", "files_done": 0, "files_total": 0, "bytes_done": 0,
            "bytes_total": int(material.size_gb * 1e9), "bytes_partial": 0, "rate_bps": None,
            "eta_s": None, "pid": None, "error": None, "missing_files": [], "note": None,
            "log": None}


def source_of(project, material, path: Path | None) -> str:
    """Where a material came from, in words: "downloaded" (our download's listing is in the
    folder), "in the project folder", or "linked from <folder>" (the Hugging Face cache, a
    shared folder, another project)."""
    if not path:
        return ""
    path = Path(path)
    if material.kind == "hf_snapshot" and discovery.is_hf_cache_snapshot(path):
        return "linked from the Hugging Face cache"
    if _is_inside(path, project.paths.root):
        downloaded = (path / MANIFEST_DIR / LISTING_JSON).is_file()
        return "downloaded" if downloaded else "in the project folder"
    return f"linked from {path.parent}"


def _is_inside(path: Path, folder: Path) -> bool:
    try:
        Path(path).resolve().relative_to(Path(folder).resolve())
        return True
    except ValueError:
        return False


def _local_file_status(out: dict, project, material) -> dict:
    path = project.material_path(material.id)
    if path is None:
        # the `link` command, as every missing material says it (the GUI's words say Replace)
        what = f" ({material.hint})" if material.hint else ""
        out["error"] = (f"not set{what}; link it (`gguf-trainer link --project "
                        f"{project.paths.root} {material.id} PATH`)")
    elif not path.is_file():
        out.update(state="failed", error=f"{path} does not exist; choose the file again")
    elif not discovery.is_gguf(path) and ".gguf" in material.suffixes:
        out.update(state="failed", error=f"{path} is not a GGUF file")
    else:
        size = path.stat().st_size
        out.update(state="ready", files_done=1, files_total=1, bytes_done=size, bytes_total=size)
    return out


def material_status(project, material, online: bool = False, wanted: set | None = None) -> dict:
    """The status dict of one material (see the module docstring)."""
    out = _base(project, material, wanted if wanted is not None else wanted_ids(project))
    if material.kind != "hf_snapshot":
        return _local_file_status(out, project, material)
    dest = discovery.location(project, material)
    out["path"] = str(dest)
    if discovery.is_hf_cache_snapshot(dest):
        dest_job = destination(project, material)  # a re-download goes to the project
    else:
        dest_job = dest
    listing, listing_error = hub_listing(material, online)
    check = check_folder(dest, material.patterns, listing.sizes() if listing else None)
    _apply_check(out, check)
    out["note"] = listing_error
    job = (jobs.job_status(job_folder(dest_job), JOB_NAME)
           if job_folder(dest_job).is_dir() else None)
    if job:
        out["log"] = job["log"]
    if not material.is_downloadable:  # never downloaded: a job left by an older version
        return _link_only_status(out, project, material, dest, check)
    if job and job["status"] == "running":
        prog = job["progress"]
        out.update(state="downloading", pid=job["pid"], rate_bps=prog.get("rate_bps"),
                   eta_s=prog.get("eta_s"))
        quiet_s = time.time() - prog["updated"] if isinstance(prog.get("updated"), float) else 0
        if quiet_s > STALL_S:  # the last rate would be a lie: no byte has come since
            out.update(rate_bps=0, eta_s=None,
                       note=f"no data from the Hub for {quiet_s:.0f} s (still trying)")
        for key in ("bytes_done", "bytes_total", "files_done", "files_total"):
            if isinstance(prog.get(key), int) and prog[key]:
                out[key] = prog[key]
    elif check.is_complete:
        out["state"] = "ready"
        check_content(out, project, material, dest)
    elif job and job["status"] == "failed":
        out.update(state="failed", error=job["error"])
    elif check.bytes_done or check.bytes_partial:
        out["state"] = "partial"
    if job and job["status"] in ("interrupted", "stopped") and not check.is_complete:
        out["note"] = "the last download was interrupted; start it again to resume"
    return out


def _link_only_status(out: dict, project, material, dest: Path, check: FolderCheck) -> dict:
    """A snapshot no repo holds: ready when the linked copy is whole, else the sentence saying
    where to get it and how to link it (no download state: none is ever started)."""
    if check.is_complete:
        out["state"] = "ready"
        check_content(out, project, material, dest)
    else:
        out.update(state="missing", note=None,
                   error=link_sentence(material, project.paths.root))
    return out


def check_content(out: dict, project, material, dest: Path) -> None:
    """A pack that can check its teacher from headers alone (tensor names and shapes, the
    tokenizer; no weights read) says what the complete folder holds: `verified` True with the
    summary as the note, or state "failed", `verified` False and the sentence naming the file
    to fix as the error (every file is there, but precompute would refuse it: it is not ready,
    and downloading again cannot fix it)."""
    if material not in project.pack.teacher_materials:
        return
    try:
        summary = project.pack.check_teacher({material.id: dest})
    except UserError as e:
        out.update(state="failed", verified=False, error=str(e))
    else:
        if summary is None:  # the pack has no header check: file presence is all there is
            return
        out.update(verified=True, note="; ".join(filter(None, [out.get("note"), summary])))


def _apply_check(out: dict, check: FolderCheck) -> None:
    out.update(files_done=check.files_done, files_total=check.files_total,
               bytes_done=check.bytes_done + check.bytes_partial,
               bytes_partial=check.bytes_partial, missing_files=check.missing[:5])
    if check.bytes_total:
        out["bytes_total"] = max(check.bytes_total, out["bytes_done"])


def material_statuses(root, online: bool = False) -> list[dict]:
    """Status of every material of the project's pack (wanted ones marked `wanted`)."""
    from gguf_trainer.store.project import load_project

    project = load_project(root)
    wanted = wanted_ids(project)
    return [material_status(project, m, online, wanted) for m in all_materials(project)]


def format_statuses(rows: list[dict]) -> str:
    """One line per material for `gguf-trainer materials`."""
    lines = []
    for r in rows:
        size = (f"{r['bytes_done'] / 1e9:.2f}/{r['bytes_total'] / 1e9:.2f} GB"
                if r["bytes_total"] else "")
        files = f"{r['files_done']}/{r['files_total']} files" if r["files_total"] else ""
        extra = []
        if r["state"] == "downloading":
            rate = f"{r['rate_bps'] / 1e6:.1f} MB/s" if r["rate_bps"] else "starting"
            eta = f", ETA {r['eta_s']:.0f} s" if r["eta_s"] else ""
            extra.append(f"{rate}{eta}, pid {r['pid']}")
        if r.get("source"):
            extra.append(r["source"])
        if r["error"]:
            extra.append(r["error"])
        if r["note"]:
            extra.append(r["note"])
        want = "" if r["wanted"] else " (not wanted)"
        lines.append(
            f"{r['id']:<18} {r['state']:<11} {files:<12} {size:<16} "
            f"{r['path'] or '-'}{want}" + (f"  [{'; '.join(extra)}]" if extra else "")
        )
    return "\n".join(lines)
