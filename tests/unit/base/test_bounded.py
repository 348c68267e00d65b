"""Files that never end (issue 29, item 5): a FIFO, /dev/zero or a file larger than its
format implies is refused in one sentence naming it, never read whole or waited on."""

from __future__ import annotations

import os

import numpy as np
import pytest

from gguf_trainer import check
from gguf_trainer.base import bounded
from gguf_trainer.base.errors import UserError
from gguf_trainer.data import shards


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "shard-00000.safetensors"
    os.mkfifo(path)
    return path


def test_a_fifo_is_refused_without_blocking(fifo):
    with pytest.raises(UserError, match="not a regular file"):
        bounded.open_regular(fifo)


def test_a_link_to_dev_zero_is_refused(tmp_path):
    (tmp_path / "z").symlink_to("/dev/zero")
    with pytest.raises(UserError, match="z is not a regular file"):
        bounded.read_bytes(tmp_path / "z", 10, "x")


def test_a_file_larger_than_implied_is_refused(tmp_path):
    (tmp_path / "t").write_bytes(b"1\n" * 100)
    with pytest.raises(UserError, match="t is 200 bytes, more than a tokens file can be"):
        bounded.read_bytes(tmp_path / "t", 100, "a tokens file")


def test_verify_of_a_fifo_shard_does_not_hang(fifo):
    assert shards.read_meta(fifo) is None
    assert shards.check_shard(fifo) == "unreadable or truncated"


def test_a_sparse_shard_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "shard.safetensors"
    with open(path, "wb") as f:
        f.truncate(6 << 30)  # 6 GiB of holes: read whole it would be 6 GiB of memory
    assert shards.check_shard(path) == "unreadable or truncated"


def test_a_huge_tokens_txt_is_a_sentence_not_read_whole(tmp_path):
    tokens = tmp_path / "tokens.txt"
    with open(tokens, "wb") as f:
        f.truncate(2 << 30)  # 2 GiB (sparse): read whole it would end in MemoryError
    with pytest.raises(UserError, match="tokens.txt is 2,147,483,648 bytes"):
        check.read_ids(tokens)


def test_a_nan_dump_is_refused_not_called_weak(tmp_path):
    dump = tmp_path / "adapter_out.bin"
    np.array([[1.0, float("nan")]], dtype="<f4").tofile(dump)
    with pytest.raises(UserError, match="NaN or infinite"):
        check.read_dump(dump, 2, max_rows=1)


# ---- dumps bounded by the rows x width the adapter implies ---------------------------------------
def _sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)  # holes: no disk, but read whole it would be `size` bytes of memory
    return path


def test_an_8_gib_context_bin_is_refused_by_the_rows_the_adapter_makes(tmp_path):
    _sparse(tmp_path / "context.bin", 8 << 30)
    with pytest.raises(UserError, match=r"context.bin is 8,589,934,592 bytes, more than a dump "
                                        r"of 256 rows of 2560 f32 values"):
        check.read_dump(tmp_path, 2560, max_rows=256)  # the folder: context.bin comes first


def test_a_dump_of_the_implied_size_is_read(tmp_path):
    np.ones((3, 4), "<f4").tofile(tmp_path / "adapter_out.bin")
    assert check.read_dump(tmp_path, 4, max_rows=3).shape == (3, 4)
    with pytest.raises(UserError, match="more than a dump of 2 rows of 4"):
        check.read_dump(tmp_path, 4, max_rows=2)


def test_a_huge_render_dump_is_a_sentence_naming_it(tmp_path):
    from gguf_trainer import render

    teacher, adapter = tmp_path / "teacher", tmp_path / "adapter"
    for d in (teacher, adapter):
        d.mkdir()
        (d / "tokens.txt").write_text("1\n2\n3\n")
    _sparse(teacher / render.TEACHER_DUMP, 3 * 4 << 30)  # 4 GiB a row: a width no pack has
    np.ones((3, 16), "<f4").tofile(adapter / render.ADAPTER_DUMP)
    with pytest.raises(UserError, match=r"llm_hidden.bin is 12,884,901,888 bytes, more than a "
                                        r"dump of 3 rows \(its tokens.txt\) of at most 2560"):
        render.dump_cosine(teacher, adapter, max_dim=2560)
    np.ones((3, 16), "<f4").tofile(teacher / render.TEACHER_DUMP)
    _sparse(adapter / render.ADAPTER_DUMP, 6 << 30)
    with pytest.raises(UserError, match="adapter_out.bin is 6,442,450,944 bytes"):
        render.dump_cosine(teacher, adapter, max_dim=2560)
    np.ones((3, 16), "<f4").tofile(adapter / render.ADAPTER_DUMP)
    assert render.dump_cosine(teacher, adapter, max_dim=2560)["cos"] == pytest.approx(1.0)


def test_a_huge_vis_pos_txt_is_a_sentence(tmp_path):
    _sparse(tmp_path / check.VIS_POS, 2 << 30)
    with pytest.raises(UserError, match="vis_pos.txt is 2,147,483,648 bytes"):
        check.read_vision_dump(tmp_path, 8)


# ---- out of memory while a file is read: the file, not train.batch_size -------------------------
def test_out_of_memory_reading_a_file_names_the_file_not_the_batch(tmp_path, monkeypatch):
    from gguf_trainer.base.errors import as_user_error

    path = tmp_path / "adapter_out.bin"
    np.ones((2, 2), "<f4").tofile(path)

    def no_memory(*a, **k):
        raise MemoryError

    monkeypatch.setattr(np, "fromfile", no_memory)
    with pytest.raises(UserError) as info:
        check.read_dump(path, 2, max_rows=2)
    msg = str(as_user_error(info.value))
    assert f"out of memory reading {path} (16 bytes)" in msg and "batch_size" not in msg


def test_a_bare_memory_error_from_a_read_names_the_file(tmp_path):
    """A file read whole outside `bounded` (pathlib's read_bytes), in a process whose memory is
    capped below the file: the sentence names the file, not train.batch_size."""
    import subprocess
    import sys

    path = _sparse(tmp_path / "corpus.txt", 2 << 30)
    code = (
        "import resource, sys\n"
        "from pathlib import Path\n"
        "from gguf_trainer.base.errors import as_user_error\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "try:\n"
        "    Path(sys.argv[1]).read_bytes()\n"
        "except MemoryError as e:\n"
        "    print(as_user_error(e))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert f"out of memory reading {path}" in out.stdout, out.stdout + out.stderr
    assert "batch_size" not in out.stdout


def test_a_memory_error_of_an_allocation_still_names_the_batch():
    from gguf_trainer.base.errors import as_user_error

    try:
        raise MemoryError
    except MemoryError as e:
        assert "train.batch_size" in str(as_user_error(e))


def test_a_render_with_a_huge_dump_says_so_instead_of_a_cosine(tmp_path):
    from types import SimpleNamespace

    from gguf_trainer import render
    from gguf_trainer.runner.render_job import _figures

    for half in ("teacher", "adapter"):
        (tmp_path / half).mkdir()
        (tmp_path / half / "tokens.txt").write_text("1\n2\n")
    _sparse(tmp_path / "teacher" / render.TEACHER_DUMP, 6 << 30)
    np.ones((2, 16), "<f4").tofile(tmp_path / "adapter" / render.ADAPTER_DUMP)
    plan = render.RenderPlan(runs=[render.Run(h, ["ggk"], f"{h}.png", h)
                                   for h in ("teacher", "adapter")])
    project = SimpleNamespace(  # MageFlow's row width; no student tokenizer linked
        pack=SimpleNamespace(out_dim=2560, taps=(), adapter_kind="token_aligned_vision"),
        material_path=lambda _id: None,
        paths=SimpleNamespace(root=tmp_path))
    fig, note = _figures(project, "a cat", tmp_path, plan)
    assert fig is None and note.startswith("no cosine: ") and "llm_hidden.bin is 6,442" in note
