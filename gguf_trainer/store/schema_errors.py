"""The one sentence for every bad setting, and `validate_settings`, which reports them all.

Each sentence names the field, the bad value, what is allowed and why (the schema's
bounds and their reasons, project_schema.py) and the fix; an unknown key gets the nearest
real one. It reads and writes no file and imports no torch.

    settings = validate_settings({"pack": "t5xxl_pixart"})   # UserError lists every bad field
"""

from __future__ import annotations

import difflib
import json
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel, ValidationError

from gguf_trainer.base.errors import UserError
from gguf_trainer.store.project_schema import MaterialRef, ProjectSettings


def field_info(loc: tuple):
    """(FieldInfo, model) of a dotted location, or (None, None)."""
    model, info = ProjectSettings, None
    for i, part in enumerate(loc):
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            if model is None and i == 2 and loc[0] == "materials":
                model = MaterialRef
                if part in model.model_fields:
                    info = model.model_fields[part]
                    model = None
                    continue
            return None, None
        info = model.model_fields[part]
        ann = info.annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return info, model


def bounds(info) -> dict:
    out = {}
    for m in getattr(info, "metadata", []) or []:
        for k in ("ge", "gt", "le", "lt"):
            if getattr(m, k, None) is not None:
                out[k] = getattr(m, k)
    return out


def _fmt_num(x) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        x = int(x)
    return f"{x:,}".replace(",", "_") if isinstance(x, int) and abs(x) >= 100_000 else str(x)


def range_text(info) -> str:
    """'from 64 to 16384' / 'greater than 0 and at most 1' / ''."""
    b = bounds(info)
    lo = (f"at least {_fmt_num(b['ge'])}" if "ge" in b else
          f"greater than {_fmt_num(b['gt'])}" if "gt" in b else "")
    hi = (f"at most {_fmt_num(b['le'])}" if "le" in b else
          f"less than {_fmt_num(b['lt'])}" if "lt" in b else "")
    if "ge" in b and "le" in b:
        return f"from {_fmt_num(b['ge'])} to {_fmt_num(b['le'])}"
    return " and ".join(x for x in (lo, hi) if x)


def _type_word(info) -> str:
    ann = info.annotation
    base = get_args(ann)[0] if get_origin(ann) is Annotated else ann
    if base is bool:
        return "true or false"
    if base is int:
        return "a whole number"
    if base is float:
        return "a finite number"
    if get_origin(base) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(base))
    if base is str:
        return "text"
    if get_origin(base) is list:
        return "a list of paths"
    return "a JSON object"


def _short_repr(value: Any) -> str:
    text = json.dumps(value) if is_jsonable(value) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_jsonable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=True)
        return True
    except (TypeError, ValueError):
        return False


def describe_error(e: dict) -> tuple[str, str]:
    """(dotted field, one sentence: the field, the bad value, what is allowed and why, the fix)."""
    loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    where = ".".join(str(p) for p in loc) or "(top level)"
    kind = e["type"]
    if kind == "extra_forbidden":
        parent, leaf = loc[:-1], str(loc[-1])
        _info, pmodel = field_info(parent) if parent else (None, ProjectSettings)
        names = list(pmodel.model_fields) if pmodel is not None else []
        near = difflib.get_close_matches(leaf, names, n=1)
        hint = f" (did you mean {'.'.join([*map(str, parent), near[0]])}?)" if near else ""
        return where, f"{where}: is not a setting{hint}; remove it or fix its name"
    if kind == "missing":
        return where, f"{where}: is required; add it"
    if kind == "value_error" or kind == "assertion_error":
        return where, f"{where}: " + str(e["msg"]).removeprefix("Value error, ")
    info, _model = field_info(loc)
    bad = _short_repr(e.get("input"))
    if loc == ("pack",):
        from gguf_trainer.packs import pack_ids

        return where, f"pack: {bad} is not a pack; choose one of {', '.join(pack_ids())}"
    if info is None and loc and loc[0] == "materials":
        return where, (f"{where}: {bad} is not allowed; a material is written as "
                       '"materials": {"<id>": {"path": "/path/to/it"}}')
    if info is None:
        return where, f"{where}: {bad}: {e['msg']}"
    extra = info.json_schema_extra or {}
    allowed = _type_word(info)
    rng = range_text(info)
    if rng and allowed in ("a whole number", "a finite number"):
        allowed += " " + rng
    why = f" ({extra['why']})" if extra.get("why") and rng else ""
    default = info.get_default(call_default_factory=True)
    fix = f"; set it to e.g. {json.dumps(default)} (the default)" if is_jsonable(default) and \
        default not in ("", None, [], {}) else "; fix it"
    return where, f"{where}: {bad} is not allowed; it must be {allowed}{why}{fix}"


def field_errors(err: ValidationError) -> dict[str, str]:
    out: dict[str, str] = {}
    for e in err.errors():
        where, sentence = describe_error(e)
        out.setdefault(where, sentence)
    return out


def _describe_errors(err: ValidationError, source: str) -> str:
    lines = [f"  {s}" for s in field_errors(err).values()]
    n = len(lines)
    head = f"{source} has {n} bad setting{'s' if n > 1 else ''}; fix {'them' if n > 1 else 'it'}:"
    return "\n".join([head, *lines])


def validate_settings(data: Any, source: str = "project.json") -> ProjectSettings:
    """Every bad field is reported at once, each with what to do."""
    if not isinstance(data, dict):
        raise UserError(f"{source} must hold a JSON object like {{\"pack\": \"t5xxl_pixart\"}}, "
                        f"not {type(data).__name__}; fix or recreate it.")
    try:
        return ProjectSettings.model_validate(data)
    except ValidationError as e:
        raise UserError(_describe_errors(e, source)) from None
    except RecursionError:
        raise UserError(f"{source} is nested too deeply to be settings; fix or recreate "
                        "it.") from None
