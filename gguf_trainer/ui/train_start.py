"""Train tab › Start from the page: save the Setup form's unsaved changes, say when training
is already done, name the required materials that are not ready, then start.

No components here: train_tab.py wires the Start button to `start_from_page` and shows
its outcome. Starting is api.start, the same control function `gguf-trainer start` calls.

    out = start_from_page(fm, project, read, values)  # out.started, out.message, ...
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.jsonvals import get_dotted
from gguf_trainer.runner import control
from gguf_trainer.ui import api, common, form
from gguf_trainer.ui.form_save import Saved, save_form
from gguf_trainer.ui.materials_section import missing_materials
from gguf_trainer.ui.train_view import planned_steps, step_counts


@dataclass
class StartOutcome:
    """What Start did: `started` (and `pid`), `message` (one or two sentences for a toast),
    `saved` (form_save.Saved when the Setup form had changes, else None), `missing` (required
    materials that are not ready, named before starting)."""

    started: bool
    message: str
    saved: Saved | None = None
    missing: list = field(default_factory=list)
    pid: int | None = None
    suggest_steps: int | None = None  # a finished run: the Planned steps value offered


def _changed_names(fm: form.Form, keys) -> str:
    """The fields Start saved, as the Setup tab labels them."""
    return ", ".join(
        f"{(fm.fields[k].meta.get('label') or k) if k in fm.fields else k} ({k})" for k in keys
    )


def _finished(project: str) -> tuple[int, int] | None:
    """(done, planned) when the run is done and training has reached the planned steps."""
    info = control.status(project)
    done, planned = step_counts(info, planned_steps(project))
    if (
        info.get("status") == "done"
        and done is not None
        and planned is not None
        and done >= planned
    ):
        return int(done), int(planned)
    return None


def start_from_page(
    fm: form.Form, project: str | None, read: dict | None, vals: list
) -> StartOutcome:
    """Start as the page shows it: unsaved Setup changes are saved first through the same
    compare-and-set as Save, and a change that was not saved (changed on disk since the page
    read it, or invalid) starts nothing: the fields say why. Required materials that are not
    ready are named before starting; control.start then refuses with the path and the fix
    when the run really needs them (a resume past precompute does not)."""
    project = common.need_project(project)
    saved = save_form(fm, project, read, vals) if read else None
    if saved is not None and saved.result is None:
        saved = None  # nothing had changed: nothing to report
    if saved is not None and not saved.ok:
        undo_save(project, read, saved)  # a Start that does not start saves nothing
        return StartOutcome(
            False,
            "Not started, and nothing saved: some of your Setup changes cannot be saved "
            "(see the fields marked ⚠ on the Setup tab); fix them or reload, "
            "then press Start again.",
            Saved(read, saved.message, saved.marks, saved.result),
            [],
        )
    finished = _finished(project) if saved is None else None
    if finished:  # starting would redo nothing: say so and offer more steps instead
        done, planned = finished
        more = planned + max(1000, planned // 2)
        return StartOutcome(
            False,
            f"Training is already done ({done} / {planned} steps). To train "
            f"further, raise Planned steps (offered: {more}) and press Apply, then "
            "Start; the export and eval boxes rebuild from best.pt.",
            suggest_steps=more,
        )
    missing = missing_materials(project)
    note = (
        f"Saved your Setup changes: {_changed_names(fm, saved.result['applied'])}. "
        if saved
        else ""
    )
    try:
        pid = api.start(project)["pid"]
    except UserError as e:
        if saved is None:
            return StartOutcome(False, f"Not started: {e}", None, missing)
        undo_save(project, read, saved)  # a Start that does not start saves nothing
        kept = ("Your Setup changes were not saved (they are still in the fields: Save "
                "keeps them).")
        return StartOutcome(False, f"Not started: {e} {kept}",
                            Saved(read, kept, saved.marks, None), missing)
    return StartOutcome(True, f"{note}Pipeline started (pid {pid}).", saved, missing, pid)


def undo_save(project: str, read: dict, saved: Saved) -> None:
    """Put back the fields a Start saved before it was refused: the values the page read,
    compare-and-set against what the save wrote (a field changed on disk meanwhile is left
    as it is now)."""
    applied = list((saved.result or {}).get("applied") or ())
    if not applied:
        return
    before = {key: get_dotted(read["values"], key) for key in applied}
    api.save_settings(project, before, saved.read["values"] if saved.read else None)


def missing_warning(missing: list[str]) -> str:
    return (
        f"Required materials not ready: {', '.join(missing)}. Download or link them on the "
        "Setup tab (a run that still has to precompute stops at once without them)."
    )
