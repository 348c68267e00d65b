"""The settings form, generated from the field metadata (control.field_metadata).

One component per field of the schema and of every registered pack's materials, built once
from the declarations; opening a project shows the fields its pack has, with the pack's
labels, help and defaults, and hides the others. A new pack or a new setting therefore
needs no GUI edit. Values are compared with what the page read, and only changed fields
are sent to control.update_settings (compare-and-set); its per-field errors, refusals and
conflicts are shown next to the field, in the field's info line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import gradio as gr

from gguf_trainer.runner import control
from gguf_trainer.store.project_schema import get_dotted

SECTION_ORDER = ("Project", "Materials", "Corpus", "Precompute", "Training", "Output")
READ_ONLY = ("pack",)  # chosen when the project is created


@dataclass
class Field:
    key: str
    meta: dict
    comp: gr.components.Component
    browse: gr.Button | None = None


@dataclass
class Form:
    fields: dict = field(default_factory=dict)  # key -> Field

    @property
    def comps(self) -> list:
        return [f.comp for f in self.fields.values()]

    @property
    def path_fields(self) -> list:
        return [f for f in self.fields.values() if f.browse is not None]


def all_fields() -> list[dict]:
    """The schema's fields, plus each pack's material fields, in display order."""
    from gguf_trainer.packs import pack_ids

    seen: dict[str, dict] = {m["key"]: m for m in control.field_metadata(None)}
    out = list(seen.values())
    for pid in pack_ids():
        for m in control.field_metadata(pid):
            if m["key"] not in seen:
                seen[m["key"]] = m
                out.append(m)
    return out


def info_text(meta: dict) -> str:
    bits = [meta.get("help") or ""]
    if meta.get("range"):
        bits.append(meta["range"])
    if meta.get("live"):
        bits.append("may change while running")
    return " · ".join(b for b in bits if b)


def widget_kind(meta: dict) -> str:
    """The metadata type, refined: "json" for a mapping or list typed as text (edited as
    JSON), "multi" for a list with declared choices (a multi-select)."""
    kind = meta["type"]
    if kind == "str" and isinstance(meta.get("default"), (dict, list)):
        return "json"
    if kind == "list" and meta.get("choices"):
        return "multi"
    return kind


def _component(meta: dict):
    kind, label, info = widget_kind(meta), meta.get("label") or meta["key"], info_text(meta)
    elem_id = "f-" + meta["key"].replace(".", "-")
    common = {"label": label, "info": info, "elem_id": elem_id, "elem_classes": ["field"]}
    if kind == "bool":
        return gr.Checkbox(value=bool(meta.get("default")), **common)
    if kind in ("int", "float"):
        # No minimum/maximum here: Gradio would refuse out-of-range input itself, before
        # the schema could say what is wrong next to the field.
        return gr.Number(value=meta.get("default"), **common)
    if kind == "choice":
        return gr.Dropdown(
            choices=list(meta.get("choices") or []), value=meta.get("default"), **common
        )
    if kind == "multi":
        return gr.Dropdown(
            choices=list(meta["choices"]),
            value=list(meta.get("default") or []),
            multiselect=True,
            **common,
        )
    if kind in ("list", "paths"):
        return gr.Textbox(
            value="\n".join(meta.get("default") or []),
            lines=3,
            placeholder="one per line",
            **common,
        )
    if kind == "json":
        return gr.Textbox(
            value=json.dumps(meta.get("default")), placeholder='JSON, e.g. {"files": 0.5}', **common
        )
    return gr.Textbox(
        value="" if meta.get("default") is None else str(meta.get("default")),
        interactive=meta["key"] not in READ_ONLY,
        **common,
    )


def build(metas: list[dict] | None = None) -> Form:
    """Lay the fields out by section (advanced ones in a closed accordion)."""
    metas = metas if metas is not None else all_fields()
    form = Form()
    by_section: dict[str, list[dict]] = {}
    for m in metas:
        by_section.setdefault(m["section"], []).append(m)
    order = [s for s in SECTION_ORDER if s in by_section] + [
        s for s in by_section if s not in SECTION_ORDER
    ]
    for section in order:
        with gr.Accordion(
            section,
            open=section in ("Project", "Materials", "Training"),
            elem_id=f"section-{section.lower()}",
        ):
            basic = [m for m in by_section[section] if not m.get("advanced")]
            advanced = [m for m in by_section[section] if m.get("advanced")]
            _lay_out(form, basic)
            if advanced:
                with gr.Accordion("Advanced", open=False):
                    _lay_out(form, advanced)
    return form


def _lay_out(form: Form, metas: list[dict]) -> None:
    with gr.Row(equal_height=False):
        for m in metas:
            with gr.Column(min_width=260):
                comp = _component(m)
                browse = None
                if m["type"] in ("path", "paths"):
                    browse = gr.Button(
                        "Browse…", size="sm", elem_id="browse-" + m["key"].replace(".", "-")
                    )
                form.fields[m["key"]] = Field(m["key"], m, comp, browse)


# ---- values ---------------------------------------------------------------------------
def to_widget(meta: dict, value):
    kind = widget_kind(meta)
    if kind == "multi":
        return list(value or [])
    if kind in ("list", "paths"):
        return "\n".join(str(v) for v in value or [])
    if kind == "json":
        return json.dumps(value if value is not None else meta.get("default"))
    if kind in ("str", "path") and value is None:
        return ""
    return value


def from_widget(meta: dict, value):
    kind = widget_kind(meta)
    if kind == "multi":
        return list(value or [])
    if kind in ("list", "paths"):
        return [line.strip() for line in str(value or "").splitlines() if line.strip()]
    if kind == "json":
        try:
            return json.loads(value or "null")
        except ValueError:
            return value  # the schema refuses it next to the field, with what it expects
    if kind == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
    if a in ("", None) and b in ("", None):
        return True
    return a == b


def shown_keys(pack_id: str | None) -> set[str]:
    """The fields a project of `pack_id` shows (what fill() makes visible)."""
    if not pack_id:
        return set()
    return {m["key"] for m in control.field_metadata(pack_id) if not m.get("hidden")}


def changes(form: Form, read_values: dict, widget_values: list, shown: set | None = None) -> dict:
    """{dotted key: new value} of the fields whose widget differs from what was read. With
    `shown` (shown_keys), only those: a hidden field still holds whatever the previous project
    put in it, and that is never an edit the user made to this one."""
    out = {}
    for f, raw in zip(form.fields.values(), widget_values):
        if f.key in READ_ONLY or (shown is not None and f.key not in shown):
            continue
        new = from_widget(f.meta, raw)
        if not same(new, get_dotted(read_values, f.key)):
            out[f.key] = new
    return out


def fill(form: Form, values: dict | None, pack_id: str | None) -> list:
    """Updates for form.comps showing `values` with the pack's metadata."""
    metas = {m["key"]: m for m in control.field_metadata(pack_id)} if pack_id else {}
    out = []
    for f in form.fields.values():
        meta = metas.get(f.key)
        if values is None or meta is None or meta.get("hidden"):
            out.append(gr.update(visible=False))
            continue
        out.append(
            gr.update(
                visible=True,
                value=to_widget(meta, get_dotted(values, f.key)),
                label=meta.get("label") or f.key,
                info=info_text(meta),
            )
        )
    return out


def browse_visibility(form: Form, pack_id: str | None, values: dict | None) -> list:
    metas = {m["key"] for m in control.field_metadata(pack_id)} if pack_id else set()
    return [gr.update(visible=values is not None and f.key in metas) for f in form.path_fields]


def mark(form: Form, result: dict, pack_id: str | None) -> list:
    """Field updates after a save: each problem in its field's info line, others plain."""
    metas = {m["key"]: m for m in control.field_metadata(pack_id)} if pack_id else {}
    problems = dict(result.get("errors") or {})
    problems.update(result.get("refused") or {})
    for key, c in (result.get("conflicts") or {}).items():
        problems[key] = (
            f"changed on disk to {c.get('disk')!r} since this page read it (e.g. by "
            f"`gguf-trainer set`); not overwritten — reload the project to see it"
        )
    out = []
    for f in form.fields.values():
        meta = metas.get(f.key, f.meta)
        if f.key in problems:  # in the error style (app.CSS .field-error), next to the field
            out.append(
                gr.update(info=f"⚠ {problems[f.key]}", elem_classes=["field", "field-error"])
            )
        else:
            out.append(gr.update(info=info_text(meta), elem_classes=["field"]))
    return out
