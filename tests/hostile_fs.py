"""Real file-system failures for tests: a full disk and a read-only folder.

`chmod` does not stop root, so as root a read-only folder is a read-only bind mount and a
full disk is a small tmpfs; without root the folder is chmod'ed and the disk is "full" through
RLIMIT_FSIZE (every write past the limit fails with EFBIG, SIGXFSZ ignored). Both undo
themselves on exit. Used by the class-4/5 tests (tests/unit/test_hostile_*.py).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import resource
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path


def is_root() -> bool:
    return os.geteuid() == 0


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], check=False, capture_output=True).returncode == 0


@functools.cache
def can_mount() -> bool:
    """True when this process may mount (root in a container that allows it)."""
    if not is_root() or shutil.which("mount") is None:
        return False
    probe = Path(f"/tmp/.gguf-trainer-mount-probe-{os.getpid()}")
    probe.mkdir(exist_ok=True)
    try:
        if not _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)):
            return False
        subprocess.run(["umount", str(probe)], check=True)
        return True
    finally:
        probe.rmdir()


def _umount(folder: Path) -> None:
    gc.collect()  # a writer that failed mid-file may still hold it open until collected
    if subprocess.run(["umount", str(folder)], check=False, capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(folder)], check=True)  # detach; freed when closed


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """`folder` (and everything under it) refuses writes until the block ends."""
    if can_mount():
        assert _mount("--bind", str(folder), str(folder))
        try:
            assert _mount("-o", "remount,bind,ro", str(folder))
            yield
        finally:
            _umount(folder)
        return
    modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")] if p.is_dir()}
    for p, mode in modes.items():
        p.chmod(stat.S_IMODE(mode) & ~0o222)
    try:
        yield
    finally:
        for p, mode in modes.items():
            p.chmod(stat.S_IMODE(mode))


@contextlib.contextmanager
def full_disk(folder: Path, spare_bytes: int = 0) -> Iterator[str]:
    """Put `folder` on a disk with `spare_bytes` free (tmpfs, root) or cap every file at
    `spare_bytes` (RLIMIT_FSIZE, any user). Yields "tmpfs" or "rlimit". The folder's content
    is kept: copied onto the tmpfs and back (only what the test left there)."""
    if can_mount():
        page = 4096
        used = sum(-(-p.stat().st_size // page) * page for p in folder.rglob("*") if p.is_file())
        backup = folder.with_name(folder.name + ".before-tmpfs")
        folder.rename(backup)
        folder.mkdir()
        size = used + -(-spare_bytes // page) * page
        assert _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder))
        try:
            shutil.copytree(backup, folder, dirs_exist_ok=True, symlinks=True)
            yield "tmpfs"
        finally:
            keep = folder.with_name(folder.name + ".after-tmpfs")
            shutil.copytree(folder, keep, symlinks=True, ignore=shutil.ignore_patterns(FILLER))
            _umount(folder)
            folder.rmdir()
            keep.rename(folder)
            shutil.rmtree(backup)
        return
    # Without root the limit caps each file, not the disk: keep it above what pytest and the
    # logs write, so that it stops the big writes (shards, checkpoints, GGUF files) only.
    with file_size_limit(max(spare_bytes, 64 << 10)):
        yield "rlimit"


FILLER = ".disk-filler"


def fill(folder: Path) -> None:
    """Take every free byte of the (tmpfs) disk holding `folder`: from now on it is full."""
    fd = os.open(folder / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for chunk in (1 << 20, 1 << 12, 1):
            with contextlib.suppress(OSError):  # ENOSPC: this size no longer fits
                while os.write(fd, b"\0" * chunk) == chunk:
                    pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def file_size_limit(max_bytes: int) -> Iterator[None]:
    """Every file write past `max_bytes` fails with EFBIG in this process until the block ends."""
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)


def tree_bytes(root: Path, skip: tuple[str, ...] = ()) -> dict[str, bytes]:
    """Every regular file under `root` (relative name -> bytes), for byte-identity asserts."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_file() and not p.is_symlink() and not any(rel.startswith(s) for s in skip):
            out[rel] = p.read_bytes()
    return out
