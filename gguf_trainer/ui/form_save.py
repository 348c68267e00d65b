"""Saving the Setup form: compare-and-set of the fields the user changed against what the
page read, each refusal or conflict marked next to its field.

Used by the Setup tab's Save and by the Train tab's Start (which saves unsaved changes
first). It calls api.save_settings, the same control function `gguf-trainer set` calls, and
never overwrites a field changed on disk since the page read it.

    saved = save_form(fm, project, read, values)  # saved.read, saved.message, saved.marks
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from gguf_trainer.base.errors import UserError
from gguf_trainer.runner import control
from gguf_trainer.ui import api, form


@dataclass
class Saved:
    """What `save_form` did: `read` (the page's new read state), `message` (for save_md),
    `marks` (updates for form.comps: each problem next to its field), `result` (the
    UpdateResult dict, None when nothing had changed), `ok` (nothing is left unsaved)."""

    read: dict | None
    message: str
    marks: list
    result: dict | None

    @property
    def ok(self) -> bool:
        return self.result is None or bool(self.result.get("ok"))


def save_form(fm: form.Form, project: str, rd: dict | None, vals: list) -> Saved:
    """Save the form's changed fields with compare-and-set against what the page read (the
    Save button, and Start before it starts): a field changed on disk since then is not
    overwritten, invalid values are refused, each next to its field."""
    if not rd:
        raise UserError("project.json could not be read; fix it (see the message above) and reopen")
    view = control.open_project(project)
    pack_id = (view.pack or {}).get("id")
    chg = form.changes(fm, rd["values"], list(vals), form.shown_keys(pack_id))
    if not chg:
        return Saved(rd, "Nothing changed.", form.mark(fm, {}, pack_id), None)
    res = api.save_settings(project, chg, rd["values"])
    fresh = control.open_project(project)
    if fresh.ok:  # what is on disk now becomes what the page read, for the saved fields
        rd = {
            "values": _merge_read(rd["values"], fresh.settings, res.get("applied") or {}),
            "version": fresh.version,
        }
    msg = (
        "Saved."
        if res["ok"]
        else ("Not everything was saved:\n\n" + res["message"].replace("\n", "\n\n"))
    )
    if res.get("applied") and not res["ok"]:
        msg += f"\n\nSaved: {', '.join(res['applied'])}"
    return Saved(rd, msg, form.mark(fm, res, pack_id), res)


def _merge_read(old: dict, disk: dict, applied: dict) -> dict:
    """The page's `read` values after a save: saved fields take the disk value; the others
    keep what the page read, so a conflicting field stays a conflict until reloaded."""
    out = copy.deepcopy(old)
    for key in applied:
        node_src, node_dst = disk, out
        *parents, leaf = key.split(".")
        for part in parents:
            node_src = node_src.get(part, {}) if isinstance(node_src, dict) else {}
            node_dst = node_dst.setdefault(part, {})
        if isinstance(node_src, dict) and leaf in node_src:
            node_dst[leaf] = node_src[leaf]
    return out

