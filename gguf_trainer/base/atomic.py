"""Crash-safe file writes and guarded JSON reads.

Writes: a tmp file in the same folder + fsync + os.replace. A kill -9 at any moment leaves
either the old file or the new one, never a torn one; a full disk, a read-only mount or a
path too long leaves the old file and no tmp file, and raises `DiskError` (a UserError
and an OSError) whose sentence names the target. Every writer in the package goes through here.

Reads: `read_json` refuses, with a sentence, what a user or a broken disk can put in a JSON
file (bytes that are not UTF-8, invalid JSON, nesting deeper than any file we write, a file
far larger than any we write, a folder in its place) instead of letting a decoder's
exception out.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gguf_trainer.base import project_file
from gguf_trainer.base.errors import WRITE_ERRNOS, DiskError, UserError, os_error_sentence

MAX_JSON_DEPTH = 64  # our files nest 4 levels; deeper is hand-made and would recurse readers
MAX_JSON_BYTES = 64 << 20  # our largest JSON (hashes, exports) is kilobytes
LOW_SPACE_BYTES = 1 << 20  # a failed writer with less free than this ran out of disk


class BadJSONFile(UserError, ValueError):
    """A JSON file that cannot be used. Also a ValueError, so readers that treat any
    unparsable cache as absent (`except ValueError`) keep doing so."""


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _probe_errno(folder: Path, tmp: Path) -> int | None:
    """The errno a writer that reports failures without one (torch.save: RuntimeError
    "unexpected pos"; safetensors: SafetensorError) most likely met, from the file system's
    state right after the failure; None when the file system looks fine (a real bug)."""
    try:
        st = os.statvfs(folder)
        tmp_bytes = tmp.stat().st_size if tmp.exists() else 0
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return errno.EROFS
    if st.f_bavail * st.f_frsize < LOW_SPACE_BYTES:
        return errno.ENOSPC
    soft, _hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != resource.RLIM_INFINITY and tmp_bytes >= soft - LOW_SPACE_BYTES:
        return errno.EFBIG
    return None


def _write_failure(exc: BaseException, path: Path, tmp: Path) -> DiskError | None:
    """The DiskError to raise for a failed atomic write of `path`, or None (not the disk)."""
    if isinstance(exc, DiskError):
        return exc
    if isinstance(exc, UserError):  # the writer's own sentence says more than the disk could
        return None
    if isinstance(exc, OSError) and exc.errno is not None:
        err = exc.errno if exc.errno in WRITE_ERRNOS else None
    else:  # numpy's tofile ("N requested and M written") and torch.save carry no errno
        err = _probe_errno(path.parent, tmp)
    if err is None:
        return None
    sentence = os_error_sentence(OSError(err, os.strerror(err)), path)
    return DiskError(sentence, err)  # it names `path` already


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temp path next to `path`; on success fsync it and rename it into place.

    For writers that insist on a file name (GGUFWriter, safetensors.save_file, torch.save).
    On any exception the temp file is removed and `path` is untouched; a failure the file
    system caused (full, read-only, too long, permissions) becomes a DiskError naming `path`.
    """
    path = Path(path)
    tmp_path: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix + ".tmp", dir=path.parent)
        os.close(fd)
        tmp_path = Path(tmp)
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
        _fsync_dir(path.parent)
    except Exception as e:  # every failure: the disk decides whether it is the user's or a bug
        disk = _write_failure(e, path, tmp_path or path)
        if disk is None:
            raise
        raise disk from e
    finally:
        if tmp_path is not None:
            # Deleting frees the space a full disk needs; on a read-only mount the tmp file
            # could not have been created, so a failure here has nothing left to clean.
            with contextlib.suppress(OSError):
                tmp_path.unlink()


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")


def rewrite_in_place(path: str | os.PathLike, data: bytes) -> bool:
    """Last resort when `write_bytes` failed for lack of space: overwrite the existing file
    through its own blocks (no new file is needed). Not crash-safe, so only for a small
    record that readers tolerate torn (the final state.json of a run). True if it worked."""
    try:
        with open(path, "r+b") as f:
            f.write(data)
            f.truncate()
            os.fsync(f.fileno())
        return True
    except OSError:  # still no space, or read-only: the caller reports the first failure
        return False


def _depth(obj: Any) -> int:
    """Nesting depth without recursion (a hostile file must not recurse the reader)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, d)
            if d <= MAX_JSON_DEPTH:
                children = node.values() if isinstance(node, dict) else node
                stack.extend((v, d + 1) for v in children)
    return deepest


def read_json(
    path: str | os.PathLike,
    default: Any = None,
    fix: str = "fix or delete it",
    inside: str | os.PathLike | None = None,
) -> Any:
    """Read a JSON file; `default` when it does not exist. With `inside` (a project folder)
    the file must be a regular file under it, links resolved (project_file.open_file), else
    UnsafeProjectFile: for files whose content is shown or returned.

    Raises BadJSONFile (a UserError and a ValueError) with "<path> <what is wrong>; <fix>."
    for content a user or a broken disk made: not UTF-8, not JSON, nested deeper than
    MAX_JSON_DEPTH, larger than MAX_JSON_BYTES, or a folder in place of the file. Other read
    failures of the file system raise DiskError.
    """
    path = Path(path)
    try:
        with open(path, "rb") if inside is None else project_file.open_file(inside, path) as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_JSON_BYTES:
                raise BadJSONFile(
                    f"{path} is {size} bytes, far larger than any settings or record file; {fix}."
                )
            raw = f.read()
    except FileNotFoundError:
        return default
    except IsADirectoryError:
        raise BadJSONFile(f"{path} is a folder, not a JSON file; move it away.") from None
    except OSError as e:
        raise DiskError(f"could not read {path}: {os_error_sentence(e, path) or e}", e.errno) from e
    return parse_json(raw, path, fix)


def parse_json(raw: bytes, path: str | os.PathLike, fix: str = "fix or delete it") -> Any:
    """The JSON value in `raw` (the bytes of `path`), or BadJSONFile naming `path` and `fix`:
    not UTF-8 (a BOM is fine), not JSON, a number too long for Python's int parser, or nested
    deeper than MAX_JSON_DEPTH (checked without recursion, so no reader recurses on it later).
    For loaders that read the bytes themselves (project.json hashes them first)."""
    try:
        text = raw.decode("utf-8-sig")  # a BOM from a Windows editor is harmless
    except UnicodeDecodeError as e:
        raise BadJSONFile(
            f"{path} is not UTF-8 text (byte {e.start} is 0x{raw[e.start]:02x}); "
            f"save it as UTF-8 or {fix}."
        ) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadJSONFile(
            f"{path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); {fix}."
        ) from None
    except RecursionError:  # only a hand-made file nests this deep
        raise BadJSONFile(f"{path} nests deeper than {MAX_JSON_DEPTH} levels; {fix}.") from None
    except ValueError as e:  # Python refuses integers of more than 4300 digits
        raise BadJSONFile(
            f"{path} holds a number too long to read ({str(e)[:60]}…); {fix}."
        ) from None
    if _depth(obj) > MAX_JSON_DEPTH:
        raise BadJSONFile(f"{path} nests deeper than {MAX_JSON_DEPTH} levels; {fix}.")
    return obj


def check_writable_folder(folder: str | os.PathLike, setting: str) -> Path:
    """Before a stage starts: `folder` exists or can be made, is a folder and takes a file.

    Raises UserError naming the folder and `setting` (the project.json key that chose it).
    Returns the folder. Leaves nothing behind.
    """
    folder = Path(folder).expanduser()
    if folder.exists() and not folder.is_dir():
        raise UserError(
            f"{folder} ({setting}) is a file, not a folder; set {setting} to a "
            "folder or move the file away."
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-test.", suffix=".tmp", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        sentence = os_error_sentence(e, folder)
        if sentence is None:
            raise
        raise DiskError(f"{setting} = {folder} cannot be written: {sentence}", e.errno) from None
    return folder
