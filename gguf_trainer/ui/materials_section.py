"""Setup tab › Materials: the materials table, Download, Replace, the teacher-code trust
notice and the Hugging Face token: the components, their views and their wiring.

Thin views of runner/control/ (the same functions `gguf-trainer materials`, `link`,
`trust` and `login` call), split from setup_tab.py so that one stays a form and its wiring.

    parts = build()
    table, fetch, choice, fetch_one = materials_view(project)  # outputs(parts), in order
    notice, trust_button = trust_view(project)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from gguf_trainer.base.errors import UserError
from gguf_trainer.runner import control
from gguf_trainer.runner.status import format_eta
from gguf_trainer.ui import api, common


@dataclass
class MaterialsParts:
    md: gr.Markdown
    download: gr.Button
    one_material: gr.Dropdown
    one_download: gr.Button
    replace_id: gr.Dropdown
    replace_path: gr.Textbox
    replace_browse: gr.Button
    replace_button: gr.Button
    trust_md: gr.Markdown
    trust_button: gr.Button
    token: gr.Textbox
    token_save: gr.Button
    token_md: gr.Markdown


def build() -> MaterialsParts:
    with gr.Accordion(
        "Material status and Hugging Face token", open=True, elem_id="setup-materials"
    ):
        materials_md = gr.Markdown("", elem_id="materials-md")
        with gr.Row(equal_height=True):
            download = gr.Button("Download missing", interactive=False, elem_id="btn-download")
            one_material = gr.Dropdown([], label="One material", scale=2, elem_id="one-material")
            one_download = gr.Button(
                "Download it", interactive=False, scale=0, elem_id="btn-download-one"
            )
        with gr.Row(equal_height=True):
            replace_id = gr.Dropdown(
                [], label="Replace a material", scale=2, elem_id="replace-material"
            )
            replace_path = gr.Textbox(
                label="with this folder or file (checked, then linked where it is)",
                scale=4,
                elem_id="replace-path",
            )
            replace_browse = gr.Button("Browse…", size="sm", scale=0)
            replace_button = gr.Button("Replace", scale=0, elem_id="btn-replace")
        trust_md = gr.Markdown("", visible=False, elem_id="trust-md")
        trust_button = gr.Button(
            "Trust and run this code", visible=False, variant="stop", elem_id="btn-trust"
        )
        with gr.Row(equal_height=True):
            token = gr.Textbox(
                label="Hugging Face token (stored in huggingface_hub's "
                "token file; never shown again)",
                type="password",
                scale=4,
                elem_id="hf-token",
            )
            token_save = gr.Button("Store token", scale=0, elem_id="btn-token")
        token_md = gr.Markdown(token_status(), elem_id="token-md")
    return MaterialsParts(
        materials_md,
        download,
        one_material,
        one_download,
        replace_id,
        replace_path,
        replace_browse,
        replace_button,
        trust_md,
        trust_button,
        token,
        token_save,
        token_md,
    )


def outputs(p: MaterialsParts) -> list:
    """The components materials_view updates, in its order."""
    return [p.md, p.download, p.one_material, p.one_download]


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
        # a snapshot no repo holds is never downloaded: its row says where to get it
        fetchable = m.get("kind") == "hf_snapshot" and bool(m.get("repo"))
        if st in DOWNLOADABLE and fetchable and m.get("wanted", True):
            can_fetch.append((m.get("title") or m["id"], m["id"]))
        done, total = m.get("bytes_done"), m.get("bytes_total")
        prog = f"{100 * done / total:.0f}%" if total and done is not None else "—"
        rate = f"{common.fmt_size(m['rate_bps'])}/s" if m.get("rate_bps") else "—"
        eta = format_eta(m.get("eta_s")) if st == "downloading" else "—"
        why = common.gui_words(m.get("error") or m.get("note") or "")
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


def download_toast(rows: list[dict]) -> str:
    """One toast for a Download press: a bullet per material that started, runs or is
    skipped (with the sentence saying what to link), in the GUI's words; "" when none."""
    said = [common.gui_words(r["message"]) for r in rows
            if r.get("action") in ("started", "running", "skipped", "failed", "linked")]
    return "\n".join(f"• {line}" for line in said)


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

def missing_materials(project: str) -> list[str]:
    """The wanted, required materials that are not ready ("title (state)"), from material
    status; [] when material status is not available in this version."""
    got = api.materials(project)
    return [
        f"{m.get('title') or m['id']} ({m.get('state')})"
        for m in got.get("materials") or []
        if m.get("wanted", True) and m.get("required") and m.get("state") != "ready"
    ]

# ---- wiring ---------------------------------------------------------------------------
def wire(p: MaterialsParts, project: gr.State, read: gr.State, outs: list, load) -> None:
    """`outs` and `load(project) -> (updates for outs, read state)` are the Setup tab's:
    after Replace the whole tab is refilled (the path field and the table show the new copy)."""

    @common.shown_errors
    def do_token(tok):
        return "", store_token(tok)

    @common.shown_errors
    def do_download(proj, one=None):
        res = api.download_missing(common.need_project(proj), [one] if one else None)
        said = download_toast(res["started"])
        if said:
            common.info(said, title="Materials")
        return materials_view(proj)

    p.token_save.click(do_token, [p.token], [p.token, p.token_md])
    mat_outs = outputs(p)

    @common.shown_errors
    def do_trust(proj):
        trusted = control.trust_code(common.need_project(proj))
        if trusted:  # one toast a press, a line a path
            common.info("\n".join(f"trusted: {path}" for path in trusted))
        return trust_view(proj)

    p.trust_button.click(do_trust, [project], [p.trust_md, p.trust_button])

    @common.shown_errors
    def do_replace(proj, material_id, path):
        common.info(replace_material(common.need_project(proj), material_id, path),
                    title="Materials")
        ups, rd = load(proj)  # the path field and the table show the new copy
        return [rd, *ups]

    p.replace_button.click(do_replace, [project, p.replace_id, p.replace_path], [read, *outs])
    p.download.click(do_download, [project], mat_outs)
    p.one_download.click(do_download, [project, p.one_material], mat_outs)
