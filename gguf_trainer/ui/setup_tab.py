"""Setup tab: open or create a project, materials and the HF token, the settings form, Save.

Handlers are thin: they call the API functions (api.py, the same control functions the CLI
calls) and map results to updates. The page keeps what it read (`read` state: values and
version) only to send the fields the user changed and let compare-and-set catch fields
changed on disk in between. Paths are typed or picked with the confined file browser
(files.py); nothing is uploaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from gguf_trainer.errors import UserError
from gguf_trainer.paths import PROJECTS_ROOT
from gguf_trainer.runner import control
from gguf_trainer.ui import api, common, files, form, recent
from gguf_trainer.ui.materials_section import (  # the Materials part of this tab
    materials_view,
    replace_choices,
    replace_material,
    store_token,
    token_status,
    trust_view,
)


@dataclass
class SetupParts:
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
    project_md: gr.Markdown
    materials_md: gr.Markdown
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
    form: form.Form
    preflight: gr.Button
    preflight_md: gr.Markdown
    save: gr.Button
    save_md: gr.Markdown
    # file browser
    browser: gr.Group
    browser_for: gr.Markdown
    browser_msg: gr.Markdown
    target: gr.State
    root: gr.Dropdown
    folder: gr.Textbox
    entries: gr.Radio
    up: gr.Button
    use: gr.Button
    close: gr.Button
    roots_text: gr.Textbox
    roots_save: gr.Button


def _pack_choices() -> list[tuple[str, str]]:
    """The packs grouped by the engine family they train for (a pack without one is its own),
    each label naming the engine models its adapter serves."""
    packs = sorted(control.list_packs(), key=lambda p: (p.get("family") or p["title"]).lower())
    return [((f"{p['family']}: " if p.get("family") else "") + f"{p['title']} ({p['id']})"
             + (f", serves {p['serves']}" if p.get("serves") else ""), p["id"]) for p in packs]


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


def build() -> SetupParts:
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
            with gr.Row(equal_height=True):
                pack = gr.Dropdown(
                    choices,
                    # the first registered pack (PixArt, the demo's), not the first by family
                    value=(control.list_packs() or [{"id": None}])[0]["id"],
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
            pack_info = gr.Markdown(pack_description(choices[0][1]) if choices else "")
            with gr.Row(equal_height=True):
                create_parent = gr.Textbox(
                    str(PROJECTS_ROOT), label="Create it in", scale=4, elem_id="new-parent"
                )
                create_browse = gr.Button("Browse…", size="sm", scale=0)
                create_button = gr.Button(
                    "Create", variant="primary", scale=0, elem_id="btn-create"
                )

    with gr.Group(visible=False, elem_id="file-browser") as browser:
        browser_for = gr.Markdown("**File browser**", elem_id="fb-for")
        gr.Markdown(
            "Confined to the roots below; SSH keys and the HF token store are never "
            "listed. Typed paths are accepted in the fields anyway."
        )
        target = gr.State(None)
        with gr.Row(equal_height=True):
            root = gr.Dropdown([], label="Root", scale=2, elem_id="fb-root")
            folder = gr.Textbox(
                label="Folder (type a path and press Enter)", scale=4, elem_id="fb-folder"
            )
            up = gr.Button("Up", size="sm", scale=0)
        browser_msg = gr.Markdown("", elem_id="fb-msg")
        entries = gr.Radio([], label="Entries (click a folder to open it)", elem_id="fb-entries")
        with gr.Row():
            use = gr.Button("Use the selected path", variant="primary", elem_id="fb-use")
            close = gr.Button("Close")
        with gr.Accordion("Browse roots", open=False):
            roots_text = gr.Textbox(
                label="Extra roots, one folder per line (kept in your user settings)",
                lines=3,
                value="\n".join(files.saved_roots()),
                elem_id="fb-roots",
            )
            roots_save = gr.Button("Save roots", size="sm")

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

    fm = form.build()
    with gr.Row(equal_height=True):
        preflight_btn = gr.Button(
            "Check memory (pre-flight of the saved settings)", scale=1, elem_id="btn-preflight"
        )
        save = gr.Button(
            "Save settings", variant="primary", elem_id="btn-save", interactive=False, scale=2
        )
    preflight_md = gr.Markdown("", elem_id="preflight-md")
    save_md = gr.Markdown("", elem_id="save-md")
    return SetupParts(
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
        project_md,
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
        fm,
        preflight_btn,
        preflight_md,
        save,
        save_md,
        browser,
        browser_for,
        browser_msg,
        target,
        root,
        folder,
        entries,
        up,
        use,
        close,
        roots_text,
        roots_save,
    )


# ---- wiring ---------------------------------------------------------------------------
def project_summary(view: dict) -> str:
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


def load_outputs(p: SetupParts) -> list:
    return [
        p.project_md,
        p.recent,
        p.open_path,
        p.save,
        p.materials_md,
        p.download,
        p.one_material,
        p.one_download,
        p.replace_id,
        p.trust_md,
        p.trust_button,
        *p.form.comps,
        *[f.browse for f in p.form.path_fields],
    ]


def load_values(p: SetupParts, project: str | None) -> tuple[list, dict | None]:
    """(updates for load_outputs, the `read` state) for `project` (None: nothing open)."""
    recents = recent.projects()
    if not project:
        return (
            [
                (
                    "No project open: create one or open a folder."
                    if not recents
                    else "No project open: pick a recent project or create one."
                ),
                gr.update(choices=recents, value=None),
                gr.skip(),
                gr.update(interactive=False),
                *materials_view(None),
                replace_choices(None),
                *trust_view(None),
                *form.fill(p.form, None, None),
                *form.browse_visibility(p.form, None, None),
            ],
            None,
        )
    view = control.open_project(project)
    values = view.settings if view.ok else None
    pack_id = (view.pack or {}).get("id")
    read = {"values": values, "version": view.version} if values else None
    return (
        [
            project_summary(view.as_dict()),
            gr.update(choices=recents, value=view.root),
            view.root,
            gr.update(interactive=values is not None),
            *materials_view(project),
            replace_choices(project),
            *trust_view(project),
            *form.fill(p.form, values, pack_id),
            *form.browse_visibility(p.form, pack_id, values),
        ],
        read,
    )


def wire(p: SetupParts, project: gr.State, read: gr.State, cursor: gr.State, after_open) -> None:
    """`after_open` is the app's event dict run when the open project changed."""
    outs = load_outputs(p)

    @common.shown_errors
    def do_open(path):
        if not path:
            raise UserError("type or browse to a project folder first")
        view = api.open_project(path)
        ups, rd = load_values(p, view["root"])
        return [view["root"], rd, *ups]

    @common.shown_errors
    def do_create(parent, name, pack_id):
        if not parent:
            raise UserError("choose the folder to create the project in")
        from gguf_trainer.packs import get_pack
        from gguf_trainer.project_schema import default_name

        folder_name = (name or "").strip() or default_name(
            get_pack(pack_id).default_name
        ).removeprefix("pig_")
        view = api.create_project(
            str(Path(parent).expanduser() / folder_name), pack_id, (name or "").strip()
        )
        gr.Info(f"project created: {view['root']}")
        ups, rd = load_values(p, view["root"])
        return [view["root"], rd, *ups]

    @common.shown_errors
    def do_save(proj, rd, *vals):
        saved = save_form(p.form, common.need_project(proj), rd, list(vals))
        return [saved.read, saved.message, *saved.marks]

    @common.shown_errors
    def do_token(tok):
        return "", store_token(tok)

    @common.shown_errors
    def do_download(proj, one=None):
        res = api.download_missing(common.need_project(proj), [one] if one else None)
        if res["started"]:  # one toast: a line per material
            gr.Info("\n".join(line["message"] for line in res["started"]), title="Materials")
        return materials_view(proj)

    open_outs = [project, read, *outs]
    p.open_button.click(do_open, [p.open_path], open_outs).then(**after_open)
    p.open_path.submit(do_open, [p.open_path], open_outs).then(**after_open)
    p.recent.input(do_open, [p.recent], open_outs).then(**after_open)
    p.create_button.click(do_create, [p.create_parent, p.create_name, p.pack], open_outs).then(
        **after_open
    )
    p.pack.change(pack_description, [p.pack], [p.pack_info])
    p.save.click(do_save, [project, read, *p.form.comps], [read, p.save_md, *p.form.comps])
    p.token_save.click(do_token, [p.token], [p.token, p.token_md])

    @common.shown_errors
    def do_preflight(proj):
        from gguf_trainer.ui import preflight

        return common.gui_words(preflight.to_markdown(preflight.verdict(common.need_project(proj))))

    p.preflight.click(do_preflight, [project], [p.preflight_md])
    mat_outs = [p.materials_md, p.download, p.one_material, p.one_download]

    @common.shown_errors
    def do_trust(proj):
        for path in control.trust_code(common.need_project(proj)):
            gr.Info(f"trusted: {path}")
        return trust_view(proj)

    p.trust_button.click(do_trust, [project], [p.trust_md, p.trust_button])

    @common.shown_errors
    def do_replace(proj, material_id, path):
        gr.Info(replace_material(common.need_project(proj), material_id, path), title="Materials")
        ups, rd = load_values(p, proj)  # the path field and the table show the new copy
        return [rd, *ups]

    p.replace_button.click(do_replace, [project, p.replace_id, p.replace_path], [read, *outs])
    p.download.click(do_download, [project], mat_outs)
    p.one_download.click(do_download, [project, p.one_material], mat_outs)
    _wire_browser(p, project)


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


def missing_materials(project: str) -> list[str]:
    """The wanted, required materials that are not ready ("title (state)"), from material
    status; [] when material status is not available in this version."""
    got = api.materials(project)
    return [
        f"{m.get('title') or m['id']} ({m.get('state')})"
        for m in got.get("materials") or []
        if m.get("wanted", True) and m.get("required") and m.get("state") != "ready"
    ]


def _merge_read(old: dict, disk: dict, applied: dict) -> dict:
    """The page's `read` values after a save: saved fields take the disk value; the others
    keep what the page read, so a conflicting field stays a conflict until reloaded."""
    import copy

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


def _listing(folder: str, roots: list[str]):
    real, entries = files.list_dir(folder, roots)
    choices = [
        (f"{e.name}/" + (" (project)" if e.is_project else ""), e.path)
        if e.is_dir
        else (f"{e.name}  ({common.fmt_size(e.size)})", e.path)
        for e in entries
    ]
    return str(real), gr.update(choices=choices, value=None)


def _wire_browser(p: SetupParts, project: gr.State) -> None:
    path_fields = p.form.path_fields

    def roots_for(proj):
        return files.browse_roots(proj, files.launch_roots())  # the --root folders

    def start_at(proj, current):
        roots = roots_for(proj)
        for cand in [current, proj]:
            if cand:
                try:
                    cand_path = Path(
                        str(cand).splitlines()[-1] if str(cand).strip() else ""
                    ).expanduser()
                    files.confine(str(cand_path if cand_path.is_dir() else cand_path.parent), roots)
                    return roots, str(cand_path if cand_path.is_dir() else cand_path.parent)
                except (UserError, IndexError):
                    continue
        return roots, roots[0] if roots else ""

    asks = {
        "#open": "the project folder to open",
        "#create": "the folder to create the project in",
        "#replace": "the copy to use for the material",
    }
    asks.update({f.key: f.meta.get("label") or f.key for f in path_fields})

    @common.shown_errors
    def open_for(key, proj, current):
        roots, start = start_at(proj, current)
        if not roots:
            raise UserError("no browse root exists; add one under Browse roots")
        folder, entries = _listing(start, roots)
        root_value = next(
            (r for r in roots if folder == r or folder.startswith(r.rstrip("/") + "/")), roots[0]
        )
        return (
            key,
            gr.update(visible=True),
            f"**Choose {asks.get(key, 'a path')}**",
            "",
            gr.update(choices=roots, value=root_value),
            folder,
            entries,
        )

    bro_outs = [p.target, p.browser, p.browser_for, p.browser_msg, p.root, p.folder, p.entries]
    for f in path_fields:
        f.browse.click(
            lambda proj, cur, _k=f.key: open_for(_k, proj, cur), [project, f.comp], bro_outs
        )
    p.open_browse.click(
        lambda proj, cur: open_for("#open", proj, cur), [project, p.open_path], bro_outs
    )
    p.create_browse.click(
        lambda proj, cur: open_for("#create", proj, cur), [project, p.create_parent], bro_outs
    )
    p.replace_browse.click(
        lambda proj, cur: open_for("#replace", proj, cur), [project, p.replace_path], bro_outs
    )

    def listed(folder, roots):
        """(folder, entries, message): a refused folder clears the old listing and says why
        inside the browser, so nothing from the previous folder can be picked by mistake."""
        try:
            return (*_listing(folder, roots), "")
        except UserError as e:
            return gr.skip(), gr.update(choices=[], value=None), f"⚠ {e}"

    def go(proj, folder):
        return listed(folder, roots_for(proj))

    def pick(proj, chosen, folder):
        if chosen and Path(chosen).is_dir():
            return listed(chosen, roots_for(proj))
        return gr.skip(), gr.skip(), ""

    def up(proj, folder):
        roots = roots_for(proj)
        parent = str(Path(folder).parent)
        try:
            files.confine(parent, roots)
        except UserError:
            return gr.skip(), gr.skip(), "⚠ already at the top of this root"
        return listed(parent, roots)

    listing_outs = [p.folder, p.entries, p.browser_msg]
    p.root.input(go, [project, p.root], listing_outs)
    p.folder.submit(go, [project, p.folder], listing_outs)
    p.entries.input(pick, [project, p.entries, p.folder], listing_outs)
    p.up.click(up, [project, p.folder], listing_outs)
    p.close.click(lambda: gr.update(visible=False), None, [p.browser])

    def use(key, chosen, folder, *current):
        path = chosen or folder
        outs = []
        for f, cur in zip(path_fields, current):
            if f.key != key:
                outs.append(gr.skip())
            elif f.meta["type"] == "paths":
                lines = [x for x in str(cur or "").splitlines() if x.strip()]
                outs.append("\n".join([*lines, path]) if path not in lines else cur)
            else:
                outs.append(path)
        return [
            gr.update(visible=False),
            path if key == "#open" else gr.skip(),
            path if key == "#create" else gr.skip(),
            path if key == "#replace" else gr.skip(),
            *outs,
        ]

    p.use.click(
        use,
        [p.target, p.entries, p.folder, *[f.comp for f in path_fields]],
        [p.browser, p.open_path, p.create_parent, p.replace_path, *[f.comp for f in path_fields]],
    )

    @common.shown_errors
    def save_roots(text):
        kept = files.save_roots(text.splitlines())
        gr.Info(f"browse roots saved ({len(kept)})")
        return "\n".join(kept)

    p.roots_save.click(save_roots, [p.roots_text], [p.roots_text])
