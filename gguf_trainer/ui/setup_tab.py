"""Setup tab: open or create a project, materials and the HF token, the settings form, Save.

The tab is built from its sections (project_section, browser_section, materials_section;
the form is form.py) and owns what spans them: filling everything from the open project
(`load_values`), Save and the pre-flight check. Handlers are thin: they call the API
functions (api.py, the same control functions the CLI calls) and map results to updates.
The page keeps what it read (`read` state: values and version) only to send the fields the
user changed and let compare-and-set catch fields changed on disk in between (form_save.py).
Paths are typed or picked with the confined file browser; nothing is uploaded.

    parts = build(); wire(parts, project, read, cursor, after_open)
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from gguf_trainer.runner import control
from gguf_trainer.ui import (
    browser_section,
    common,
    form,
    kept_section,
    materials_section,
    project_section,
    recent,
)
from gguf_trainer.ui.browser_section import Target
from gguf_trainer.ui.form_save import save_form
from gguf_trainer.ui.materials_section import (  # the Materials part of this tab
    materials_view,
    replace_choices,
    trust_view,
)


@dataclass
class SetupParts:
    project: project_section.ProjectParts
    browser: browser_section.BrowserParts
    materials: materials_section.MaterialsParts
    form: form.Form
    preflight: gr.Button
    preflight_md: gr.Markdown
    save: gr.Button
    save_md: gr.Markdown
    kept_md: gr.Markdown  # what the saved kept-steps schedule makes (kept_section.plan_md)


def build() -> SetupParts:
    project = project_section.build()
    browser = browser_section.build()
    materials = materials_section.build()
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
    kept_md = gr.Markdown("", elem_id="setup-kept-plan")
    return SetupParts(project, browser, materials, fm, preflight_btn, preflight_md, save, save_md,
                      kept_md)


# ---- filling the tab from the open project ------------------------------------------
def load_outputs(p: SetupParts) -> list:
    """The components load_values updates, in its order."""
    return [
        p.project.md,
        p.project.recent,
        p.project.open_path,
        p.save,
        *materials_section.outputs(p.materials),
        p.materials.replace_id,
        p.materials.trust_md,
        p.materials.trust_button,
        *p.form.comps,
        *[f.browse for f in p.form.path_fields],
        p.kept_md,
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
                "",
            ],
            None,
        )
    view = control.open_project(project)
    values = view.settings if view.ok else None
    pack_id = (view.pack or {}).get("id")
    read = {"values": values, "version": view.version} if values else None
    return (
        [
            project_section.project_summary(view.as_dict()),
            gr.update(choices=recents, value=view.root),
            view.root,
            gr.update(interactive=values is not None),
            *materials_view(project),
            replace_choices(project),
            *trust_view(project),
            *form.fill(p.form, values, pack_id),
            *form.browse_visibility(p.form, pack_id, values),
            kept_section.plan_md(project) if values else "",
        ],
        read,
    )


# ---- wiring ---------------------------------------------------------------------------
def wire(p: SetupParts, project: gr.State, read: gr.State, cursor: gr.State, after_open) -> None:
    """`after_open` is the app's event dict run when the open project changed."""
    outs = load_outputs(p)

    def load(proj):
        return load_values(p, proj)

    project_section.wire(p.project, project, read, outs, load, after_open)

    @common.shown_errors
    def do_save(proj, rd, *vals):
        saved = save_form(p.form, common.need_project(proj), rd, list(vals))
        return [saved.read, saved.message, *saved.marks]

    p.save.click(do_save, [project, read, *p.form.comps], [read, p.save_md, *p.form.comps]).then(
        kept_section.plan_md, [project], [p.kept_md])

    @common.shown_errors
    def do_preflight(proj):
        from gguf_trainer.ui import preflight

        return common.gui_words(preflight.to_markdown(preflight.verdict(common.need_project(proj))))

    p.preflight.click(do_preflight, [project], [p.preflight_md])
    materials_section.wire(p.materials, project, read, outs, load)
    browser_section.wire(
        p.browser,
        project,
        p.form.path_fields,
        [
            Target(
                "#open", p.project.open_browse, p.project.open_path, "the project folder to open"
            ),
            Target(
                "#create",
                p.project.create_browse,
                p.project.create_parent,
                "the folder to create the project in",
            ),
            Target(
                "#replace",
                p.materials.replace_browse,
                p.materials.replace_path,
                "the copy to use for the material",
            ),
        ],
    )
