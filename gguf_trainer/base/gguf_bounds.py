"""Bounded scan of an untrusted GGUF file: the one walk gguf_read.py reads files with, and the
pre-scan before anything else (tests, a companion writer) hands a file to `gguf.GGUFReader`.

GGUFReader trusts the counts in the header: a 30-byte file that declares a 2^50-element
metadata array makes it loop and allocate without limit, and a tensor that claims more
bytes than the file has turns into a numpy error deep inside it. `check_gguf` walks the
header, every key/value and every tensor description with plain `struct` reads on an mmap,
checks each count and size against the bytes the file actually has, and raises one
`UserError` sentence naming the first problem. Only a file that passes is read further,
so that work is bounded by the file size.

Must not: import torch or allocate anything proportional to a declared count. Library code:
it knows nothing of projects or adapters (callers add the "what to do" half of the sentence).

The scan also records what it walked (every key's types and value, every tensor's dims, type
and offset) so gguf_read.py builds its fields and memory-mapped tensors without a second walk.
A string array is walked in one tight loop and decoded as one UTF-8 text (a 248k-token
vocabulary: ~0.3 s on a quiet machine, where GGUFReader's per-item numpy views take ~16 s).

Usage: `check_gguf(path, fix="re-export it")`; `scan_buffer(buf, size, path, fix)` on a
mapped file.
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
# GGUFValueType -> numpy type code, as GGUFReader reads each scalar
NUMPY_CODES = {0: "u1", 1: "i1", 2: "u2", 3: "i2", 4: "u4", 5: "i4", 6: "f4", 7: "?", 10: "u8",
               11: "i8", 12: "f8"}


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
    # key -> (GGUFReader's `types` as ints, value); see `_value` for the value forms
    kv: dict[str, tuple[tuple[int, ...], object]] = field(default_factory=dict, compare=False)
    tensors: tuple[TensorInfo, ...] = field(default=(), compare=False)
    byte_order: str = "<"  # "<" or ">", as struct and numpy spell it
    alignment: int = DEFAULT_ALIGNMENT


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # ggml order, ne[0] innermost
    raw_type: int  # GGMLQuantizationType value
    offset: int  # from the start of the data region
    n_bytes: int


class StringItems:
    """A metadata string array, decoded once as one text: `len()`, `[i]`, `list()` on demand
    (248k Python strings are built only when a caller asks for them)."""

    def __init__(self, text: str, bounds):
        self.text, self.bounds = text, bounds  # bounds: count + 1 character offsets (numpy)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, i: int) -> str:
        return self.text[int(self.bounds[i]):int(self.bounds[i + 1])]

    def to_list(self) -> list[str]:
        text, b = self.text, self.bounds.tolist()
        return [text[b[i]:b[i + 1]] for i in range(len(b) - 1)]


def too_short(size: int) -> str:
    return f"it is {size} bytes long, shorter than a GGUF header"


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
                raise _Refused(too_short(size))
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return scan_buffer(buf, size, path, fix)
    except _Refused as e:
        raise UserError(f"{path} is truncated or not a GGUF file; {fix} ({e}).") from None
    except OSError as e:  # unreadable: permissions, an I/O error, a directory
        raise UserError(f"{path} cannot be read ({e.strerror or e}); {fix}.") from None


def scan_buffer(buf, size: int, path, fix: str) -> GGUFLayout:
    """check_gguf on an already mapped file (`buf`: mmap, memoryview or bytes of `size` bytes),
    with the same sentences."""
    try:
        return _Scanner(buf, size).scan()
    except _Refused as e:
        raise UserError(f"{path} is truncated or not a GGUF file; {fix} ({e}).") from None


class _Scanner:
    """A cursor over the mapped file; every read checks that its bytes exist first."""

    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0
        self.order = "<"
        self.items = 0  # metadata array items seen so far (bounded by MAX_METADATA_ITEMS)
        self.alignment = DEFAULT_ALIGNMENT
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.strings: dict[str, str] = {}
        self.kv: dict[str, tuple[tuple[int, ...], object]] = {}
        self.tensors: list[TensorInfo] = []

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
                          self.strings, self.kv, tuple(self.tensors), self.order, self.alignment)

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
            self.kv[key] = ((UINT32,), align)
            return
        self.kv[key] = self._value(vtype, key, depth=0)

    def _value(self, vtype: int, key: str, depth: int) -> tuple[tuple[int, ...], object]:
        """(types, value): GGUFReader's `types` (the type, then an array's item types, read
        from its first item) and the value: a Python scalar or str, a numpy array (numeric
        array), StringItems (string array) or a list of such values (array of arrays)."""
        if vtype in SCALAR_BYTES:
            start = self._take(SCALAR_BYTES[vtype], f"the value of {key!r}")
            return (vtype,), self._numbers(vtype, start, 1).tolist()[0]
        if vtype == STRING:
            value = self._string(f"the value of {key!r}")
            if depth == 0:
                self.strings[key] = value
            return (vtype,), value
        if vtype == ARRAY:
            return self._array(key, depth)
        raise _Refused(f"metadata {key!r} has unknown value type {vtype}")

    def _numbers(self, vtype: int, start: int, count: int):
        import numpy as np

        dtype = np.dtype(NUMPY_CODES[vtype]).newbyteorder(self.order)
        return np.frombuffer(self.buf, dtype, count, start).copy()  # off the mapping

    def _array(self, key: str, depth: int) -> tuple[tuple[int, ...], object]:
        if depth >= MAX_ARRAY_DEPTH:
            raise _Refused(f"metadata {key!r} nests arrays deeper than {MAX_ARRAY_DEPTH} levels")
        itype = self._u32(f"the item type of {key!r}")
        count = self._u64(f"the length of {key!r}")
        self.items += count
        if self.items > MAX_METADATA_ITEMS:
            raise _Refused(f"its metadata arrays hold more than {MAX_METADATA_ITEMS} items "
                           f"({key!r} alone declares {count})")
        # GGUFReader's types list the item type only when there is a first item
        types = (ARRAY, itype) if count and itype != ARRAY else (ARRAY,)
        if itype in SCALAR_BYTES:  # fixed-size items: one bounds check for the whole array
            start = self._take(count * SCALAR_BYTES[itype], f"the {count} items of {key!r}")
            return types, self._numbers(itype, start, count)
        if itype not in (STRING, ARRAY):
            raise _Refused(f"metadata {key!r} has unknown item type {itype}")
        self._fits(count, 8 if itype == STRING else 12, f"items in {key!r}")
        if itype == STRING:
            items = self._string_items(count)
            if items is not None:
                return types, items
        values = [self._value(itype, key, depth + 1) for _ in range(count)]
        if itype == STRING:  # only reached when _string_items declined
            return types, _as_string_items([v for _, v in values])
        return (types + values[0][0] if values else types), [v for _, v in values]

    def _string_items(self, count: int) -> StringItems | None:
        """A whole string array at once: the lengths walked in one tight loop, the bytes
        decoded as one UTF-8 text. None when an item runs past the file or is not UTF-8 on
        its own; the caller then walks item by item for the exact sentence."""
        import numpy as np

        buf, size, pos = self.buf, self.size, self.pos
        unpack = struct.Struct(self.order + "Q").unpack_from
        heads = []  # where each item's 8-byte length sits
        add = heads.append
        for _ in range(count):
            if size - pos < 8:
                return None
            add(pos)
            pos += 8 + unpack(buf, pos)[0]
            if pos > size:
                return None
        first = self.pos
        heads = np.array(heads, np.int64) - first
        raw = np.frombuffer(buf, np.uint8, pos - first, first)
        keep = np.ones(len(raw), bool)
        keep[(heads[:, None] + np.arange(8)).ravel()] = False
        joined = raw[keep]  # the items' bytes, back to back (a copy: off the mapping)
        del raw
        try:
            text = joined.tobytes().decode("utf-8")
        except UnicodeDecodeError:
            return None
        starts = np.zeros(count + 1, np.int64)
        starts[1:] = np.arange(1, count + 1) * -8
        starts[1:-1] += heads[1:]
        starts[-1] += pos - first
        # Each item is valid UTF-8 alone iff the whole text is and no item starts inside a
        # character (on a continuation byte 10xxxxxx).
        lead = (joined & 0xC0) != 0x80
        firsts = starts[:-1][starts[:-1] < starts[1:]]
        if not lead[firsts].all():
            return None
        chars = np.zeros(len(joined) + 1, np.int64)
        np.cumsum(lead, out=chars[1:])
        self.pos = pos
        return StringItems(text, chars[starts])

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
        self.tensors.append(TensorInfo(name, tuple(dims), raw_type, offset, n_bytes))
        return name, n_bytes, offset

    @staticmethod
    def _check_names(tensors: list[tuple[str, int, int]]) -> None:
        seen: set[str] = set()
        for name, _, _ in tensors:
            if name in seen:
                raise _Refused(f"tensor {name!r} appears twice")
            seen.add(name)


def _as_string_items(values: list[str]) -> StringItems:
    import numpy as np

    bounds = np.zeros(len(values) + 1, np.int64)
    np.cumsum([len(v) for v in values], out=bounds[1:])
    return StringItems("".join(values), bounds)
