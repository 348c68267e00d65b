"""Bounded pre-scan of an untrusted GGUF file, before `gguf.GGUFReader` sees it.

GGUFReader trusts the counts in the header: a 30-byte file that declares a 2^50-element
metadata array makes it loop and allocate without limit, and a tensor that claims more
bytes than the file has turns into a numpy error deep inside it. `check_gguf` walks the
header, every key/value and every tensor description with plain `struct` reads on an mmap,
checks each count and size against the bytes the file actually has, and raises one
`UserError` sentence naming the first problem. Only a file that passes is handed to
GGUFReader, whose own work is then bounded by the file size.

Must not: import torch or allocate anything proportional to a declared count. Library code:
it knows nothing of projects or adapters (callers add the "what to do" half of the sentence).

Usage: `check_gguf(path, fix="re-export it")` before `GGUFReader(path)`.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from gguf_trainer.base.errors import UserError

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)  # what gguf.GGUFReader reads; v1 used 32-bit counts
HEADER_BYTES = 24  # magic, version u32, tensor count u64, kv count u64
MAX_DIMS = 4  # GGML_MAX_DIMS: the engine and llama.cpp refuse more
MAX_ARRAY_DEPTH = 8  # arrays of arrays; GGUFReader recurses once per level
# GGUFReader keeps a numpy view per metadata array item (~100 bytes each). A 256k-token
# vocabulary with scores, types and merges is ~1M items; 4M bounds its memory to well under 1 GiB.
MAX_METADATA_ITEMS = 4 << 20
# GGUFReader builds a Python object per key and per tensor. Real files hold tens of keys and
# at most a few thousand tensors; these caps keep a file of tiny entries from costing GiBs.
MAX_KEYS = 1 << 16
MAX_TENSORS = 1 << 16
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"

# GGUFValueType -> byte size of a scalar (STRING=8 and ARRAY=9 are variable).
SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY, UINT32 = 8, 9, 4


@dataclass(frozen=True)
class GGUFLayout:
    """What the pre-scan established; every tensor's bytes lie inside the file."""

    version: int
    n_tensors: int
    n_kv: int
    data_offset: int  # start of the tensor data region
    file_bytes: int
    # What identifies a file without reading its data (discovery compares them): each
    # tensor's dims in ggml order (ne[0] innermost) and each top-level string value.
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict, compare=False)
    strings: dict[str, str] = field(default_factory=dict, compare=False)


class _Refused(Exception):
    """Internal: the reason a file is refused (turned into a UserError by check_gguf)."""


def check_gguf(path: str | os.PathLike, fix: str = "choose another file") -> GGUFLayout:
    """Refuse (UserError) a file whose header, metadata or tensor table does not fit in it.

    The sentence is "<path> is truncated or not a GGUF file; <fix> (<why>)." `fix` is the
    caller's advice (re-download the student, re-export the adapter).
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < HEADER_BYTES:
                raise _Refused(f"it is {size} bytes long, shorter than a GGUF header")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _Scanner(buf, size).scan()
    except _Refused as e:
        raise UserError(f"{path} is truncated or not a GGUF file; {fix} ({e}).") from None
    except OSError as e:  # unreadable: permissions, an I/O error, a directory
        raise UserError(f"{path} cannot be read ({e.strerror or e}); {fix}.") from None


class _Scanner:
    """A cursor over the mapped file; every read checks that its bytes exist first."""

    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0
        self.order = "<"
        self.items = 0  # metadata array items seen so far (bounded by MAX_METADATA_ITEMS)
        self.alignment = DEFAULT_ALIGNMENT
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.strings: dict[str, str] = {}

    def scan(self) -> GGUFLayout:
        if self.buf[:4] != MAGIC:
            raise _Refused("it does not start with the GGUF magic bytes")
        self.pos = 4
        version = self._u32()
        if version & 0xFFFF == 0:  # written on a machine of the other byte order
            self.order = ">"
            version = struct.unpack(">I", struct.pack("<I", version))[0]
        if version not in SUPPORTED_VERSIONS:
            raise _Refused(f"it declares GGUF version {version}, and only versions 2 and 3 "
                           "can be read")
        n_tensors, n_kv = self._u64(), self._u64()
        # Each key/value needs at least 13 bytes and each tensor description 24: a count
        # that cannot fit in what is left of the file is refused before any loop runs.
        self._fits(n_kv, 13, "metadata entries")
        if n_kv > MAX_KEYS:
            raise _Refused(f"it declares {n_kv} metadata entries (at most {MAX_KEYS} are read)")
        keys: set[str] = set()
        for _ in range(n_kv):
            self._key_value(keys)
        self._fits(n_tensors, 24, "tensors")
        if n_tensors > MAX_TENSORS:
            raise _Refused(f"it declares {n_tensors} tensors (at most {MAX_TENSORS} are read)")
        tensors = [self._tensor_info(i) for i in range(n_tensors)]
        self._check_names(tensors)
        data_offset = -(-self.pos // self.alignment) * self.alignment
        for name, n_bytes, offset in tensors:
            end = data_offset + offset + n_bytes
            if end > self.size:
                raise _Refused(f"tensor {name!r} needs bytes up to offset {end} but the file "
                               f"has {self.size} (truncated?)")
        return GGUFLayout(version, n_tensors, n_kv, data_offset, self.size, self.shapes,
                          self.strings)

    # ------------------------------------------------------------ primitive reads

    def _take(self, n: int, what: str) -> int:
        start = self.pos
        if n > self.size - start:
            raise _Refused(f"{what} at offset {start} needs {n} bytes but only "
                           f"{self.size - start} remain (truncated?)")
        self.pos = start + n
        return start

    def _unpack(self, fmt: str, what: str):
        start = self._take(struct.calcsize(fmt), what)
        return struct.unpack_from(self.order + fmt, self.buf, start)[0]

    def _u32(self, what: str = "a 32-bit field") -> int:
        return self._unpack("I", what)

    def _u64(self, what: str = "a 64-bit count") -> int:
        return self._unpack("Q", what)

    def _fits(self, count: int, min_bytes: int, what: str) -> None:
        left = self.size - self.pos
        if count * min_bytes > left:
            raise _Refused(f"it declares {count} {what}, more than its remaining {left} bytes "
                           "can hold")

    def _string(self, what: str) -> str:
        n = self._u64(f"the length of {what}")
        start = self._take(n, what)
        try:
            return bytes(self.buf[start:start + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise _Refused(f"{what} at offset {start} is not valid UTF-8") from None

    # ------------------------------------------------------------ metadata

    def _key_value(self, keys: set[str]) -> None:
        key = self._string("a metadata key")
        if key in keys:
            raise _Refused(f"metadata key {key!r} appears twice")
        keys.add(key)
        vtype = self._u32(f"the type of {key!r}")
        if key == ALIGNMENT_KEY:
            if vtype != UINT32:
                raise _Refused(f"{key} must be a uint32")
            align = self._u32(key)
            if align == 0 or align & (align - 1):
                raise _Refused(f"{key} is {align}, not a power of two")
            self.alignment = align
            return
        self._value(vtype, key, depth=0)

    def _value(self, vtype: int, key: str, depth: int) -> None:
        if vtype in SCALAR_BYTES:
            self._take(SCALAR_BYTES[vtype], f"the value of {key!r}")
        elif vtype == STRING:
            value = self._string(f"the value of {key!r}")
            if depth == 0:
                self.strings[key] = value
        elif vtype == ARRAY:
            self._array(key, depth)
        else:
            raise _Refused(f"metadata {key!r} has unknown value type {vtype}")

    def _array(self, key: str, depth: int) -> None:
        if depth >= MAX_ARRAY_DEPTH:
            raise _Refused(f"metadata {key!r} nests arrays deeper than {MAX_ARRAY_DEPTH} levels")
        itype = self._u32(f"the item type of {key!r}")
        count = self._u64(f"the length of {key!r}")
        self.items += count
        if self.items > MAX_METADATA_ITEMS:
            raise _Refused(f"its metadata arrays hold more than {MAX_METADATA_ITEMS} items "
                           f"({key!r} alone declares {count})")
        if itype in SCALAR_BYTES:  # fixed-size items: one bounds check for the whole array
            self._take(count * SCALAR_BYTES[itype], f"the {count} items of {key!r}")
            return
        if itype not in (STRING, ARRAY):
            raise _Refused(f"metadata {key!r} has unknown item type {itype}")
        self._fits(count, 8 if itype == STRING else 12, f"items in {key!r}")
        for _ in range(count):
            self._value(itype, key, depth + 1)

    # ------------------------------------------------------------ tensor table

    def _tensor_info(self, index: int) -> tuple[str, int, int]:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # numpy-only

        name = self._string(f"the name of tensor {index}")
        n_dims = self._u32(f"the rank of tensor {name!r}")
        if n_dims > MAX_DIMS:
            raise _Refused(f"tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})")
        dims = [self._u64(f"a dimension of tensor {name!r}") for _ in range(n_dims)]
        raw_type = self._u32(f"the type of tensor {name!r}")
        offset = self._u64(f"the data offset of tensor {name!r}")
        try:
            block, type_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(raw_type)]
        except (ValueError, KeyError):
            raise _Refused(f"tensor {name!r} has unknown ggml type {raw_type}") from None
        if dims and dims[0] % block:
            raise _Refused(f"tensor {name!r} has a first dimension of {dims[0]}, not a multiple "
                           f"of its type's block size {block}")
        n_elements = 1
        for d in dims:
            n_elements *= d  # Python ints: no overflow, compared with the file size below
        n_bytes = n_elements // block * type_bytes
        if n_bytes > self.size or offset > self.size:
            raise _Refused(f"tensor {name!r} declares {n_bytes} bytes at offset {offset}, more "
                           f"than the whole file ({self.size} bytes)")
        self.shapes[name] = tuple(dims)
        return name, n_bytes, offset

    @staticmethod
    def _check_names(tensors: list[tuple[str, int, int]]) -> None:
        seen: set[str] = set()
        for name, _, _ in tensors:
            if name in seen:
                raise _Refused(f"tensor {name!r} appears twice")
            seen.add(name)
