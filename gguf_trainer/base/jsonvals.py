"""Plain JSON values, written and read back: numbers, finite floats, jsonable objects.

JSON has no NaN or infinity and no numpy or torch scalars; the tool writes None for a
non-finite float and reads a number only when it is one (true/false are not numbers).
Imports nothing of the package and no torch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def number(value: Any) -> float | None:
    """An int or float as a float; None for anything else (bools included)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def finite_number(value: Any) -> int | float | None:
    """The value itself when it is a finite int or float; None otherwise (bools included)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return None


def finite(obj: Any) -> Any:
    """`obj` with every non-finite float in it (dicts and lists too) made None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj


def jsonable(value: Any) -> Any:
    """Plain JSON types: numpy/torch scalars via .item(), non-finite floats -> None."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):  # numpy / torch scalar
        return jsonable(value.item())
    raise TypeError(f"cannot record {type(value).__name__} in state/metrics: {value!r}")


def get_dotted(data: Any, dotted: str, missing: Any = None) -> Any:
    """`data["a"]["b"]` for "a.b", or `missing` where a level is absent or not a dict: the
    one getter of dotted settings (project_schema re-exports it; materials reads it here,
    below the schema, which imports the corpus sources that import materials)."""
    node = data
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return missing
        node = node[key]
    return node
