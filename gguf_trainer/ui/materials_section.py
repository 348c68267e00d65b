"""Setup tab › Materials: the materials table, Replace, the teacher-code trust notice and
the Hugging Face token, as the updates the Setup tab wires.

Thin views of runner/control.py (the same functions `gguf-trainer materials`, `link`,
`trust` and `login` call), split from setup_tab.py so that one stays a form and its wiring.

    table, fetch, choice, fetch_one = materials_view(project)
    notice, trust_button = trust_view(project)
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from gguf_trainer.errors import UserError
from gguf_trainer.runner import control
from gguf_trainer.runner.status import format_eta
from gguf_trainer.ui import api, common


# ---- HF token (control.store_token: the same store as `gguf-trainer login`) ------------
def token_status() -> str:
    return control.token_status()


def store_token(token: str) -> str:
    """Store the token (0600 where huggingface_hub reads it); returns the status line only."""
    return control.store_token(token)


# ---- materials ---------------------------------------------------------------------------
DOWNLOADABLE = ("missing", "partial", "failed")


def _where(path: str | None) -> str:
    """The last two parts of a path (the full path is in the field below the table)."""
    if not path:
        return "—"
    parts = Path(path).parts
    return "`…/" + "/".join(parts[-2:]) + "`" if len(parts) > 2 else f"`{path}`"


def _origin(m: dict) -> str:
    """Where a material came from (material status `source`): "downloaded", "in the project
    folder" or "linked from …/<folder>"; "—" while it is not set."""
    source = m.get("source") or ""
    if source.startswith("linked from /"):
        return "linked from " + _where(source.removeprefix("linked from "))
    return source or "—"


def materials_view(project: str | None) -> tuple:
    """(table markdown, Download-missing button, per-material dropdown, its button)."""
    off = gr.update(interactive=False)
    if not project:
        return "", off, gr.update(choices=[], value=None), off
    got = api.materials(project)
    rows, can_fetch, busy = [], [], False
    for m in got["materials"]:
        st = m.get("state", "")
        busy |= st == "downloading"
        if st in DOWNLOADABLE and m.get("kind") == "hf_snapshot" and m.get("wanted", True):
            can_fetch.append((m.get("title") or m["id"], m["id"]))
        done, total = m.get("bytes_done"), m.get("bytes_total")
        prog = f"{100 * done / total:.0f}%" if total and done is not None else "—"
        rate = f"{common.fmt_size(m['rate_bps'])}/s" if m.get("rate_bps") else "—"
        eta = format_eta(m.get("eta_s")) if st == "downloading" else "—"
        why = m.get("error") or m.get("note") or ""
        rows.append(
            [
                m.get("title") or m["id"],
                "required" if m.get("required") else "optional",
                st.upper() if st == "failed" else st,
                f"{common.fmt_size(done)} / {common.fmt_size(total)}",
                prog,
                rate,
                eta,
                _origin(m),
                (_where(m.get("path")) + (f" — {why}" if why else ""))
                if m.get("path")
                else (why or "—"),
            ]
        )
    table = common.md_table(
        ["material", "need", "status", "size", "progress", "rate", "ETA", "from", "where"], rows
    )
    # Disabled while a download runs (a second click can never start a duplicate) and when
    # every file is present.
    fetch = gr.update(interactive=bool(can_fetch) and not busy)
    return (
        (table or "This pack needs no materials."),
        fetch,
        gr.update(choices=can_fetch, value=can_fetch[0][1] if can_fetch else None),
        fetch,
    )


def replace_choices(project: str | None):
    """The Replace dropdown: every material of the project's pack."""
    got = api.materials(project) if project else {}
    choices = [(m.get("title") or m["id"], m["id"]) for m in got.get("materials") or []]
    return gr.update(choices=choices, value=choices[0][1] if choices else None)


def replace_material(project: str, material_id: str | None, path: str) -> str:
    """Link `path` as `material_id` (the same check as `gguf-trainer link`: a complete copy,
    a GGUF for the student); returns the sentence for the toast."""
    if not material_id:
        raise UserError("choose the material to replace")
    if not (path or "").strip():
        raise UserError("type or browse to the folder or file to use instead")
    row = control.link_material(project, material_id, path.strip())
    return (f"{row.get('title') or material_id}: now {row.get('state')}, {_origin(row)} "
            f"({row.get('path')})")


# ---- trusting a teacher snapshot's own code ---------------------------------------------
def _untrusted(project: str | None) -> list[dict]:
    return control.untrusted_code(project) if project else []


def trust_view(project: str | None) -> tuple:
    items = _untrusted(project)
    if not items:
        return gr.update(value="", visible=False), gr.update(visible=False)
    lines = [
        (
            "**This teacher runs its own Python code** (`trust_remote_code`). Read it, then "
            "confirm once; changed code asks again."
        )
    ]
    for it in items:
        why = (
            "its code changed since you confirmed it"
            if it["reason"] == "changed"
            else "never confirmed"
        )
        files = ", ".join(f"`{f}`" for f in it["files"][:8]) + (
            " …" if len(it["files"]) > 8 else ""
        )
        lines.append(
            f"* {it['title']}: `{it['path']}` ({why}); runs {files}; code sha256 "
            f"`{it['code_hash'][:16]}…`"
        )
    return gr.update(value="\n".join(lines), visible=True), gr.update(visible=True)
