"""Hostile GGUF files (class 7 of the hostile-input catalogue), built byte by byte: each
declares counts or sizes that do not fit in it. Shared by the reader tests
(tests/unit/model/test_hostile_gguf.py) and the pipeline's student refusal
(tests/unit/runner/test_hostile_runs.py)."""

from __future__ import annotations

import struct

from gguf_trainer.base.gguf_bounds import MAX_KEYS, MAX_METADATA_ITEMS, MAX_TENSORS

U8, U32, STRING, ARRAY = 0, 4, 8, 9
F32 = 0  # ggml type


def header(n_tensors: int, n_kv: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def gstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + payload


def tinfo(name: str, dims: list[int], ggml_type: int = F32, offset: int = 0) -> bytes:
    return (gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", ggml_type, offset))


def nested(depth: int) -> bytes:
    """An array of arrays `depth` levels deep, each holding one element."""
    inner = struct.pack("<IQ", U8, 1) + b"\x00"
    for _ in range(depth - 1):
        inner = struct.pack("<IQ", ARRAY, 1) + inner
    return inner


def padded(b: bytes, align: int = 32) -> bytes:
    return b + b"\x00" * (-len(b) % align)


# fmt: off
HOSTILE = {
    # the example: 30 bytes that declare a 2^50-element uint8 array
    "huge_u8_array": header(0, 1) + kv("a", ARRAY, struct.pack("<IQ", U8, 1 << 50)),
    "huge_string_array": header(0, 1) + kv("tok", ARRAY, struct.pack("<IQ", STRING, 1 << 40)),
    "huge_array_of_arrays": header(0, 1) + kv("x", ARRAY, struct.pack("<IQ", ARRAY, 1 << 33)),
    "too_many_items": header(0, 1) + kv("n", ARRAY, struct.pack("<IQ", U8, MAX_METADATA_ITEMS + 1))
                      + b"\x00" * (MAX_METADATA_ITEMS + 1),
    "huge_kv_count": header(0, 1 << 60),
    "many_small_keys": header(0, MAX_KEYS + 1) + kv("", U8, b"\0") * (MAX_KEYS + 1),
    "many_small_tensors": header(MAX_TENSORS + 1, 0)
                          + b"".join(tinfo(f"t{i}", []) for i in range(MAX_TENSORS + 1)),
    "huge_tensor_count": header(1 << 60, 0),
    "huge_key_length": header(0, 1) + struct.pack("<Q", 1 << 63) + b"abc",
    "huge_string_value": header(0, 1) + kv("s", STRING, struct.pack("<Q", 1 << 62)),
    "deep_nesting": header(0, 1) + kv("deep", ARRAY, nested(200)),
    "non_utf8_key": header(0, 1) + kv(b"\xff\xfe", U32, b"\x01\x00\x00\x00"),
    "non_utf8_value": header(0, 1) + kv("general.name", STRING, gstr(b"caf\xe9")),
    "unknown_value_type": header(0, 1) + kv("k", 77, b"\x00" * 8),
    "duplicate_key": header(0, 2) + kv("k", U32, b"\0" * 4) * 2,
    "bad_alignment": header(0, 1) + kv("general.alignment", U32, struct.pack("<I", 3)),
    "version_1": header(0, 0, version=1),
    "version_99": header(0, 0, version=99),
    "bad_magic": b"GGUX" + header(0, 0)[4:],
    "empty": b"",
    "ten_bytes": b"GGUF\x03\x00\x00\x00\x00\x00",
    "huge_dims": padded(header(1, 0) + tinfo("adapter.query", [1 << 20, 1 << 20, 1 << 20])),
    "overflowing_dims": padded(header(1, 0) + tinfo("adapter.query", [1 << 63, 1 << 63, 4, 4])),
    "too_many_dims": header(1, 0) + tinfo("adapter.query", [1] * 1000),
    "data_past_eof": padded(header(1, 0) + tinfo("adapter.query", [64, 4])) + b"\0" * 100,
    "offset_past_eof": (padded(header(1, 0) + tinfo("adapter.query", [1], offset=1 << 40))
                        + b"\0" * 4),
    "unknown_ggml_type": padded(header(1, 0) + tinfo("adapter.query", [4], ggml_type=999)),
    "partial_block": padded(header(1, 0) + tinfo("adapter.query", [33], ggml_type=8)) + b"\0" * 64,
    "duplicate_tensor": (padded(header(2, 0) + tinfo("a", [1]) + tinfo("a", [1], offset=32))
                         + b"\0" * 64),
}
# fmt: on
