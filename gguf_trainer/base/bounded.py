"""Reading a file the tool did not size itself: only a regular file, and never more than what
its header or format implies.

A shard, a dump, `tokens.txt` or a corpus file can be a FIFO (an `open` that never returns), a
link to /dev/zero (a read that never ends), or a sparse file of many GiB (a read that ends in
MemoryError, whose sentence would then blame train.batch_size). So every such read goes
through here: the file is opened with O_NONBLOCK (a FIFO cannot block the open), checked to
be a regular file on the opened descriptor (S_ISREG by fstat: no swap between check and
read), and read only up to the number of bytes its caller says the format implies (from its
header, or its row count times its width), never a fixed cap a real tens-of-GB shard could
pass. Anything else is refused in one sentence naming the file (`NotRegular`,
`LargerThanImplied`: UserErrors, and ValueErrors so readers that treat a damaged file as
damaged keep doing so). Imports only errors.

    with bounded.open_regular(path) as f: ...
    data = bounded.read_bytes(path, max_bytes=rows * dim * 4, what="a conditioning dump")
    with bounded.reading(path, size): rows = parse(f.read())   # MemoryError names the file
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from gguf_trainer.base.errors import UserError


class NotRegular(UserError, ValueError):
    """A FIFO, device, socket or folder where a file is read."""


class LargerThanImplied(UserError, ValueError):
    """A file larger than its header or format says it can be."""


class OutOfMemoryReading(UserError):
    """The machine ran out of memory while a file was read (and parsed): the file is named,
    and the sentence does not blame train.batch_size (base/errors.as_user_error)."""


@contextlib.contextmanager
def reading(path: str | os.PathLike, size: int | None = None) -> Iterator[None]:
    """A MemoryError inside (a read of `path`, or what is built of its bytes) becomes one
    sentence naming the file and its size."""
    try:
        yield
    except MemoryError:
        of = "" if size is None else f" ({size:,} bytes)"
        raise OutOfMemoryReading(
            f"this machine ran out of memory reading {path}{of}; check that it is the file the "
            "tool or the engine wrote, or close other programs and start again."
        ) from None


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """`path` opened for binary reading when it is a regular file (a link to one is followed
    and checked on the descriptor); NotRegular otherwise. FileNotFoundError as `open`."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(f"{path} is not a regular file (a FIFO, a device or a folder), so "
                             "it is not read; put the file itself there.")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def size_of(f: BinaryIO) -> int:
    return os.fstat(f.fileno()).st_size


def check_size(path: str | os.PathLike, size: int, max_bytes: int, what: str) -> None:
    if size > max_bytes:
        raise LargerThanImplied(
            f"{path} is {size:,} bytes, more than {what} can be ({max_bytes:,} bytes); it is "
            "not read: use the file the engine or the tool wrote.")


def read_bytes(path: str | os.PathLike, max_bytes: int, what: str) -> bytes:
    """The whole of a regular file of at most `max_bytes` (what its format implies);
    NotRegular / LargerThanImplied (one sentence naming the file) otherwise."""
    with open_regular(path) as f:
        size = size_of(f)
        check_size(path, size, max_bytes, what)
        with reading(path, size):
            data = f.read(max_bytes + 1)  # it may grow after fstat: never read past the bound
    check_size(path, len(data), max_bytes, what)
    return data


def read_text(path: str | os.PathLike, max_bytes: int, what: str) -> str:
    return read_bytes(path, max_bytes, what).decode("utf-8")


def exists_regular(path: str | os.PathLike) -> bool:
    """True for a regular file (through links), False when absent; NotRegular otherwise."""
    try:
        st = os.stat(Path(path))
    except (FileNotFoundError, NotADirectoryError):
        return False
    if not stat.S_ISREG(st.st_mode):
        raise NotRegular(f"{path} is not a regular file (a FIFO, a device or a folder), so it "
                         "is not read; put the file itself there.")
    return True
