"""The GUI's Python API: typed `gr.api` endpoints with stable names for gradio_client.

Each is a thin call into the same control function the CLI uses (runner.control); the
README documents each with a gradio_client example. Errors a user can fix come back as
the one sentence (gradio_client raises AppError with it). Nothing here returns the HF
token: the settings never hold it, and `hf_token_status` only says whether one is stored.
Every call proves the GUI's own token first (ui/gui_token.py: the Bearer header).

    from gradio_client import Client
    c = Client("http://127.0.0.1:8655/", headers={"Authorization": "Bearer " + token})
    c.predict("/tmp/p", "t5xxl_pixart", "", api_name="/create_project")
"""

from __future__ import annotations

import gradio as gr

from gguf_trainer.base.errors import UserError, quote
from gguf_trainer.runner import control, supervisor
from gguf_trainer.ui import common, recent

ENDPOINTS = ("create_project", "open_project", "save_settings", "start", "stop", "kill", "status",
             "set_steps", "snapshot", "export", "list_snapshots", "read_eval", "materials",
             "download_missing", "reset", "reset_plan", "publish_plan", "publish",
             "list_kept_steps", "delete_kept_step")


def create_project(folder: str, pack: str, name: str = "") -> dict:
    """Create a project in `folder` for trainer pack `pack` (optional adapter `name`);
    returns what open_project returns."""
    view = control.new_project(folder, pack, name or None)
    recent.remember(view.root)
    return view.as_dict()


def open_project(folder: str) -> dict:
    """The project's settings (with their `version`), pack description, status and errors."""
    view = control.open_project(folder)
    recent.remember(view.root)
    return view.as_dict()


def save_settings(project: str, changes: dict, expected: dict | None = None) -> dict:
    """Compare-and-set of dotted-key `changes`, e.g. {"train.lr": 1e-4}. `expected` is the
    settings dict you read (open_project's `settings`); fields changed on disk since then
    come back in `conflicts` and are not written; invalid values in `errors` (nothing is
    written then); `ok` is true when everything was saved."""
    if not isinstance(changes, dict):
        raise UserError(f"changes must be an object of dotted setting keys and values, e.g. "
                        f'{{"train.lr": 0.0001}}, not {type(changes).__name__} {quote(changes)}.')
    if expected is not None and not isinstance(expected, dict):
        raise UserError("expected must be the settings object open_project returned (or "
                        f"null), not {type(expected).__name__} {quote(expected)}.")
    return control.update_settings(project, changes, expected).as_dict()


def start(project: str, only: list[str] | None = None, force: bool = False) -> dict:
    """Start (or resume) the pipeline detached; returns {"pid", "status"}."""
    pid = control.start(project, only=list(only) if only else None, force=bool(force))
    supervisor.remember_project(project)
    return {"pid": pid, "status": control.status(project)}


def stop(project: str) -> dict:
    """Ask the pipeline to stop after its current step (saves; resumable). Returns at once:
    {"outcome": "stopping" | "stopped" | "not running"}; poll `status` until it has ended."""
    return {"outcome": control.stop(project, timeout_s=0)}


def kill(project: str) -> dict:
    """SIGKILL a stalled pipeline; it resumes from its last checkpoint."""
    return {"outcome": control.kill(project)}


def status(project: str) -> dict:
    """The `gguf-trainer status --json` dict."""
    return control.status(project)


def set_steps(project: str, steps: str) -> dict:
    """Set train.steps ("12000", "12_000", "40k"), also while running."""
    return control.set_steps(project, steps).as_dict()


def snapshot(project: str, checkpoint: str = "last", evaluate: bool = False) -> dict:
    """Export a step-tagged GGUF of the last or best checkpoint, or of a kept step
    ("step<N>"), as a detached job (optionally evaluated); follow it in
    status()["jobs"]["snapshot"]."""
    return control.request_snapshot(project, checkpoint, bool(evaluate))


def export(project: str) -> dict:
    """Regenerate the final GGUF and its evaluation from best.pt (export + eval, forced)."""
    return start(project, only=["export", "eval"], force=True)


def list_snapshots(project: str) -> list:
    """snapshots.json: [{step, planned_steps, checkpoint, val_cos, path, size, time, eval}]."""
    return control.list_snapshots(project)


def read_eval(project: str) -> dict | None:
    """eval.json, or None before the first evaluation."""
    return control.read_eval(project)


def materials(project: str) -> dict:
    """Each material's status: {"available": True, "materials": [{id, title, state
    (missing|partial|downloading|ready|failed), bytes_done, bytes_total, rate_bps, eta_s,
    path, required, error, ...}]}."""
    project = str(control.check_folder_arg(project))
    return {"available": True, "materials": control.material_statuses(project)}


def download_missing(project: str, ids: list[str] | None = None) -> dict:
    """Start detached downloads of the missing materials (or of `ids`); a material already
    downloading is reported, never started twice. {"started": [{id, action, pid, message}]}"""
    project = str(control.check_folder_arg(project))
    return {"started": control.start_download(project, list(ids) if ids else None)}


def reset_plan(project: str, target: str) -> dict:
    """Dry run of reset: exactly what it would delete, and why it may be refused now."""
    return control.reset_plan(project, target).as_dict()


def reset(project: str, target: str) -> dict:
    """Delete a stage's outputs (corpus | shards | train | output) and everything built on
    them; refused while a run or job is live. Returns what was deleted."""
    return control.reset(project, target).as_dict()


def publish_plan(project: str) -> dict:
    """What publish would send ({"files", "refused": the sentence or None, "logged_in"});
    no request is made."""
    return control.publish_plan(str(control.check_folder_arg(project)))


def publish(project: str, repo: str, private: bool = False, files: list[str] | None = None,
            license_id: str = "") -> dict:
    """Upload the exported adapter(s) and the model card to the Hub repo `repo` (USER/NAME)
    in one commit, as `gguf-trainer publish` does; a refusal is its one sentence."""
    project = str(control.check_folder_arg(project))
    return control.publish(project, repo, bool(private), list(files) if files else None,
                           license_id or None)


def list_kept_steps(project: str) -> dict:
    """The kept steps (train.history): {"items": [{step, val_cos, val, size, time, reason,
    path}], "total": bytes on disk, "schedule": in words}. Export one with
    snapshot(project, "step<N>")."""
    return control.list_kept_steps(str(control.check_folder_arg(project)))


def delete_kept_step(project: str, step: int) -> dict:
    """Delete kept step `step` (its file and sidecar); refused while a snapshot job runs."""
    project = str(control.check_folder_arg(project))
    return {"deleted": control.delete_kept_step(project, int(step))}


def register(app: gr.Blocks) -> None:
    """Add every endpoint to `app` (inside its `with` block)."""
    for name in ENDPOINTS:
        gr.api(common.user_errors(globals()[name]), api_name=name, concurrency_limit=None)
