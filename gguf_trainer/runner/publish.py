"""`gguf-trainer publish` and the Output tab's Publish box: a project's adapter and its model
card on the Hugging Face Hub, in one commit.

What goes up is the project's own exports (exports.json's records, as `reset output` trusts
them) and the card (store/model_card.py), nothing else: by default every exported final
adapter and companion file that is on disk; `files` picks recorded exports by name or path
instead (a snapshot, one of several). Everything that can refuse does so before any request
is made: a file the project did not export, a file ggk would not load, an adapter made with
the mock teacher, against the demo's tiny stand-in student (its input width is not pig_clip's)
or from a tiny stand-in teacher, a repo id that is not USER/NAME, no login. Then the license
fields the saved listings lack are asked of the Hub (best effort), and materials/hub_upload.py
uploads: a second publish after a kill sends only the objects the Hub lacks, one commit.

Torch-free (the adapters are read by their GGUF header and tensor table).

    publish(root, "me/pig_t5_adapter", private=True)   # {"url", "commit", "files", ...}
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from gguf_trainer.base import atomic, places
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import TINY_MARKER

log = logging.getLogger(__name__)

DEFAULT_KINDS = ("final", "companion")  # what `publish` takes without --file
ADAPTER_KINDS = ("final", "snapshot", "copy")  # records that are adapters (companions are not)


def _recorded(project) -> list[dict]:
    from gguf_trainer.runner.reset import recorded_exports

    seen, out = set(), []
    for e in recorded_exports(project.paths):
        real = os.path.realpath(e["path"])
        if e.get("exists") and real not in seen:
            seen.add(real)
            out.append(e)
    return out


def choose_files(project, files: list[str] | None = None) -> list[dict]:
    """The recorded exports to publish: [{path, kind, ...}], adapters first. UserError for a
    file the project did not export, none exported, or two files of one name."""
    recorded = _recorded(project)
    if not files:
        chosen = [e for e in recorded if e["kind"] in DEFAULT_KINDS]
        if not any(e["kind"] in ADAPTER_KINDS for e in chosen):
            raise UserError(
                f"{project.settings.name} has no exported adapter on disk to publish "
                f"({project.final_gguf.name}); run the project to its export "
                f"(`gguf-trainer start --project {project.dir}`) or name an exported file "
                "with --file."
            )
    else:
        chosen = []
        for given in files:
            real = os.path.realpath(Path(given).expanduser())
            match = [e for e in recorded if os.path.realpath(e["path"]) == real
                     or Path(e["path"]).name == given]
            if not match:
                names = ", ".join(sorted({Path(e["path"]).name for e in recorded})) or "none"
                raise UserError(
                    f"{given} is not a file this project exported; publish sends only its own "
                    f"exports (on disk now: {names})."
                )
            chosen += [e for e in match if e not in chosen]
    names = [Path(e["path"]).name for e in chosen]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"two chosen files are both named {twice[0]}, and a repo holds one file "
                        "of a name; pick one of them with --file.")
    if not any(e["kind"] in ADAPTER_KINDS for e in chosen):
        raise UserError("the chosen files hold no adapter (a companion goes with its adapter); "
                        "add the adapter with --file.")
    return sorted(chosen, key=lambda e: e["kind"] not in ADAPTER_KINDS)


def _stand_in_teacher(project) -> str | None:
    for m in project.pack.teacher_materials:
        folder = project.material_path(m.id)
        if folder is not None and (Path(folder) / TINY_MARKER).exists():
            return m.title
    return None


def refuse_stand_ins(project, name: str, view) -> None:
    """One sentence, before anything is sent, for an adapter not fit to share: mock teacher,
    the demo's tiny student, a tiny stand-in teacher."""
    from gguf_trainer.materials.discovery import PIG_CLIP, student_layout

    if view.metadata.get("adapter.mock_teacher") or project.settings.precompute.mock_teacher:
        raise UserError(
            f"{name} was trained with the mock teacher (precompute.mock_teacher): a smoke test "
            "of the machinery, not an adapter to share; train it with the real teacher first."
        )
    student = project.material_path("student")
    tiny = view.in_dim != PIG_CLIP["hidden"]
    if not tiny and student is not None and student.is_file():
        try:
            tiny = bool(student_layout(student)["tiny"])
        except UserError:  # unreadable now: the adapter's own width already said pig_clip's
            tiny = False
    if tiny:
        why = (f"input width {view.in_dim}, pig_clip's is {PIG_CLIP['hidden']}"
               if view.in_dim != PIG_CLIP["hidden"] else "the project's student file is it")
        raise UserError(
            f"{name} was trained against the demo's tiny stand-in student ({why}), so it fits "
            "only that stand-in; train it against the real pig_clip-f16.gguf first."
        )
    teacher = _stand_in_teacher(project)
    if teacher:
        raise UserError(
            f"{name} was trained on a tiny stand-in teacher made by gguf-trainer ({teacher}: "
            "random weights for the demo and tests); train it with the real teacher first."
        )


def _describe(project, chosen: list[dict]) -> tuple[list[dict], list[dict]]:
    """{name, path, size, metadata} of the adapters and the companions, each adapter read as
    the engine reads it (header and tensor table) and checked by refuse_stand_ins."""
    from gguf_trainer.model.adapter_file import read_adapter

    adapters, companions = [], []
    for e in chosen:
        path = Path(e["path"])
        item = {"name": path.name, "path": path, "size": path.stat().st_size, "metadata": {}}
        if e["kind"] in ADAPTER_KINDS:
            view = read_adapter(path)
            if view.refusals:
                raise UserError(f"{path.name} is not an adapter ggk would load "
                                f"({view.refusals[0].rstrip('.')}); re-export it.")
            refuse_stand_ins(project, path.name, view)
            item["metadata"] = {**view.metadata, "adapter.in_dim": view.in_dim}
            adapters.append(item)
        else:
            companions.append(item)
    return adapters, companions


def _evaluation(project, adapter: dict) -> dict | None:
    """eval.json when it is of this very file (its recorded place and bytes), else None."""
    try:
        ev = atomic.read_json(project.paths.eval_json, inside=project.paths.root)
    except (ValueError, OSError):
        return None
    if not isinstance(ev, dict):
        return None
    key = places.record_key(adapter["path"], project.dir.resolve())
    if ev.get("gguf") != key or ev.get("gguf_sha256") not in (None, adapter["sha256"]):
        return None
    return ev


def hub_licenses(source_lists: dict) -> dict[str, str]:
    """repo -> the license its Hub card states, for the sources whose saved listing has none.
    Best effort: a repo the Hub does not answer for keeps no entry (the card says so)."""
    from huggingface_hub import HfApi

    from gguf_trainer.materials.hub import endpoint, get_token

    api = HfApi(endpoint=endpoint(), token=get_token() or False)
    out = {}
    for kind, items in (("model", source_lists["teacher"] + source_lists["student"]),
                        ("dataset", source_lists["datasets"])):
        for s in items:
            if not s.get("repo") or s.get("license") or s["repo"] in out:
                continue
            try:
                info = api.repo_info(s["repo"], repo_type=kind,
                                     revision=s.get("commit") or s.get("revision") or None)
            except Exception as exc:  # noqa: BLE001 - any failure: the card says "not stated"
                log.info("publish: no license read for %s (%s)", s["repo"], type(exc).__name__)
                continue
            lic = getattr(getattr(info, "card_data", None), "license", None)
            if isinstance(lic, list):
                lic = ", ".join(str(x) for x in lic)
            if isinstance(lic, str) and lic:
                out[s["repo"]] = lic
    return out


def prepare(root, files: list[str] | None = None) -> tuple:
    """Everything publish checks locally, no request made: (project, adapters, companions)."""
    from gguf_trainer.store.project import load_project

    project = load_project(root)
    adapters, companions = _describe(project, choose_files(project, files))
    return project, adapters, companions


JOB_NAME = "publish"  # runner.jobs' name: the lock and state every publish of a project shares
BUSY = "a publish of this project is already running"


def publish(root, repo: str, private: bool = False, files: list[str] | None = None,
            license_id: str | None = None) -> dict:
    """Publish the project's adapter(s) and a model card to `repo` (USER/NAME) in one commit,
    in this process (the CLI; the GUI starts publish_job's detached job instead). Returns
    {"url", "commit", "created", "changed", "files", "card"}; UserError (one sentence) for
    anything refused or failed; LockHeld while another publish of the project runs. Holds the
    publish job's lock and writes its state, so the GUI shows a CLI publish as it runs."""
    from gguf_trainer.base import locks
    from gguf_trainer.runner import jobs
    from gguf_trainer.store.project import load_project

    folder = load_project(root).dir
    with locks.hold_file(jobs.lock_path(folder, JOB_NAME), BUSY, retry_s=0.2):
        state = {"schema": 1, "name": JOB_NAME, "job_id": f"foreground-{os.getpid()}",
                 "target": "foreground", "status": "running", "pid": os.getpid(),
                 "kwargs": {"repo": repo, "private": bool(private), "files": files,
                            "license_id": license_id},
                 "started": time.time(), "finished": None, "error": None, "result": None,
                 "progress": {}}
        handle = jobs.JobHandle(folder, JOB_NAME, state)
        handle.write()
        try:
            result = publish_unlocked(folder, repo, private, files, license_id,
                                      lambda phase: handle.update(phase=phase))
            state.update(status="done", result=job_result(result))
            return result
        except UserError as e:
            state.update(status="failed", error=str(e))
            raise
        except KeyboardInterrupt:
            state.update(status="stopped", error="interrupted; publish again to send the rest")
            raise
        finally:
            state["finished"] = time.time()
            handle.write()


def publish_unlocked(root, repo: str, private: bool, files: list[str] | None,
                     license_id: str | None, phase=lambda text: None, upload=None) -> dict:
    """publish()'s work, for a caller that holds the lock: the checks, the card, then
    `upload` (hub_upload.upload's signature; publish_job runs it in a child it can stop).
    `phase(text)` hears what it does now."""
    from gguf_trainer.base.safe_delete import sha256_file
    from gguf_trainer.materials import hub_upload
    from gguf_trainer.store.model_card import model_card, sources

    project, adapters, companions = prepare(root, files)
    repo = hub_upload.check_repo_id(repo)
    hub_upload.require_token()
    everything = [*adapters, *companions]
    phase(f"hashing {len(everything)} file(s), {_mb(sum(f['size'] for f in everything))}")
    for f in everything:  # for the card (the GUI's plan skips reading them whole)
        f["sha256"] = sha256_file(f["path"])
    phase("reading the sources' licenses from the Hub")
    licenses = hub_licenses(sources(project))
    card = model_card(project, adapters, companions, licenses,
                      _evaluation(project, adapters[0]), license_id)
    upload_files = {f["name"]: f["path"] for f in everything}
    upload_files["README.md"] = card.encode("utf-8")
    steps = adapters[0]["metadata"].get("adapter.trained_steps")
    message = f"Upload {adapters[0]['name']}" + (f" (step {steps})" if steps else "")
    phase(f"uploading {', '.join(upload_files)} to {repo}")
    result = (upload or hub_upload.upload)(repo, upload_files, private, message)
    log.info("publish: %s -> %s at %s", ", ".join(upload_files), repo, result["commit"])
    return {**result, "files": list(upload_files), "card": card,
            "visibility_kept": bool(private) and not result["created"]}


def job_result(result: dict) -> dict:
    """What the job state keeps of a publish's result: all describe() reads, not the card."""
    return {k: v for k, v in result.items() if k != "card"}


def _mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def describe(result: dict, private_word: str = "--private") -> list[str]:
    """The lines `gguf-trainer publish` prints and the GUI shows (`private_word`: what the
    asking for a private repo is called there)."""
    what = ", ".join(result["files"])
    made = "created and " if result["created"] else ""
    lines = [f"published {what} to {result['url']} ({made}commit {result['commit'][:10]})."
             if result["changed"] else
             f"{result['url']} already holds {what} as they are; nothing was committed."]
    if result.get("visibility_kept"):
        lines.append(f"the repo existed already, so {private_word} left its visibility as it was; "
                     "change it in the repo's settings on the Hub.")
    return lines
