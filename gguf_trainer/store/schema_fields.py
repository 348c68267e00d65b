"""The schema as the GUI and the README see it: per-field metadata (label, help, type, range
and its reason, default, choices, `live`, the packs that read it) with a pack's defaults and
declarations laid over it, the README's table of every key, and what a dotted key names.

It reads and writes no file and imports no torch (the schema is project_schema.py, its
error sentences schema_errors.py).

    field_metadata("llada_image")   # the GUI's form, pack defaults applied
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel

from gguf_trainer.store.project_schema import SECTIONS, ProjectSettings, default_name
from gguf_trainer.store.schema_errors import bounds, field_info, is_jsonable, range_text


# ---- GUI metadata -----------------------------------------------------------------------
def _meta_for(key: str, info, section: str) -> dict:
    extra = dict(info.json_schema_extra or {})
    ann = info.annotation
    base = get_args(ann)[0] if get_origin(ann) is Annotated else ann
    b = bounds(info)
    kind = extra.get("kind") or ("bool" if base is bool else "int" if base is int else
                                 "float" if base is float else
                                 "choice" if get_origin(base) is Literal else
                                 "list" if get_origin(base) is list else "str")
    default = info.get_default(call_default_factory=True)
    choices = list(get_args(base)) if get_origin(base) is Literal else None
    if extra.get("choices_from"):  # a list of known ids (the datasets a corpus can use)
        from gguf_trainer.materials.corpus_sources import known_ids

        choices = known_ids(extra["choices_from"])
    return {
        "key": key, "section": section, "label": extra.get("label") or key.rsplit(".", 1)[-1],
        "help": info.description or "", "type": kind,
        "default": default if is_jsonable(default) else None,
        "min": b.get("ge", b.get("gt")), "max": b.get("le", b.get("lt")),
        "min_exclusive": "gt" in b, "max_exclusive": "lt" in b,
        "range": range_text(info), "why": extra.get("why") or "",
        "choices": choices,
        "live": bool(extra.get("live")), "advanced": bool(extra.get("advanced")),
        "required": info.is_required(), "packs": list(extra.get("packs") or []),
    }


def schema_fields() -> list[dict]:
    """Metadata of every schema field (not per-material), in display order (a fresh copy:
    the GUI asks on every render, the schema never changes in a process)."""
    return copy.deepcopy(_schema_fields())


@functools.lru_cache(maxsize=1)
def _schema_fields() -> list[dict]:
    out = []
    for name, info in ProjectSettings.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            for sub, sinfo in ann.model_fields.items():
                out.append(_meta_for(f"{name}.{sub}", sinfo, SECTIONS[name]))
        elif name == "materials":
            continue
        else:
            out.append(_meta_for(name, info, SECTIONS[""]))
    return out


def field_metadata(pack_id: str | None = None) -> list[dict]:
    """Per-field GUI metadata: the schema's, then the pack's declarations over it (its
    defaults become the field's default, its `field_meta` overrides label/help/range), and
    one `materials.<id>.path` field per material of the pack. See control.field_metadata."""
    fields = schema_fields()
    if pack_id is None:
        return fields
    from gguf_trainer.packs import get_pack

    pack = get_pack(pack_id)
    declared = pack.field_meta
    by_key = {f["key"]: f for f in fields}
    for key, value in pack.all_defaults.items():
        if key in by_key:
            by_key[key]["default"] = value
            by_key[key]["pack_default"] = True
    for key, meta in declared.items():
        if key in by_key:
            by_key[key].update(meta)
    for f in fields:  # a setting only some packs read is not shown for the others
        if f["packs"] and pack_id not in f["packs"]:
            f["hidden"] = True
    by_key["name"]["default"] = default_name(pack.default_name)
    mats = []
    for m in pack.materials:
        mats.append({
            "key": f"materials.{m.id}.path", "section": "Materials", "label": m.title,
            "help": " ".join(x for x in (m.hint, f"Hugging Face: {m.repo}" if m.repo else "")
                             if x), "type": "path", "default": "", "min": None, "max": None,
            "min_exclusive": False, "max_exclusive": False, "range": "", "why": "",
            "choices": None, "live": False, "advanced": False, "required": m.required,
            "material": m.id})
    return fields[:3] + mats + fields[3:]


def settings_table_markdown() -> str:
    """The README's table of every project.json key, generated from the schema."""
    rows = ["| key | default | allowed | may change while running | meaning |",
            "| --- | --- | --- | --- | --- |"]
    rows.append("| `materials.<id>.path` | `\"\"` | a path | no | where material `<id>` of the "
                "pack is (ids: `gguf-trainer demo --help` and the pack table) |")
    for f in schema_fields():
        default = json.dumps(f["default"]) if f["key"] != "pack" else "(required)"
        allowed = (f["range"] if f["type"] in ("int", "float") else
                   ("any of " if f["type"] == "list" else "") +
                   ", ".join(f"`{c}`" for c in f["choices"]) if f["choices"] else
                   {"bool": "`true`, `false`", "path": "a path", "paths": "a list of paths",
                    "str": "text"}.get(f["type"], f["type"]))
        if f["type"] == "int" and allowed:
            allowed = "whole number " + allowed
        help_ = f["help"] + (f" (limit: {f['why']})" if f["why"] else "")
        if f["packs"]:
            help_ += f" (read by {', '.join(f'`{p}`' for p in f['packs'])} only)"
        rows.append(f"| `{f['key']}` | `{default}` | {allowed} | {'yes' if f['live'] else 'no'} "
                    f"| {f['label']}: {help_} |")
    return "\n".join(rows)


# ---- keys -------------------------------------------------------------------------------
def known_key(dotted: str) -> bool:
    parts = dotted.split(".")
    if parts[0] == "materials":
        return len(parts) == 3 and parts[2] == "path" and bool(parts[1])
    info, _ = field_info(tuple(parts))
    return info is not None


def is_live_key(key: str) -> bool:
    if key.startswith("materials."):
        return False
    info, _ = field_info(tuple(key.split(".")))
    return bool(info is not None and (info.json_schema_extra or {}).get("live"))


def set_dotted(data: dict, dotted: str, value: Any) -> None:
    node = data
    *parents, leaf = dotted.split(".")
    for key in parents:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[leaf] = copy.deepcopy(value)
