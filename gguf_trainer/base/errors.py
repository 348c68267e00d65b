"""Errors a user can cause. Raise `UserError` with one sentence that names the thing and the fix.

Only the edges (cli.main, the pipeline process, the UI) catch it; they show the sentence,
never a traceback. Programmer errors are ordinary exceptions and propagate.

The file system is the one place where the environment, not the code, decides: a full
disk, a read-only mount, a path too long or a file where a folder should be. `as_user_error`
is the one rule that turns such an OSError into a sentence naming the path and the fix;
the edges call it on whatever escaped, and `atomic` raises `DiskError` at the write site.
"""

from __future__ import annotations

import errno
import io
import os


class UserError(Exception):
    """Something the user can fix: a bad path, a wrong file, a bad setting, a held lock."""


QUOTE_MAX_CHARS = 80  # a sentence quotes at most this much of a value someone sent


def quote(value: object, limit: int = QUOTE_MAX_CHARS) -> str:
    """`repr(value)` for a sentence, cut to `limit` characters with its length said: a
    3 MB value sent to the API must not come back in a 3 MB refusal."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, str) else f"{len(text)} characters"
    return f"{text[:limit]}... ({size})"


class NoProjectError(UserError):
    """The folder is not a project (no project.json). The CLI exits 2 for it."""


class DiskError(UserError, OSError):
    """The file system refused a read or write (full, read-only, permissions, path too long).

    Also an OSError with the original errno, so code that tolerates a failed write (the
    state.json heartbeat retries it) keeps tolerating it; `str()` is the user's sentence.
    """

    def __init__(self, sentence: str, err: int | None = None):
        OSError.__init__(self, err, sentence)
        self.sentence = sentence

    def __str__(self) -> str:
        return self.sentence


# errno -> what happened to {path} and what to do. Only the environment's errors: an errno
# missing here (EBADF, EINVAL...) is a bug and stays an internal error.
_AGAIN = "and run the command again"
OS_ERROR_SENTENCES = {
    errno.ENOSPC: f"the disk holding {{path}} is full; free some space {_AGAIN}",
    errno.EDQUOT: f"the disk quota for {{path}} is used up; free some space {_AGAIN}",
    errno.EFBIG: f"{{path}} would exceed the file size limit (ulimit -f); raise it {_AGAIN}",
    errno.EROFS: "{path} is on a read-only file system; make it writable or move the "
    "project to a writable disk",
    errno.EACCES: "permission denied for {path}; make it readable and writable by this user or "
    "choose another folder",
    errno.EPERM: "the system does not allow this operation on {path}; check its owner and "
    "permissions or choose another folder",
    errno.ENAMETOOLONG: "the path {path} is too long for the file system; "
    "choose a shorter folder or name",
    errno.ENOTDIR: "part of the path {path} is a file where a folder is needed; move that file "
    "away or choose another folder",
    errno.EISDIR: "{path} is a folder where a file is needed; move it away or choose another path",
    errno.EEXIST: ("{path} already exists and is not a folder; "
                   "move it away or choose another folder"),
    errno.ELOOP: "{path} goes through a symbolic link loop; fix the link or choose another path",
    errno.EIO: "the disk reported an I/O error on {path}; check the disk and run the command again",
    errno.ENOENT: "{path} does not exist; check the path and run the command again",
    errno.EMFILE: f"too many files are open (at {{path}}); raise the limit (ulimit -n) {_AGAIN}",
    errno.ENFILE: f"the system has too many files open (at {{path}}); close some programs {_AGAIN}",
}
# The errors a write can cause that say nothing about the code: what atomic writes convert.
WRITE_ERRNOS = frozenset(OS_ERROR_SENTENCES) - {errno.ENOENT}


def _is_tmp_name(name: str) -> bool:
    base = os.path.basename(name)
    return base.startswith(".") and base.endswith(".tmp")


def os_error_sentence(
    exc: OSError, path: str | os.PathLike | None = None, fallback: str | os.PathLike | None = None
) -> str | None:
    """One sentence for an OSError the environment caused, or None when it looks like a bug.

    `path` names the file the user knows (the target of an atomic write, not its temp file);
    without it the error's own file name is used (for a rename, the destination), and
    `fallback` (the project folder, say) when the error names no file (a write to an open one).
    """
    template = OS_ERROR_SENTENCES.get(exc.errno)
    if template is None:
        return None
    shown = path
    if shown is None:
        names = [n for n in (exc.filename, exc.filename2) if n is not None]
        plain = [n for n in names if not _is_tmp_name(os.fsdecode(n))]
        shown = (plain or names or [fallback if fallback is not None else "a file"])[0]
    return template.format(path=os.fsdecode(shown)) + "."


def as_user_error(
    exc: BaseException,
    path: str | os.PathLike | None = None,
    fallback: str | os.PathLike | None = None,
) -> UserError | None:
    """The UserError an edge should show for `exc`, or None when `exc` is a programmer error.
    `path` and `fallback`: see os_error_sentence (an edge passes its project folder as fallback)."""
    if isinstance(exc, UserError):
        return exc
    if isinstance(exc, OSError):
        sentence = os_error_sentence(exc, path, fallback)
        if sentence is not None:
            return DiskError(sentence, exc.errno)
    # The machine's size, not the code: Python's MemoryError, torch's (CUDA) OutOfMemoryError.
    if isinstance(exc, MemoryError) and (read := _file_being_read(exc)) is not None:
        # a file read whole (one the bounded reader did not size first): the file, not the batch
        return UserError(
            f"this machine ran out of memory reading {read}; check that it is the file the "
            "tool or the engine wrote (a huge or endless file is not read), or close other "
            "programs and start again."
        )
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        where = "the GPU" if type(exc).__name__ == "OutOfMemoryError" else "this machine"
        return UserError(
            f"{where} ran out of memory; lower train.batch_size or the precompute "
            "batches (precompute.teacher_batch, precompute.student_batch), or close "
            "other programs, and start again (the run resumes)."
        )
    return None


def _file_being_read(exc: BaseException) -> str | None:
    """The file a MemoryError came from reading, or None (an allocation: the batch, a model).
    The frame that raised it holds the file open for reading (`f.read()`, pathlib's
    read_bytes / read_text, json.load(f)): only then is the file, not train.batch_size, the
    cause. Reads through `bounded` say so themselves (bounded.reading)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return None
    for value in tb.tb_frame.f_locals.values():
        mode = getattr(value, "mode", None)
        name = getattr(value, "name", None)
        if (isinstance(value, io.IOBase) and isinstance(mode, str) and "r" in mode
                and "+" not in mode and isinstance(name, (str, bytes))):
            return os.fsdecode(name)
    return None
