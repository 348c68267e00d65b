"""Materials of a project: status, downloads (detached or foreground), linking copies on disk.

The control functions the CLI and the GUI share (torch-free; each re-reads the disk):

    material_statuses(root, online=False) -> [dict]   one per material of the pack
    start_download(root, ids=None, required_only=False) -> [dict]  detached jobs
    download_foreground(root, ids, required_only, on_progress, on_line) -> int (failures)
    link_found(root, online=False) -> [dict]   link complete copies found on disk (a copy
                                          made by hand: only when the Hub's listing matches)
    link_material(root, material_id, path) -> dict   link a folder/file the user names
    stop_download(root, material_id) -> str

One download per destination folder, ever: the download (a `runner.jobs` job named
"download" whose files live in `<dest>/.cache/gguf-trainer/`) holds that folder's OS lock
for its whole life, and the foreground CLI takes the same lock, so a second click, a second
`download`, or a GUI and a CLI at once find the running one (LockHeld) instead of starting
another. A killed or rebooted download leaves its partial file; the next start continues
it (hub.fetch_file). The HF token is never passed as an argument or stored: the job reads
it from its environment (HF_TOKEN) or huggingface_hub's token store, like the parent.

The status of each material (runner/material_status.py) is re-exported here, so the GUI
and the CLI use this one module for everything about materials.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from gguf_trainer.base import locks, project_file
from gguf_trainer.base.errors import UserError
from gguf_trainer.machine import disk_space
from gguf_trainer.materials import discovery, hub
from gguf_trainer.materials.folder_check import check_folder
from gguf_trainer.runner import jobs
from gguf_trainer.runner.material_status import (  # noqa: F401 - the GUI's one module for materials
    JOB_NAME,
    all_materials,
    check_content,
    destination,
    format_statuses,
    hub_listing,
    job_folder,
    material_status,
    material_statuses,
    revision,
    select,
    wanted_ids,
)
from gguf_trainer.runner.stages import env_wants_mock
from gguf_trainer.stages.stage_list import SHARD_STAGES

log = logging.getLogger(__name__)

JOB_TARGET = "gguf_trainer.runner.downloads:download_job"
DOWNLOAD_LOG = "download.log"  # in the project: one line per material event (control.tail_log)
PROGRESS_EVERY_S = 0.5
DISK_MARGIN = 1.02  # free space needed beyond the bytes still to fetch


# ---- linking --------------------------------------------------------------------------------
def _record_path(root, material_id: str, path: Path) -> None:
    from gguf_trainer.store.project import update_settings

    update_settings(root, {f"materials.{material_id}.path": str(Path(path).resolve())})


def link_material(root, material_id: str, path) -> dict:
    """Point a material at a folder/file the user names; refused unless it is complete."""
    from gguf_trainer.store.project import load_project

    project = load_project(root)
    material = next((m for m in all_materials(project) if m.id == material_id), None)
    if material is None:
        raise UserError(f"unknown material {material_id!r}; this pack has "
                        f"{', '.join(m.id for m in all_materials(project))}.")
    path = Path(path).expanduser()
    if not path.exists():
        raise UserError(f"{path} does not exist; choose the folder or file again.")
    if material.kind == "hf_snapshot":
        check = check_folder(path, material.patterns)
        named: list[Path] = []  # a copy the user names needs no download record: they vouch
        inside = None if check.is_complete else (
            discovery.find_snapshot(material, [path], unverified=named) or next(iter(named), None))
        if inside is not None:  # the user named the folder that holds the snapshot
            path = inside
        elif not check.is_complete:
            what = ", ".join(check.missing[:3]) or "no matching files"
            raise UserError(f"{path} is not a complete copy of {material.repo} (missing: {what}); "
                            "finish copying it or download it instead.")
    elif path.is_dir():
        found, _why = discovery.find_student([path])
        if found is None:
            raise UserError(f"{path} holds no pig_clip*.gguf; choose the .gguf file itself.")
        path = found
    elif not discovery.is_gguf(path):
        raise UserError(f"{path} is not a GGUF file; choose {material.hint or 'the .gguf file'}.")
    _record_path(root, material_id, path)
    _note(project, f"{material_id}: linked {path}")
    return material_status(load_project(root), material)


def link_found_lines(root, online: bool) -> list[str]:
    """link_found's report for a person, a line each: what was linked, what a copy was passed
    over for, and the copies left unverified with how to accept them."""
    passed: dict[str, list[str]] = {}
    unverified: dict[str, list[str]] = {}
    lines = [d["message"] for d in link_found(root, passed, online, unverified)]
    lines += [f"{mid}: not linked: {line}" for mid, said in passed.items() for line in said]
    lines += [f"{mid}: {line}" for mid, said in unverified.items() for line in said]
    return lines


def link_found(root, passed_over: dict[str, list[str]] | None = None, online: bool = False,
               unverified_over: dict[str, list[str]] | None = None) -> list[dict]:
    """Link every wanted material that is not ready to a complete copy found on disk whose
    identity matches (discovery). Returns [{id, path, message}] for what was linked (the user
    is told each one); `passed_over` receives, by id, a sentence per copy seen but refused.
    A complete snapshot copy with no download record (copied by hand) is compared with the
    Hub's listing when `online` (linked when its files and sizes match, passed over when
    not); otherwise, or when the Hub cannot be asked, `unverified_over` receives the sentence
    saying how to accept it, and it is not linked."""
    from gguf_trainer.store.project import load_project

    project = load_project(root)
    roots = discovery.candidate_roots(project.dir)
    linked = []
    wanted = wanted_ids(project)
    student = project.material_path("student")  # the tokenizer must match it (students first)
    for m in all_materials(project):
        if m.id not in wanted:
            continue
        st = material_status(project, m, wanted=wanted)
        if st["state"] in ("ready", "downloading"):
            continue
        passed: list[str] = []  # copies seen but not this material (a demo's toy files)
        unverified: list[str] = []  # complete copies nothing identifies (copied by hand)
        if m.kind == "hf_snapshot":
            expect = discovery.tokenizer_expect(student) if m.id == "student_tokenizer" else None
            maybe: list[Path] = []
            found = discovery.find_snapshot(m, roots, exclude=destination(project, m),
                                            expect=expect, passed=passed, unverified=maybe)
            message = (f"{m.id}: linked the complete copy of {m.repo or m.title} at {found}"
                       if found else "")
            if found is None and maybe:
                found, message = _check_with_hub(project, m, maybe, online, passed, unverified)
        else:
            found, message = discovery.find_student(roots, passed=passed)
            message = f"{m.id}: {message}"
            student = found or student
        for line in passed:
            _note(project, f"{m.id}: not linked: {line}")
        if passed and passed_over is not None:
            passed_over[m.id] = passed
        for line in unverified:
            _note(project, f"{m.id}: {line}")
        if unverified and unverified_over is not None:
            unverified_over[m.id] = unverified
        if found:
            _record_path(root, m.id, found)
            _note(project, message)
            linked.append({"id": m.id, "path": str(found), "message": message})
    return linked


def _check_with_hub(project, m, maybe: list[Path], online: bool, passed: list[str],
                    unverified: list[str]) -> tuple[Path | None, str]:
    """Complete copies of `m` that nothing identifies: the first whose files and sizes match
    the Hub's listing (when `online` and the Hub answers) and its message; each that differs
    goes to `passed`, and without a listing each gets the sentence saying how to accept it."""
    listing, error = (None, None) if not online else hub_listing(m)
    if listing is not None:
        for cand in maybe:
            problem = discovery.listing_problem(m, cand, listing.sizes())
            if problem is None:
                return cand, (f"{m.id}: linked the copy at {cand}: its files and sizes match "
                              f"{m.repo}'s listing on the Hub")
            passed.append(problem)
        return None, ""
    hub = f" (checking it against the Hub failed: {error.rstrip('.')})" if error else ""
    unverified += [discovery.unverified_sentence(m, cand, project.dir) + hub for cand in maybe]
    return None, ""


def _note(project, line: str) -> None:
    log.info("%s", line)
    log_file = project.paths.root / DOWNLOAD_LOG  # appended only to the project's own file
    with io.TextIOWrapper(project_file.open_append(project.paths.root, log_file),
                          encoding="utf-8") as f:
        f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")


# ---- downloads --------------------------------------------------------------------------------
def check_disk(listing: hub.Listing, dest: Path) -> None:
    """Refuse a download that cannot fit: both numbers in the sentence."""
    have = check_folder(dest, (), listing.sizes())
    need = max(0, listing.bytes_total - have.bytes_done - have.bytes_partial)
    disk_space.require_free(dest, int(need * DISK_MARGIN), listing.repo,
                            "free space or link a copy you already have")


class _Meter:
    """Bytes done over all files, rate (moving window) and ETA; reports every 0.5 s."""

    def __init__(self, listing: hub.Listing, report: Callable[[dict], None]):
        self.sizes = listing.sizes()
        self.done: dict[str, int] = {}
        self.report = report
        self.files_done = 0
        self.samples: list[tuple[float, int]] = []
        self.last = 0.0

    def __call__(self, path: str, done: int, total: int) -> None:
        self.done[path] = done
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S or done == total:
            self.last = now
            self.report(self.snapshot(path))

    def file_done(self, path: str) -> None:
        self.files_done += 1
        self.done[path] = self.sizes[path]
        self.report(self.snapshot(path))

    def snapshot(self, current: str) -> dict:
        now, total = time.monotonic(), sum(self.sizes.values())
        done = sum(self.done.values())
        self.samples = [s for s in self.samples if now - s[0] < 10.0] + [(now, done)]
        t0, b0 = self.samples[0]
        rate = (done - b0) / (now - t0) if now - t0 > 0.5 else None
        eta = (total - done) / rate if rate else None
        return {"bytes_done": done, "bytes_total": total, "files_done": self.files_done,
                "files_total": len(self.sizes), "file": current,
                "rate_bps": round(rate) if rate else None, "eta_s": round(eta, 1) if eta else None,
                "updated": time.time()}


def _download(dest: Path, material_id: str, repo: str, repo_type: str, patterns: tuple,
              revision: str, report: Callable[[dict], None],
              on_progress: hub.Progress | None = None) -> dict:
    listing = hub.list_remote(repo, repo_type, patterns, revision)
    dest.mkdir(parents=True, exist_ok=True)
    check_disk(listing, dest)
    meter = _Meter(listing, report)

    def progress(path, done, total):
        meter(path, done, total)
        if on_progress:
            on_progress(path, done, total)

    hub.fetch_listing(listing, dest, progress, meter.file_done)
    check = check_folder(dest, patterns, listing.sizes())
    if not check.is_complete:
        raise UserError(
            f"{repo} is still incomplete after the download ({', '.join(check.missing[:3])}); "
            "retry."
        )
    return {
        "path": str(dest),
        "commit": listing.commit,
        "bytes": listing.bytes_total,
        "files": len(listing.files),
        "material": material_id,
    }


def _stop_at_once(job) -> None:
    """SIGTERM/SIGINT end a download at once, even in the middle of a network read that may
    wait minutes for a stalled server (runner.jobs' default only sets a flag checked between
    steps). Raising from the handler interrupts the read; the partial file is kept, closed
    by its `with`, and continued next time. The job records status "stopped"."""

    def stop(signum, _frame):
        job.stop_requested = True
        raise jobs.JobStopped()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def download_job(
    folder: Path,
    job,
    *,
    dest: str,
    material_id: str,
    repo: str,
    repo_type: str,
    patterns: list[str],
    revision: str = "main",
    project: str = "",
) -> dict:
    """The detached job body (runner.jobs target): fetch, verify, record the path."""
    _stop_at_once(job)
    job.log.info("downloading %s (%s) into %s", repo, ", ".join(patterns), dest)
    result = _download(
        Path(dest),
        material_id,
        repo,
        repo_type,
        tuple(patterns),
        revision,
        lambda fields: job.update(**fields),
    )
    if project:
        _record_path(project, material_id, Path(dest))
        from gguf_trainer.store.project import load_project

        loaded = load_project(project)
        _note(loaded, f"{material_id}: {repo} is complete at {dest}")
        material = next((m for m in all_materials(loaded) if m.id == material_id), None)
        st: dict = {}
        if material is not None:  # (its status says "downloading" while this job runs)
            check_content(st, loaded, material, Path(dest))
        if st.get("verified") is False:  # the status shows "failed" with this sentence
            _note(loaded, f"{material_id}: content check failed - {st['error']}")
        elif st.get("verified"):
            _note(loaded, f"{material_id}: checked: {st['note']}")
    return result


def start_download(root, ids: list[str] | None = None, required_only: bool = False) -> list[dict]:
    """Start a detached download for each selected snapshot material that is not ready.
    Materials already downloading are reported with their pid, never started twice.
    Returns one {id, action: started|running|ready|linked|skipped|failed, pid, message} each
    (failed: complete, but the pack's content check refuses it; the message says which file),
    after a {id, action: passed, message} for each copy on disk that is not this material
    and a {id, action: unverified, message} for each complete copy that nothing identifies
    (copied by hand) while the Hub cannot be asked: the message says how to accept it."""
    from gguf_trainer.store.project import load_project

    passed: dict[str, list[str]] = {}
    unverified: dict[str, list[str]] = {}
    # online: a download asks the Hub anyway, so a hand-copied folder is checked against it
    linked = {d["id"]: d for d in link_found(root, passed, online=True,
                                              unverified_over=unverified)}
    project = load_project(root)
    out = []
    for m in select(project, ids, required_only):
        out += [
            {"id": m.id, "action": "passed", "pid": None, "message": f"{m.id}: not linked: {line}"}
            for line in passed.get(m.id, ())
        ]
        out += [{"id": m.id, "action": "unverified", "pid": None, "message": f"{m.id}: {line}"}
                for line in unverified.get(m.id, ())]
        if m.id in linked:
            out.append(
                {"id": m.id, "action": "linked", "pid": None, "message": linked[m.id]["message"]}
            )
            continue
        st = material_status(project, m)
        if not m.is_downloadable:  # a file to choose, or a snapshot no repo holds: linked only
            out.append(
                {
                    "id": m.id,
                    "action": "ready" if st["state"] == "ready" else "skipped",
                    "pid": None,
                    "message": f"{m.id}: {st['error'] or st['path']}",
                }
            )
            continue
        if st["state"] == "ready":
            out.append({"id": m.id, "action": "ready", "pid": None, "message": f"{m.id}: ready"})
            continue
        if st.get("verified") is False:  # every file is there: fetching again cannot fix it
            out.append(
                {"id": m.id, "action": "failed", "pid": None, "message": f"{m.id}: {st['error']}"}
            )
            continue
        out.append(_start_one(project, m))
    return out


def _start_one(project, m) -> dict:
    dest = destination(project, m)
    folder = job_folder(dest)
    folder.mkdir(parents=True, exist_ok=True)
    kwargs = {
        "dest": str(dest),
        "material_id": m.id,
        "repo": m.repo,
        "repo_type": m.repo_type,
        "patterns": list(m.patterns),
        "revision": revision(m),
        "project": str(project.dir),
    }
    try:
        st = jobs.start_job(folder, JOB_NAME, JOB_TARGET, kwargs)
    except locks.LockHeld as e:
        return {
            "id": m.id,
            "action": "running",
            "pid": e.pid,
            "message": f"{m.id}: already downloading (pid {e.pid})",
        }
    _note(project, f"{m.id}: download of {m.repo} started (pid {st['pid']}) into {dest}")
    return {
        "id": m.id,
        "action": "started",
        "pid": st["pid"],
        "message": f"{m.id}: downloading {m.repo} (pid {st['pid']})",
    }


def stop_download(root, material_id: str) -> str:
    from gguf_trainer.store.project import load_project

    project = load_project(root)
    m = next((m for m in all_materials(project) if m.id == material_id), None)
    if m is None:
        raise UserError(f"unknown material {material_id!r}.")
    return jobs.stop_job(job_folder(destination(project, m)), JOB_NAME)


def download_foreground(
    root,
    ids: list[str] | None = None,
    required_only: bool = False,
    on_progress: hub.Progress | None = None,
    on_line: Callable[[str], None] = print,
) -> int:
    """`gguf-trainer download`: link copies, then fetch each selected material here, under
    the same per-folder lock as the detached job. Returns the number of failures.
    Ctrl-C (KeyboardInterrupt) propagates; the partial file stays and resumes next time."""
    from gguf_trainer.store.project import load_project

    for line in link_found_lines(root, online=True):
        on_line(line)
    project = load_project(root)
    failures = 0
    for m in select(project, ids, required_only):
        st = material_status(project, m)
        refused = st.get("verified") is False  # complete, but its content check fails
        linked_only = not m.is_downloadable  # a file to choose, or a snapshot no repo holds
        if linked_only or st["state"] in ("ready", "downloading") or refused:
            extra = f" (pid {st['pid']})" if st["pid"] else ""
            on_line(f"{m.id}: {st['state']}{extra}" + (f" - {st['error']}" if st["error"] else ""))
            failures += (st["state"] != "ready" and m.required and linked_only) or refused
            continue
        try:
            result = _download_here(project, m, on_progress)
            failures += not _say_content(load_project(root), m, result, on_line)
        except locks.LockHeld as e:
            on_line(f"{m.id}: already downloading elsewhere (pid {e.pid})")
        except UserError as e:
            failures += 1
            on_line(f"{m.id}: failed - {e}")
    return failures


def _say_content(project, m, result: dict, on_line: Callable[[str], None]) -> bool:
    """After a fresh download: the pack's content check (what the folder holds, or the
    sentence naming the file to fix), then "ready at ..."; False when the check refused it."""
    st = material_status(project, m)
    if st.get("verified") is False:
        on_line(f"{m.id}: failed - {st['error']}")
        return False
    if st.get("verified"):
        on_line(f"{m.id}: checked: {st['note']}")
    on_line(f"{m.id}: ready at {result['path']} ({disk_space.gb(result['bytes'])})")
    return True


def _download_here(project, m, on_progress) -> dict:
    dest = destination(project, m)
    folder = job_folder(dest)
    folder.mkdir(parents=True, exist_ok=True)
    with locks.hold_file(
        jobs.lock_path(folder, JOB_NAME), "a download is already running", retry_s=0.2
    ):
        state = {
            "schema": 1,
            "name": JOB_NAME,
            "job_id": f"foreground-{os.getpid()}",
            "target": "foreground",
            "kwargs": {"dest": str(dest), "material_id": m.id},
            "status": "running",
            "pid": os.getpid(),
            "started": time.time(),
            "finished": None,
            "error": None,
            "result": None,
            "progress": {},
        }
        handle = jobs.JobHandle(folder, JOB_NAME, state)
        handle.write()
        try:
            result = _download(
                dest,
                m.id,
                m.repo,
                m.repo_type,
                tuple(m.patterns),
                revision(m),
                lambda fields: (state["progress"].update(fields), handle.write()),
                on_progress,
            )
            state.update(status="done", result=result)
        except UserError as e:
            state.update(status="failed", error=str(e))
            raise
        except KeyboardInterrupt:
            state.update(status="stopped", error="interrupted; run download again to resume")
            raise
        finally:
            state["finished"] = time.time()
            handle.write()
    _record_path(project.dir, m.id, dest)
    _note(project, f"{m.id}: {m.repo} is complete at {dest}")
    return result


# ---- terminal helpers for the CLI ------------------------------------------------------------
class FileBars:
    """`on_progress` for the foreground CLI: one tqdm bar per file, closed when it is done."""

    def __init__(self):
        self.bars: dict[str, object] = {}

    def __call__(self, path: str, done: int, total: int) -> None:
        from tqdm import tqdm

        bar = self.bars.get(path)
        if bar is None:
            bar = self.bars[path] = tqdm(
                total=total,
                initial=done,
                desc=path[-40:],
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                leave=True,
            )
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


def check_materials(proj, only: list[str] | None) -> list[str]:
    """Precompute still to do: the student and the teacher must be there now, so `start`
    says what is missing (the path tried, the command that fixes it) instead of launching a
    pipeline that fails a few seconds later. A copied or moved project whose materials are
    not at their recorded paths first looks for them by identity where discovery looks
    (GGUF_TRAINER_MATERIALS, other projects, the Hugging Face cache) and links each copy it
    finds; what is still missing is named with the `link` command. Torch-free."""
    from gguf_trainer.store.project import load_project  # as every function here

    if only and not any(s in SHARD_STAGES for s in only):
        return []
    done = all(
        (proj.paths.shard_dir(split) / "manifest.json").is_file() for split in ("val", "train")
    )
    if done:  # a resume or a re-export: the pipeline decides what it needs
        return []
    try:
        _need_materials(proj)
        return []
    except UserError as e:
        unverified: dict[str, list[str]] = {}  # copied by hand: the user links it, not we
        linked = link_found(proj.paths.root, unverified_over=unverified)
        if not linked:
            raise _with_found(e, unverified) from None
    try:
        _need_materials(load_project(proj.paths.root))  # the rest, named with `link`
    except UserError as e:
        raise _with_found(e, unverified) from None
    return [it["message"] for it in linked]


def _with_found(error: UserError, unverified: dict[str, list[str]]) -> UserError:
    """The missing-material sentence, with the first complete copy found on disk that has no
    download record (it was not linked; the sentence says how to accept it)."""
    lines = [f"{mid}: {line}" for mid, found in unverified.items() for line in found]
    if not lines:
        return error
    return UserError(f"{str(error).rstrip('.')}; found for {lines[0]}.")


def _need_materials(proj) -> None:
    from gguf_trainer.materials import materials

    materials.student_paths(proj)
    if not (proj.settings.precompute.mock_teacher or env_wants_mock()):
        materials.teacher_paths(proj)
