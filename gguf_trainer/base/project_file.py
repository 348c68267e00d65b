"""Reading a file of a project to show or return it: only a regular file inside the project.

Anyone who can write into a project folder (another local user, an unpacked archive, a
copied folder) can put a symbolic link where the tool expects one of its files:
`pipeline.log -> ~/.ssh/id_rsa`, `eval.json -> ~/.aws/credentials`, or a whole
`checkpoints -> /home/x` folder. The GUI and its API would then serve that file to whoever
may use them. So every file the tool reads from a project to show or return goes through
`open_file` here: the real path of the file (every component resolved, so a linked folder
on the way counts too) must be a regular file under the real path of the project folder
(the project folder itself may be a link; its target is the project). Anything else
(outside, a FIFO that would block the reader, a device, a folder) is refused with one
sentence (`UnsafeProjectFile`, a UserError). A file that does not exist raises
FileNotFoundError as `open` does, so callers keep their "not written yet" behaviour.

The check is made on the path and again on the opened descriptor (`/proc/self/fd`), so a
link swapped in between the two cannot slip through. Logs and metrics are appended through
`open_append`, which refuses a link in the file's place, so a planted link cannot make the
tool write into someone's file either. Knows nothing of projects beyond
"a folder"; imports only errors.

    with project_file.open_file(paths.root, paths.eval_json) as f:
        data = f.read()
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from gguf_trainer.base.errors import UserError


class UnsafeProjectFile(UserError, ValueError):
    """A project file that leads outside the project or is not a regular file. Also a
    ValueError, so readers that treat any unusable file as absent (status) keep doing so;
    readers whose answer the user asked for (eval.json, a log) let LeadsOutside's sentence out."""


class LeadsOutside(UnsafeProjectFile):
    """A link (or a linked folder on the way) that leads outside the project."""


class NotAFile(UnsafeProjectFile):
    """A folder, FIFO or device where the tool writes a file: nothing to show, like absent."""


def _is_under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _outside(path: os.PathLike | str, real: str, base: str) -> LeadsOutside:
    return LeadsOutside(
        f"{path} leads outside the project folder {base} (to {real}), so it is not shown or "
        "returned; replace that link with the tool's own file or remove it.")


def resolve(root: str | os.PathLike, path: str | os.PathLike) -> Path:
    """The real path of `path`, checked to be a regular file under the real path of `root`.

    FileNotFoundError when nothing is there; UnsafeProjectFile for a path that leads outside
    (a link, a linked folder on the way, a dangling link) or is not a regular file."""
    base = os.path.realpath(root)
    real = os.path.realpath(path)
    if not _is_under(real, base):
        raise _outside(path, real, base)
    st = os.stat(real)  # FileNotFoundError propagates: "not written yet"
    if not stat.S_ISREG(st.st_mode):
        raise NotAFile(f"{path} is not a regular file (the tool writes a file there), "
                                "so it is not read; move it away.")
    return Path(real)


def _opened_path(fd: int) -> str | None:
    """Where an open descriptor really points (Linux /proc); None where that is unknown."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}").removesuffix(" (deleted)")
    except OSError:  # no /proc (another OS, a sandbox): the path check above stands alone
        return None


def open_file(root: str | os.PathLike, path: str | os.PathLike) -> BinaryIO:
    """`path` opened for binary reading, after `resolve`'s checks, re-checked on the
    descriptor. O_NONBLOCK so a FIFO swapped in cannot hang the reader before the check."""
    real = resolve(root, path)
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotAFile(f"{path} is not a regular file (the tool writes a file "
                                    "there), so it is not read; move it away.")
        landed = _opened_path(fd)
        base = os.path.realpath(root)
        if landed is not None and not _is_under(landed, base):
            raise _outside(path, landed, base)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_append(folder: str | os.PathLike, path: str | os.PathLike) -> BinaryIO:
    """`path` (a log, metrics.jsonl) opened to append, created if absent: never through a
    link (the tool makes none; `pipeline.log -> ~/.bashrc` would have the run's output
    appended to someone's file) and only inside `folder`. UnsafeProjectFile otherwise."""
    base = os.path.realpath(folder)
    parent = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    if not _is_under(parent, base):
        raise _outside(path, parent, base)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
            raise LeadsOutside(
                f"{path} is a symbolic link, so nothing is written to it "
                "(the tool writes only its own files); remove the link."
            ) from None
        if e.errno == errno.ENXIO:  # a FIFO nobody reads
            raise NotAFile(
                f"{path} is not a regular file (the tool writes a file "
                "there), so nothing is written to it; move it away."
            ) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotAFile(
            f"{path} is not a regular file (the tool writes a file there), "
            "so nothing is written to it; move it away."
        )
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab")


def make_dir(root: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Create (or check) `path`, a folder the tool writes into inside the project `root`
    (renders/, logs, shards/, checkpoints/, an output folder inside the project), as a real
    directory under the real path of `root`: every component below `root` must be a
    directory and none a symbolic link, so a `renders -> ~/Pictures` link never takes the
    tool's files out of the project. `root` itself may be a link (its target is the
    project). Returns the real path; LeadsOutside / NotAFile (one sentence) otherwise."""
    base = os.path.realpath(root)
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    if rel == os.curdir:
        return Path(base)
    if rel.split(os.sep)[0] == os.pardir:
        real = os.path.realpath(path)
        if not _is_under(real, base):
            raise _outside(path, real, base)
        rel = os.path.relpath(real, base)
    here = base
    for part in rel.split(os.sep):
        here = os.path.join(here, part)
        try:
            os.mkdir(here, 0o755)
            continue
        except FileExistsError:
            pass
        st = os.lstat(here)
        if stat.S_ISLNK(st.st_mode):
            raise LeadsOutside(
                f"{os.path.join(root, os.path.relpath(here, base))} is a symbolic link, so the "
                "tool does not write through it (it writes only inside the project); remove "
                "the link and start again.")
        if not stat.S_ISDIR(st.st_mode):
            raise NotAFile(f"{here} is not a folder (the tool makes a folder there); move "
                           "it away and start again.")
    return Path(here)


def read_bytes(
    root: str | os.PathLike, path: str | os.PathLike, max_bytes: int | None = None
) -> bytes:
    """The file's bytes (at most `max_bytes` + 1, so a caller can tell "too large")."""
    with open_file(root, path) as f:
        return f.read() if max_bytes is None else f.read(max_bytes + 1)
