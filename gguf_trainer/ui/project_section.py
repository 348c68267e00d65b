"""Setup tab › Open or create a project: the recent projects, the folder to open, the new
project's pack, name and parent folder, and the summary line of the project that is open.

Thin calls into api.py (creating is control.new_project, as `gguf-trainer new` does); after
opening or creating, the whole Setup tab is refilled through the tab's `load`.

    parts = build()
    wire(parts, project, read, outs, load, after_open)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import PROJECTS_ROOT
from gguf_trainer.runner import control
from gguf_trainer.ui import api, common


@dataclass
class ProjectParts:
    md: gr.Markdown
    recent: gr.Dropdown
    open_path: gr.Textbox
    open_browse: gr.Button
    open_button: gr.Button
    pack: gr.Dropdown
    pack_info: gr.Markdown
    create_parent: gr.Textbox
    create_browse: gr.Button
    create_name: gr.Textbox
    create_button: gr.Button


def _pack_choices() -> list[tuple[str, str]]:
    """The packs grouped by the engine family they train for (a pack without one is its own),
    each label naming the engine models its adapter serves."""
    packs = sorted(control.list_packs(), key=lambda p: (p.get("family") or p["title"]).lower())
    return [(_pack_label(p), p["id"]) for p in packs]


def _pack_label(p: dict) -> str:
    """The title, led by the family only where the title does not already name it, and the
    engine models it serves only where those are not the title's own words again."""
    family, title, serves = p.get("family") or "", p["title"], p.get("serves") or ""
    label = title if not family or title.lower().startswith(family.lower()) else (
        f"{family}: {title}")
    head = serves.split(" (")[0]
    if serves and not title.lower().startswith(head.lower()):
        label += f", serves {serves}"
    return f"{label} ({p['id']})"


def pack_description(pack_id: str | None) -> str:
    for p in control.list_packs():
        if p["id"] == pack_id:
            mats = ", ".join(
                f"{m['title']}" + (f" ~{m['size_gb']:g} GB" if m.get("size_gb") else "")
                for m in p.get("materials") or []
            )
            serves = f"\n\nServes: {p['serves']}" if p.get("serves") else ""
            return f"**{p['title']}** — {p['description']}{serves}\n\nNeeds: {mats}"
    return ""


def build() -> ProjectParts:
    with gr.Accordion("Open or create a project", open=True, elem_id="setup-project"):
        project_md = gr.Markdown("No project open.", elem_id="project-md")
        with gr.Row(equal_height=True):
            recent_dd = gr.Dropdown([], label="Recent projects", scale=3, elem_id="recent")
        with gr.Row(equal_height=True):
            open_path = gr.Textbox(
                label="Open a project folder",
                scale=4,
                elem_id="open-path",
                placeholder=str(PROJECTS_ROOT / "my_adapter"),
            )
            open_browse = gr.Button("Browse…", size="sm", scale=0)
            open_button = gr.Button("Open", scale=0, elem_id="btn-open")
        with gr.Group():
            choices = _pack_choices()
            # the first registered pack (PixArt, the demo's), not the first by family; the
            # description below is of that same pack
            first = (control.list_packs() or [{"id": None}])[0]["id"]
            with gr.Row(equal_height=True):
                pack = gr.Dropdown(
                    choices,
                    value=first,
                    label="New project: trainer pack",
                    scale=2,
                    elem_id="new-pack",
                )
                create_name = gr.Textbox(
                    label="Folder name",
                    scale=2,
                    elem_id="new-name",
                    placeholder="empty: the pack's default name",
                )
            pack_info = gr.Markdown(pack_description(first), elem_id="pack-info")
            with gr.Row(equal_height=True):
                create_parent = gr.Textbox(
                    str(PROJECTS_ROOT), label="Create it in", scale=4, elem_id="new-parent"
                )
                create_browse = gr.Button("Browse…", size="sm", scale=0)
                create_button = gr.Button(
                    "Create", variant="primary", scale=0, elem_id="btn-create"
                )
    return ProjectParts(
        project_md,
        recent_dd,
        open_path,
        open_browse,
        open_button,
        pack,
        pack_info,
        create_parent,
        create_browse,
        create_name,
        create_button,
    )


def project_summary(view: dict) -> str:
    """The open project in one line: folder, pack, run status, MOCK, then its errors."""
    st = view.get("status") or {}
    pack = view.get("pack") or {}
    text = (
        f"**{Path(view['root']).name}** · `{view['root']}` · pack **{pack.get('title', '?')}** · "
        f"{st.get('status', '?')}"
    )
    if st.get("mock") or ((view.get("settings") or {}).get("precompute") or {}).get("mock_teacher"):
        text += " · **MOCK teacher**"
    for e in view.get("errors") or []:
        text += f"\n\n⚠ {e}"
    return text


def wire(p: ProjectParts, project: gr.State, read: gr.State, outs: list, load, after_open) -> None:
    """`outs` and `load(root) -> (updates for outs, read state)` are the Setup tab's (both
    handlers refill the whole tab); `after_open` is the app's event dict run after them."""

    @common.shown_errors
    def do_open(path):
        if not path:
            raise UserError("type or browse to a project folder first")
        view = api.open_project(path)
        ups, rd = load(view["root"])
        return [view["root"], rd, *ups]

    @common.shown_errors
    def do_create(parent, name, pack_id):
        if not parent:
            raise UserError("choose the folder to create the project in")
        from gguf_trainer.packs import get_pack
        from gguf_trainer.store.project_schema import default_name

        folder_name = (name or "").strip() or default_name(
            get_pack(pack_id).default_name
        ).removeprefix("pig_")
        view = api.create_project(
            str(Path(parent).expanduser() / folder_name), pack_id, (name or "").strip()
        )
        common.info(f"project created: {view['root']}")
        ups, rd = load(view["root"])
        return [view["root"], rd, *ups]

    open_outs = [project, read, *outs]
    p.open_button.click(do_open, [p.open_path], open_outs).then(**after_open)
    p.open_path.submit(do_open, [p.open_path], open_outs).then(**after_open)
    p.recent.input(do_open, [p.recent], open_outs).then(**after_open)
    p.create_button.click(do_create, [p.create_parent, p.create_name, p.pack], open_outs).then(
        **after_open
    )
    p.pack.change(pack_description, [p.pack], [p.pack_info])
