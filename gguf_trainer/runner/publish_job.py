"""Publishing as a detached job: the GUI's Publish button (runner/publish.py does the work).

The job is a `runner.jobs` job named "publish" in the project folder, so it outlives the
click, a page reload and the GUI itself, and any client reads how it went from
`publish-job.json` (its phase while it runs, then the repo URL and commit, or the one
sentence it failed with). Its lock is the one `gguf-trainer publish` holds in the
foreground: one publish of a project at a time, whichever started it.

Everything publish refuses before a request (runner.publish.prepare, the repo id, no login)
is refused by start_publish in the caller, as a sentence, before a job is spawned. The upload
itself runs in a child process: huggingface_hub's create_commit blocks in its own threads with
no way to cancel it, so Stop (SIGTERM to the job) ends the child, which is what a kill does to
the CLI - the objects sent whole stay on the Hub, no commit is made, and the next publish sends
only the rest. The child also ends itself when the job is gone (killed -9), so an orphaned
upload never commits behind a job recorded as interrupted.

    start_publish(root, "me/pig_t5_adapter", private=True) -> job state   (UserError, LockHeld)
    publish_status(root)["status"]        running | done | failed | stopped | interrupted | idle
    stop_publish(root)                    "stopped" | "not running" | "stopping"
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import traceback
from pathlib import Path

from gguf_trainer.base.errors import UserError
from gguf_trainer.runner import jobs, publish

JOB_TARGET = "gguf_trainer.runner.publish_job:publish_main"
POLL_S = 0.2
ORPHAN_POLL_S = 0.5
STOP_WAIT_S = 10.0


def start_publish(root, repo: str, private: bool = False, files: list[str] | None = None,
                  license_id: str | None = None) -> dict:
    """Start the publish job (detached); its state once it runs. UserError for what publish
    refuses before any request, LockHeld while a publish of this project runs."""
    from gguf_trainer.base import locks
    from gguf_trainer.materials import hub_upload

    project, _adapters, _companions = publish.prepare(root, files)
    repo = hub_upload.check_repo_id(repo)
    hub_upload.require_token()
    kwargs = {"repo": repo, "private": bool(private), "files": list(files) if files else None,
              "license_id": license_id or None}
    try:
        return jobs.start_job(project.dir, publish.JOB_NAME, JOB_TARGET, kwargs)
    except locks.LockHeld as e:
        raise locks.LockHeld(e.pid, publish.BUSY) from None


def publish_status(root) -> dict:
    """runner.jobs.job_status of the project's publish (a foreground CLI publish too)."""
    from gguf_trainer.store.project import load_project

    return jobs.job_status(load_project(root).dir, publish.JOB_NAME)


def stop_publish(root) -> str:
    from gguf_trainer.store.project import load_project

    return jobs.stop_job(load_project(root).dir, publish.JOB_NAME)


# ---- the job ----------------------------------------------------------------------------
def publish_main(folder: Path, job, *, repo: str, private: bool, files: list[str] | None,
                 license_id: str | None) -> dict:
    """The job body (runner.jobs holds the lock): publish, its upload in a child."""
    def phase(text: str) -> None:
        job.update(phase=text)

    def upload(repo_id, upload_files, private_repo, message):
        return _upload_in_child(job, repo_id, upload_files, private_repo, message)

    result = publish.publish_unlocked(folder, repo, private, files, license_id, phase, upload)
    return publish.job_result(result)


def _upload_in_child(job, repo: str, files: dict, private: bool, message: str) -> dict:
    """hub_upload.upload in a spawned child, polled so Stop can end it mid-upload."""
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads forked
    receive, send = ctx.Pipe(duplex=False)
    plain = {k: v if isinstance(v, bytes) else str(v) for k, v in files.items()}
    child = ctx.Process(target=_child_main, name="publish-upload",
                        args=(send, os.getpid(), repo, plain, private, message))
    child.start()
    send.close()  # ours closed: the child's end closing (it ended) reads as EOF here
    try:
        while not receive.poll(POLL_S):
            job.check()
    except jobs.JobStopped:
        child.terminate()
        child.join(STOP_WAIT_S)
        if child.is_alive():
            child.kill()
            child.join()
        raise
    try:
        kind, value = receive.recv()
    except (EOFError, OSError):
        kind, value = None, None
    child.join()
    if kind == "ok":
        return value
    if kind == "error":
        raise UserError(value)
    raise UserError(f"the upload to {repo} ended without an answer (exit code "
                    f"{child.exitcode}); publish again: the objects sent whole stay on the "
                    "Hub, so only the rest is sent.")


def _child_main(conn, parent: int, repo: str, files: dict, private: bool, message: str) -> None:
    from gguf_trainer.materials import hub_upload

    def orphaned() -> None:  # the job was killed: stop before a commit nobody records
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(ORPHAN_POLL_S)

    threading.Thread(target=orphaned, daemon=True).start()
    files = {k: v if isinstance(v, bytes) else Path(v) for k, v in files.items()}
    try:
        conn.send(("ok", hub_upload.upload(repo, files, private, message)))
    except UserError as e:
        conn.send(("error", str(e)))
    except Exception as e:  # noqa: BLE001 - the job's log gets the traceback, the GUI a line
        traceback.print_exc()
        why = f"publishing to {repo} failed ({type(e).__name__}); see publish.log in the project"
        conn.send(("error", why))
    finally:
        conn.close()
