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
from hostile_gguf_files import ARRAY, HOSTILE, STRING, U32, gstr, header, kv, padded, tinfo

from gguf_trainer import cli
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.exit_codes import EXIT_USER
from gguf_trainer.base.gguf_bounds import check_gguf
from gguf_trainer.model.adapter_file import read_adapter


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
    from gguf_trainer.model.student import read_student_tensors

    with pytest.raises(UserError, match="truncated or not a GGUF file; re-download") as e:
        read_student_tensors(hostile)
    _one_sentence(str(e.value))


def test_load_gguf_refuses(hostile):
    from gguf_trainer.model.adapters import load_gguf

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
