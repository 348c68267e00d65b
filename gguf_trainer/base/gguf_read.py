"""Read a GGUF file fast and bounded: its metadata, tensor table and memory-mapped tensor data.

gguf.GGUFReader builds a numpy view per metadata array item: a file carrying a 248k-token
vocabulary (the slot kinds' exports, any LLM GGUF) takes ~16 s to open, every time. This
reader takes the bounded pre-scan's single walk (gguf_bounds.scan_buffer: every count and size
checked against the file first, the same one-sentence refusals) and returns what GGUFReader
does for the parts this project reads, equal value for value (tests/unit/base/test_gguf_read.py
compares them on every kind of file the tests build): `fields[key].types` / `.contents()`,
and per tensor `name`, `tensor_type`, `shape` (ne order), `n_elements`, `n_bytes`,
`data_offset`, `data` (a read-only view of the mapped file, GGUFReader's dtype and shape).
String arrays are decoded as one text; Python lists are built only by `contents()`.

Must not: import torch, or know about adapters or students (callers add the advice in `fix`).
Differs from GGUFReader only on arrays of arrays whose items have different types (GGUFReader
returns bytes there; no file this project reads has one).

Usage:
    f = read_gguf(path, fix="re-export it")   # UserError: one sentence, as check_gguf's
    f.fields["general.name"].contents(); [t.name for t in f.tensors]
    del f                                     # drops the mapping (before a rename)
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.gguf_bounds import HEADER_BYTES, StringItems, scan_buffer, too_short

# ggml types GGUFReader views as numbers; every other type is a uint8 view of its blocks
_PLAIN = {0: "f4", 1: "f2", 24: "i1", 25: "i2", 26: "i4", 27: "i8", 28: "f8"}


@dataclass(frozen=True)
class Field:
    """One metadata key/value, as GGUFReader's ReaderField answers `types` and `contents()`."""

    name: str
    types: list  # GGUFValueType: the value's type, then an array's item types
    value: object  # see gguf_bounds._Scanner._value

    def contents(self):
        return _plain(self.value)


@dataclass(frozen=True)
class Tensor:
    name: str
    tensor_type: object  # GGMLQuantizationType
    shape: np.ndarray  # uint64, ne order (ne[0] innermost), as GGUFReader's
    n_elements: int
    n_bytes: int
    data_offset: int  # from the start of the file
    data: np.ndarray  # read-only view of the mapping


@dataclass(frozen=True)
class GGUFFile:
    path: str
    version: int
    alignment: int
    data_offset: int  # start of the tensor data region
    byte_order: str  # "<" or ">"
    fields: dict[str, Field]  # GGUFReader's keys, GGUF.version/tensor_count/kv_count first
    tensors: list[Tensor]


def read_gguf(path: str | os.PathLike, fix: str = "choose another file") -> GGUFFile:
    """Every key and tensor of `path`. UserError (one sentence ending in `fix`) for a file
    that is short, garbled or whose counts do not fit in it."""
    from gguf.constants import GGMLQuantizationType, GGUFValueType  # numpy-only

    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < HEADER_BYTES:  # mmap refuses an empty file: say what check_gguf says
                raise UserError(f"{path} is truncated or not a GGUF file; {fix} "
                                f"({too_short(size)}).")
            # The walk slices an mmap (bytes per slice: ~2x faster than a numpy memoryview);
            # the tensors are views of np.memmap, as GGUFReader's are.
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                layout = scan_buffer(buf, size, path, fix)
            mapped = np.memmap(f, mode="r", shape=(size,))
    except OSError as e:  # unreadable: permissions, an I/O error, a directory
        raise UserError(f"{path} cannot be read ({e.strerror or e}); {fix}.") from None
    fields = {
        "GGUF.version": Field("GGUF.version", [GGUFValueType.UINT32], layout.version),
        "GGUF.tensor_count": Field("GGUF.tensor_count", [GGUFValueType.UINT64],
                                   layout.n_tensors),
        "GGUF.kv_count": Field("GGUF.kv_count", [GGUFValueType.UINT64], layout.n_kv),
    }
    for key, (types, value) in layout.kv.items():
        fields[key] = Field(key, [GGUFValueType(t) for t in types], value)
    tensors = [_tensor(mapped, layout, info, GGMLQuantizationType(info.raw_type))
               for info in layout.tensors]
    return GGUFFile(str(path), layout.version, layout.alignment, layout.data_offset,
                    layout.byte_order, fields, tensors)


def _tensor(mapped: np.memmap, layout, info, ggml_type) -> Tensor:
    from gguf.quants import quant_shape_to_byte_shape

    start = layout.data_offset + info.offset
    n_elements = 1
    for d in info.dims:
        n_elements *= d
    np_dims = tuple(reversed(info.dims))
    code = _PLAIN.get(info.raw_type)
    if code is None:
        dtype, np_dims = np.dtype(np.uint8), quant_shape_to_byte_shape(np_dims, ggml_type)
    else:
        dtype = np.dtype(code).newbyteorder(layout.byte_order)
    data = mapped[start:start + info.n_bytes].view(dtype).reshape(np_dims)
    return Tensor(info.name, ggml_type, np.array(info.dims, dtype=np.uint64), n_elements,
                  info.n_bytes, start, data)


def _plain(value):
    """What GGUFReader's contents() returns: Python scalars and flat lists (an array of
    arrays is flattened to its leaves)."""
    if isinstance(value, StringItems):
        return value.to_list()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list):
        return [leaf for item in value for leaf in _plain(item)]
    return value
