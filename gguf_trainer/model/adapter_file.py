"""Read an adapter GGUF the way the ggk engine does, and list everything wrong with it.

Owns: reading a file into an AdapterView (adapter_view.py: variant and geometry, §1.3) checked by
adapter_checks.py (names §1.1, dtypes §1.2, inventory §1.4): the view `gguf-trainer inspect`
reports (adapter_report.py); and a file's adapter tensors as float32 arrays. It must not import
torch: the CLI and the UI use it, and users run it on adapter files from other tools too.
The names callers import from here (constants, AdapterView, expected_tensors, ...) live in those
modules and are re-exported below.

Files are read with base/gguf_read.py (bounded, and ~40x faster than gguf.GGUFReader on a
file carrying a 248k vocabulary: benchmarks/bench_gguf_read.py).

Usage: `view = read_adapter(path)`; `view.kind`, `view.problems`, `trainer_kind(view)`. To read
the view and then the arrays from one open (load_gguf): `f = open_adapter(path)`, then
`read_adapter(path, f)` and `read_adapter_arrays(path, f)`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.gguf_read import GGUFFile, read_gguf
from gguf_trainer.model.adapter_checks import (
    check_dtypes,
    check_geometry,
    check_inventory,
    check_names,
    check_variant,
    is_layernorm_name,
    refuse,
)
from gguf_trainer.model.adapter_inventory import expected_tensors
from gguf_trainer.model.adapter_view import (
    EMBED_TABLES,
    ENGINE_PREFIX,
    F32_NAMES,
    GEOMETRY_KEYS,
    LAYERWISE_FAMILIES,
    PREFIX,
    SEEDLESS_MIN_GGK,
    TOKENIZER_JSON,
    AdapterView,
    block_size,
    detect,
    families_for,
    rest_name,
    trainer_kind,
    weight_type,
)

__all__ = [  # what callers import from here
    "EMBED_TABLES", "ENGINE_PREFIX", "F32_NAMES", "GEOMETRY_KEYS", "LAYERWISE_FAMILIES", "PREFIX",
    "TOKENIZER_JSON", "AdapterView", "block_size", "expected_tensors", "families_for",
    "is_layernorm_name", "open_adapter", "read_adapter", "read_adapter_arrays", "trainer_kind",
    "weight_type",
]


# ---------------------------------------------------------------- reading


def open_adapter(path) -> GGUFFile:
    """The file opened for read_adapter / read_adapter_arrays; UserError when it is missing or
    not a readable GGUF."""
    p = Path(path)
    if not p.is_file():
        raise UserError(
            f"{path} does not exist or is not a file; pass the path of an adapter .gguf file."
        )
    # Bounded (every count checked against the file) and fast on an embedded vocabulary.
    return read_gguf(p, fix="re-export it or choose another file")


def _type_name(tensor_type) -> str:
    return tensor_type.name.lower()


def _field_value(fld):
    value = fld.contents()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # keeps report_dict strict-JSON
    return value


def read_adapter(path, reader: GGUFFile | None = None) -> AdapterView:
    """Detect the variant and geometry as the engine does and list every problem.
    Raises UserError when the file is not a readable GGUF. `reader`: `path` already opened
    (open_adapter), so a caller that reads its arrays next opens the file once."""
    if reader is None:
        reader = open_adapter(path)
    view = AdapterView(path=str(path))
    view.tensors = {
        t.name: (tuple(int(d) for d in t.shape), _type_name(t.tensor_type)) for t in reader.tensors
    }
    # an embedded vocabulary becomes lists here (~0.1 s for 248k tokens + merges)
    view.metadata = {
        k: _field_value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")
    }
    view.taps = _layer_map_values(reader)
    del reader  # drop the mapping before a caller renames the file
    rest = {}
    for name, info in view.tensors.items():
        r = rest_name(name)
        if r is not None:
            rest[r] = info
    if not rest:
        arch = view.metadata.get("general.architecture")
        llm = any(n.startswith(("blk.", "model.layers.", "model.embed_tokens", "token_embd"))
                  for n in view.tensors)
        if llm:  # the student pig_clip, or any LLM GGUF: say what it is and what goes here
            refuse(
                view,
                f"{path} is a language model ({arch or 'LLM layout'}), not an adapter: it has no "
                "adapter.* tensors. It is what ggk takes as --llm (the student); inspect the "
                "adapter GGUF gguf-trainer exported instead.",
            )
        else:
            check_names(view, rest)
            refuse(
                view,
                f"{path} has no adapter.* tensors, so the engine finds no adapter in it "
                "(is it the student or another model?).",
            )
        return view
    check_names(view, rest)
    detect(view, rest)
    check_variant(view, rest)
    check_geometry(view, rest)
    check_inventory(view, rest)
    check_dtypes(view, rest)
    if view.kind == "resampler":
        view.min_ggk = SEEDLESS_MIN_GGK
    return view


def _layer_map_values(reader) -> tuple[int, ...]:
    """adapter.layer_map as tap numbers when it is a 1-D f32 of whole numbers, else ()."""
    import gguf

    for t in reader.tensors:
        if rest_name(t.name) == "layer_map" and len(t.shape) == 1:
            if t.tensor_type != gguf.GGMLQuantizationType.F32:
                return ()
            values = np.asarray(t.data, dtype=np.float64)
            if np.all(np.isfinite(values)) and np.all(values == np.round(values)):
                return tuple(int(v) for v in values)
    return ()


def read_adapter_arrays(path, reader: GGUFFile | None = None) -> dict[str, np.ndarray]:
    """Every adapter tensor as float32 in torch shape order, keyed by its state-dict name.
    Quantized and bf16 data are dequantized the way the engine converts them. `reader`: as
    read_adapter's."""
    import gguf

    if reader is None:
        reader = open_adapter(path)
    arrays = {}
    for t in reader.tensors:
        name = rest_name(t.name)
        if name is None:
            continue
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            data = np.asarray(t.data, dtype=np.float32)
        else:
            data = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        arrays[name] = np.array(
            data.reshape(shape), dtype=np.float32, copy=True
        )  # writable, off the memmap
    return arrays

