"""Is a snapshot folder complete? Answered from local files only (no network).

A folder is complete when every file it should hold is there in full. What "should" means,
best source first:
1. a listing: the Hub's file list for the material's patterns (passed in when online), or
   the one `hub.py` saved in `<folder>/.cache/gguf-trainer/listing.json` when it started the
   download, or the tree cache huggingface_hub itself leaves in `.cache/huggingface/trees/`:
   every listed file must exist with the listed size;
2. otherwise the snapshot's own index files: every `*.index.json` with a `weight_map`
   names every shard it needs, a `name-0000k-of-0000n.ext` shard needs all n siblings, every
   literal pattern (`config.json`) needs its file and every glob at least one file.
Either way a `.safetensors` file must be as long as its own header says (a copy cut short
is caught), and no partial download (`*.part`, `*.incomplete`) may remain in the folder.
One file per glob is never enough on its own (a half-copied 4-shard snapshot is partial).

Same size is not the same file: when our saved listing carries each file's hash (LFS:
sha256; other files: the git blob id), a file of the right size must also hold those bytes.
The download records the hash it verified with the file's size and mtime
(`.cache/gguf-trainer/hashes.json`, `record_hash`), so the check compares records instead of
re-reading gigabytes; a file whose size or mtime changed since (replaced, edited, copied
without its times) is hashed again, once (the record is updated, or kept in memory where the
folder is read-only).

This module knows nothing of projects, packs or the Hub client; the hash records are the
only file it writes.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from gguf_trainer.base import atomic

log = logging.getLogger(__name__)

MANIFEST_DIR = ".cache/gguf-trainer"  # inside a snapshot folder: our listing, partials, job files
LISTING_JSON = "listing.json"
HASHES_JSON = "hashes.json"  # beside the listing: hashes verified, by size and mtime
PARTIAL_SUFFIXES = (".part", ".incomplete")
_SHARD_RE = re.compile(r"^(?P<stem>.*?)-(?P<i>\d{5})-of-(?P<n>\d{5})(?P<ext>\.[^/]+)$")


@dataclass
class FolderCheck:
    """What a folder holds of what it should hold."""

    is_complete: bool
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int  # 0 when unknown (no listing and nothing on disk yet)
    bytes_partial: int = 0  # in partial downloads (`.part` / `.incomplete`)
    missing: list[str] = field(default_factory=list)  # expected files absent or short
    source: str = "patterns"  # "listing" | "index" | "patterns"

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def has_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def matches(path: str, patterns: tuple[str, ...] | list[str]) -> bool:
    """The Hub client's allow_patterns semantics: fnmatch on the repo path, `dir/` = `dir/*`."""
    return not patterns or any(
        fnmatch.fnmatch(path, p + "*" if p.endswith("/") else p) for p in patterns)


def local_files(folder: Path) -> dict[str, int]:
    """Repo-style relative paths -> size of every file, skipping our and the Hub client's caches."""
    out: dict[str, int] = {}
    if not folder.is_dir():
        return out
    for p in folder.rglob("*"):
        rel = p.relative_to(folder).as_posix()
        if rel.startswith(".cache/") or not p.is_file():
            continue
        out[rel] = p.stat().st_size
    return out


def partial_bytes(folder: Path) -> int:
    """Bytes in partial downloads under the folder (ours and huggingface_hub's)."""
    cache = folder / ".cache"
    if not cache.is_dir():
        return 0
    return sum(p.stat().st_size for p in cache.rglob("*")
               if p.is_file() and p.name.endswith(PARTIAL_SUFFIXES))


def read_listing(folder: Path) -> dict[str, int] | None:
    """path -> size from our saved listing or from huggingface_hub's tree cache, else None."""
    ours = folder / MANIFEST_DIR / LISTING_JSON
    try:
        data = json.loads(ours.read_text(encoding="utf-8"))
        return {p: int(f["size"]) for p, f in data["files"].items()}
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError):  # torn or foreign: fall back to index files
        return None
    trees = sorted((folder / ".cache" / "huggingface" / "trees").glob("*.json"),
                   key=lambda p: p.stat().st_mtime)
    for tree in reversed(trees):  # the newest commit the Hub client listed here
        try:
            data = json.loads(tree.read_text(encoding="utf-8"))
            return {p: int(f["size"]) for p, f in data["files"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def file_hash(path: Path, kind: str) -> str:
    """The hash the Hub lists for a file: kind "sha256" (LFS files) or "blob_id" (the git
    blob id, sha1 of `blob <size>\\0` + the bytes: the only hash it gives other files)."""
    h = hashlib.sha256() if kind == "sha256" else hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def listed_hash(entry: object) -> tuple[str, str] | None:
    """(kind, hash) of one file of a saved listing: sha256 when it is in LFS, else its blob id."""
    if not isinstance(entry, dict):
        return None
    for kind in ("sha256", "blob_id"):
        if isinstance(entry.get(kind), str) and entry[kind]:
            return kind, entry[kind]
    return None


def read_listed_hashes(folder: Path) -> dict[str, tuple[str, str]]:
    """path -> (kind, hash) from the listing our download saved; {} without one."""
    try:
        files = json.loads((folder / MANIFEST_DIR / LISTING_JSON).read_text("utf-8"))["files"]
        return {p: h for p, e in files.items() if (h := listed_hash(e)) is not None}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


_memo: dict[tuple, str] = {}  # (real path, size, mtime_ns, kind) -> hash, where none is stored


def _read_records(folder: Path) -> dict:
    try:
        data = atomic.read_json(folder / MANIFEST_DIR / HASHES_JSON, {})
    except (ValueError, OSError):  # only a speed-up: garbage is rebuilt
        return {}
    return data if isinstance(data, dict) else {}


def _record(st: os.stat_result, kind: str, digest: str) -> dict:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "kind": kind, "hash": digest}


def _write_records(folder: Path, records: dict) -> None:
    try:
        atomic.write_json(folder / MANIFEST_DIR / HASHES_JSON, records)
    except OSError as e:  # read-only: hashed again by the next process
        log.info("could not record the hashes in %s (%s)", folder, e)


def record_hash(folder: Path, rel: str, kind: str, digest: str,
                source: Path | None = None) -> None:
    """The download verified `rel` (under `folder`) against `digest`: remember it by the
    file's size and mtime, so status need not read it again. `source`: the verified file
    before it is renamed to `rel` (a rename keeps both), so the record is there first."""
    records = _read_records(folder)
    records[rel] = _record((source or folder / rel).stat(), kind, digest)
    _write_records(folder, records)


def hash_mismatches(folder: Path, hashes: dict[str, tuple[str, str]]) -> list[str]:
    """The files of `hashes` (present in `folder`) whose bytes are not the listed ones. A
    record with the file's size and mtime stands for its hash; any other file is hashed."""
    records, changed, bad = _read_records(folder), False, []
    for rel, (kind, want) in sorted(hashes.items()):
        path = folder / rel
        try:
            st = path.stat()
        except OSError:
            continue  # absent: the size check already counts it
        rec = records.get(rel)
        if (isinstance(rec, dict) and rec.get("size") == st.st_size
                and rec.get("mtime_ns") == st.st_mtime_ns and rec.get("kind") == kind):
            got = rec.get("hash")
        else:
            key = (os.path.realpath(path), st.st_size, st.st_mtime_ns, kind)
            got = _memo.get(key)
            if got is None:
                try:
                    got = file_hash(path, kind)
                except OSError:
                    bad.append(rel)
                    continue
                _memo[key] = got
            records[rel], changed = _record(st, kind, got), True
        if got != want:
            bad.append(rel)
    if changed:
        _write_records(folder, records)
    return bad


def safetensors_is_whole(path: Path) -> bool:
    """True when the file is as long as its header says (8-byte length + JSON + data)."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100_000_000:
                return False
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error):
        return False
    end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"),
              default=0)
    return path.stat().st_size == 8 + n + end


def _expected_from_index(folder: Path, have: dict[str, int],
                         patterns: tuple[str, ...]) -> set[str]:
    expected = {p for p in patterns if not has_glob(p)}
    for rel in have:
        if rel.endswith(".index.json"):
            try:
                weight_map = json.loads((folder / rel).read_text(encoding="utf-8"))["weight_map"]
            except (OSError, ValueError, KeyError, TypeError):
                expected.add(rel + " (unreadable index)")
                continue
            base = rel.rsplit("/", 1)[0] + "/" if "/" in rel else ""
            expected.update(base + shard for shard in set(weight_map.values()))
        m = _SHARD_RE.match(rel)
        if m:
            n = int(m["n"])
            expected.update(f"{m['stem']}-{i:05d}-of-{n:05d}{m['ext']}" for i in range(1, n + 1))
    return expected


def check_folder(folder: str | Path, patterns: tuple[str, ...] | list[str] = (),
                 listing: dict[str, int] | None = None) -> FolderCheck:
    """How complete `folder` is for these patterns; `listing` (path -> size) when known.
    Files our saved listing gives a hash must hold those bytes too (`hash_mismatches`)."""
    folder = Path(folder)
    patterns = tuple(patterns)
    have = {p: s for p, s in local_files(folder).items() if matches(p, patterns)}
    part = partial_bytes(folder)
    listing = listing if listing is not None else read_listing(folder)
    if listing is not None:
        listing = {p: s for p, s in listing.items() if matches(p, patterns)}
        missing = sorted(p for p, s in listing.items() if have.get(p) != s)
        # a pattern the saved listing never covered (the pack's list grew since): not complete
        missing += [f"{p} (not in the saved listing)" for p in patterns
                    if not any(matches(f, (p,)) for f in listing)]
        source = "listing"
        total = sum(listing.values())
        n_total = len(listing)
    else:
        expected = _expected_from_index(folder, have, patterns) | set(have)
        missing = sorted(p for p in expected if p not in have)
        missing += [f"{p} (no file matches)" for p in patterns
                    if has_glob(p) and not any(matches(h, (p,)) for h in have)]
        source = "index"
        total = sum(have.values())
        n_total = len(expected) + sum(1 for m in missing if m.endswith("(no file matches)"))
    listed = read_listed_hashes(folder)
    wrong = hash_mismatches(folder, {p: h for p, h in listed.items()
                                     if p in have and p not in missing})
    missing += [f"{p} (not the listed bytes: its {listed[p][0]} differs)" for p in wrong]
    short = sorted(p for p in have if p.endswith(".safetensors") and p not in missing
                   and p not in wrong and not safetensors_is_whole(folder / p))
    missing += [f"{p} (cut short)" for p in short]
    done_files = [p for p in have if p not in missing and p not in short and p not in wrong
                  and (listing is None or p in listing)]
    return FolderCheck(
        is_complete=not missing and part == 0 and n_total > 0,
        files_done=len(done_files), files_total=n_total,
        bytes_done=sum(have[p] for p in done_files), bytes_total=total,
        bytes_partial=part, missing=missing, source=source)
