"""Setup tab › File browser: the confined folder browser that fills a path box.

Each Browse… button (the form's path fields and the `Target`s outside the form: open,
create, replace) opens it at that box's current path; Use the selected path writes the
choice into that box (a `paths` field gets it as one more line). Listing and confinement
are files.py: SSH keys and the HF token store are never listed, and typed paths are
accepted in the fields anyway. Nothing is uploaded.

    parts = build()
    wire(parts, project, fm.path_fields, [Target("#open", browse, box, "the folder"), ...])
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from gguf_trainer.base.errors import UserError
from gguf_trainer.ui import common, files


@dataclass
class BrowserParts:
    group: gr.Group
    heading: gr.Markdown
    message: gr.Markdown
    target: gr.State
    root: gr.Dropdown
    folder: gr.Textbox
    entries: gr.Radio
    up: gr.Button
    use: gr.Button
    close: gr.Button
    roots_text: gr.Textbox
    roots_save: gr.Button


@dataclass
class Target:
    """A path box outside the form that a Browse… button fills; `ask` ends "Choose …"."""

    key: str  # "#open": not a settings key, so never confused with a form field
    browse: gr.Button
    box: gr.Textbox
    ask: str


def build() -> BrowserParts:
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
    return BrowserParts(
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


def _listing(folder: str, roots: list[str]):
    """(the real folder, an Entries update): folders as `name/` (marked when a project),
    files with their size."""
    real, entries = files.list_dir(folder, roots)
    choices = [
        (f"{e.name}/" + (" (project)" if e.is_project else ""), e.path)
        if e.is_dir
        else (f"{e.name}  ({common.fmt_size(e.size)})", e.path)
        for e in entries
    ]
    return str(real), gr.update(choices=choices, value=None)



def _roots_for(proj):
    return files.browse_roots(proj, files.launch_roots())  # the --root folders


def _start_at(proj, current):
    """(roots, the folder to open): the box's path (or its folder), else the project's,
    else the first root."""
    roots = _roots_for(proj)
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


def _listed(folder, roots):
    """(folder, entries, message): a refused folder clears the old listing and says why
    inside the browser, so nothing from the previous folder can be picked by mistake."""
    try:
        return (*_listing(folder, roots), "")
    except UserError as e:
        return gr.skip(), gr.update(choices=[], value=None), f"⚠ {e}"


def wire(p: BrowserParts, project: gr.State, path_fields: list, targets: list[Target]) -> None:
    """`path_fields` are the settings form's (form.Form.path_fields), `targets` the other
    boxes with a Browse… button; `p.target` holds the key of the box being filled."""
    asks = {t.key: t.ask for t in targets}
    asks.update({f.key: f.meta.get("label") or f.key for f in path_fields})

    @common.shown_errors
    def open_for(key, proj, current):
        roots, start = _start_at(proj, current)
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

    bro_outs = [p.target, p.group, p.heading, p.message, p.root, p.folder, p.entries]
    for f in path_fields:
        f.browse.click(
            lambda proj, cur, _k=f.key: open_for(_k, proj, cur), [project, f.comp], bro_outs
        )
    for t in targets:
        t.browse.click(
            lambda proj, cur, _k=t.key: open_for(_k, proj, cur), [project, t.box], bro_outs
        )

    def go(proj, folder):
        return _listed(folder, _roots_for(proj))

    def pick(proj, chosen, folder):
        if chosen and Path(chosen).is_dir():
            return _listed(chosen, _roots_for(proj))
        return gr.skip(), gr.skip(), ""

    def up(proj, folder):
        roots = _roots_for(proj)
        parent = str(Path(folder).parent)
        try:
            files.confine(parent, roots)
        except UserError:
            return gr.skip(), gr.skip(), "⚠ already at the top of this root"
        return _listed(parent, roots)

    listing_outs = [p.folder, p.entries, p.message]
    p.root.input(go, [project, p.root], listing_outs)
    p.folder.submit(go, [project, p.folder], listing_outs)
    p.entries.input(pick, [project, p.entries, p.folder], listing_outs)
    p.up.click(up, [project, p.folder], listing_outs)
    p.close.click(lambda: gr.update(visible=False), None, [p.group])

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
            *(path if key == t.key else gr.skip() for t in targets),
            *outs,
        ]

    p.use.click(
        use,
        [p.target, p.entries, p.folder, *[f.comp for f in path_fields]],
        [p.group, *[t.box for t in targets], *[f.comp for f in path_fields]],
    )

    @common.shown_errors
    def save_roots(text):
        kept = files.save_roots(text.splitlines())
        common.info(f"browse roots saved ({len(kept)})")
        return "\n".join(kept)

    p.roots_save.click(save_roots, [p.roots_text], [p.roots_text])
