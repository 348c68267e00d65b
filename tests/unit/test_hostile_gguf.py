"""Class 7 of the hostile-input catalogue: untrusted GGUF files are parsed with bounds.

Every reader of GGUF files (inspect, the student loader, adapters.load_gguf) refuses a file
whose counts or sizes do not fit in it with one sentence, before allocating anything. Each
member below would make gguf.GGUFReader loop, allocate without limit or fail with a numpy
error; the test asserts the sentence and that reading takes no measurable memory.
"""

from __future__ import annotations

import resource
import struct

import pytest

from gguf_trainer import cli
from gguf_trainer.adapter_file import read_adapter
from gguf_trainer.errors import UserError
from gguf_trainer.exit_codes import EXIT_USER
from gguf_trainer.gguf_bounds import MAX_KEYS, MAX_METADATA_ITEMS, MAX_TENSORS, check_gguf

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


@pytest.fixture(params=sorted(HOSTILE))
def hostile(request, tmp_path):
    path = tmp_path / f"{request.param}.gguf"
    path.write_bytes(HOSTILE[request.param])
    return path


def _one_sentence(text: str) -> None:
    assert "Traceback" not in text and "\n" not in text.strip(), text
    assert text.strip().endswith("."), text


def _max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_check_gguf_refuses_before_allocating(hostile):
    before = _max_rss_mib()
    with pytest.raises(UserError) as e:
        check_gguf(hostile, fix="choose another file")
    _one_sentence(str(e.value))
    assert str(hostile) in str(e.value) and "choose another file" in str(e.value)
    assert _max_rss_mib() - before < 64  # the peak did not grow with a declared count


def test_inspect_cli_says_one_sentence(hostile, capsys):
    code = cli.main(["inspect", str(hostile)])
    out = capsys.readouterr()
    assert code == EXIT_USER and out.out == ""
    assert out.err.startswith("error: ") and "truncated or not a GGUF file" in out.err
    _one_sentence(out.err)


def test_student_reader_refuses(hostile):
    from gguf_trainer.student import read_student_tensors

    with pytest.raises(UserError, match="truncated or not a GGUF file; re-download") as e:
        read_student_tensors(hostile)
    _one_sentence(str(e.value))


def test_load_gguf_refuses(hostile):
    from gguf_trainer.adapters import load_gguf

    with pytest.raises(UserError, match="re-export it or choose another file") as e:
        load_gguf(hostile)
    _one_sentence(str(e.value))


def test_bounds_agree_with_gguf_reader_on_whole_files(tmp_path, tiny_materials):
    """A whole file passes and the pre-scan finds the data region where GGUFReader does."""
    import gguf
    import numpy as np

    meta = header(1, 2) + kv("general.alignment", U32, struct.pack("<I", 64))
    meta += kv("tok", ARRAY, struct.pack("<IQ", STRING, 2) + gstr("a") + gstr("bc"))
    good = padded(meta + tinfo("adapter.query", [4, 2]), 64) + b"\0" * 32
    path = tmp_path / "good.gguf"
    path.write_bytes(good)
    big_endian = tmp_path / "be.gguf"
    w = gguf.GGUFWriter(str(big_endian), "x", endianess=gguf.GGUFEndian.BIG)
    w.add_array("toks", ["a", "bc"])
    w.add_tensor("t", np.zeros((2, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for p in (path, big_endian, tiny_materials["student"]):
        layout = check_gguf(p)
        assert layout.data_offset == gguf.GGUFReader(p).data_offset
    # one byte less of tensor data and the same file is refused
    path.write_bytes(good[:-1])
    with pytest.raises(UserError, match="needs bytes up to offset"):
        check_gguf(path)


def test_a_foreign_file_stays_a_report_not_an_error(tmp_path):
    """Well-formed but not an adapter: inspect reports it, the bounds do not refuse it."""
    path = tmp_path / "other.gguf"
    path.write_bytes(
        padded(
            header(1, 1)
            + kv("general.name", STRING, gstr("llm"))
            + tinfo("token_embd.weight", [8, 2])
        )
        + b"\0" * 64
    )
    view = read_adapter(path)
    assert view.kind is None and any("no adapter.* tensors" in p for p in view.problems)
