"""Hugging Face Hub access: the token, file listings, resumable verified file downloads.

Built on `huggingface_hub` (repo_info, list_repo_tree, get_hf_file_metadata, http_get):
the client does the HTTP, redirects, auth headers and in-process retries. What it does not
do is resume across processes - since huggingface_hub 1.x its per-download temp file has a
unique name and is deleted on failure, so a killed or rebooted download starts over. Here
each file goes to a stable partial file,
`<dest>/.cache/gguf-trainer/partial/<path>.<etag>.part`, that any later run continues with
an HTTP Range request; the finished file is checked (size, and sha256 for LFS files, whose
ETag is their sha256) and only then renamed into place. The listing the download worked
from is saved in `<dest>/.cache/gguf-trainer/listing.json`, and each hash verified is
recorded with the file's size and mtime (`hashes.json` beside it), so completeness and the
bytes can be judged offline without re-reading them (folder_check.py).

The token comes from `HF_TOKEN` or huggingface_hub's own token store, every time it is
needed; it is never returned to callers, written to a file or put in a message.
`HF_ENDPOINT` is read at call time (tests point it at a local Hub-protocol server).

Knows nothing of projects or packs; never locks (the download job does, per destination).

    listing = list_remote("Qwen/Qwen3-VL-4B-Instruct", "model", ("config.json", "model-*"))
    fetch_listing(listing, dest, on_progress=lambda path, done, total: ...)
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gguf_trainer.base import atomic
from gguf_trainer.base.errors import UserError, quote
from gguf_trainer.materials.folder_check import (
    LISTING_JSON,
    MANIFEST_DIR,
    file_hash,
    hash_mismatches,
    matches,
    record_hash,
)

log = logging.getLogger(__name__)

PARTIAL_DIR = MANIFEST_DIR + "/partial"
Progress = Callable[[str, int, int], None]  # (repo path, bytes done, bytes total)


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None  # LFS files: the content hash (also their ETag)
    blob_id: str  # git blob sha1: the ETag of small files


@dataclass(frozen=True)
class Listing:
    """The files of one repo at one commit that match a material's patterns."""

    repo: str
    repo_type: str
    revision: str
    commit: str
    files: dict[str, RemoteFile]
    license: str | None = None  # the license its Hub card states (a published card names it)

    @property
    def bytes_total(self) -> int:
        return sum(f.size for f in self.files.values())

    def sizes(self) -> dict[str, int]:
        return {p: f.size for p, f in self.files.items()}

    def as_json(self) -> dict:
        return {"repo": self.repo, "repo_type": self.repo_type, "revision": self.revision,
                "commit": self.commit, **({"license": self.license} if self.license else {}),
                "files": {p: {"size": f.size, "sha256": f.sha256, "blob_id": f.blob_id}
                          for p, f in sorted(self.files.items())}}


def endpoint() -> str | None:
    """The Hub URL (`HF_ENDPOINT`), read now rather than when huggingface_hub was imported."""
    return os.environ.get("HF_ENDPOINT") or None


def get_token() -> str | None:
    """`HF_TOKEN`, else the token `hf auth login` stored; None when logged out."""
    from huggingface_hub import get_token as hf_get_token

    return os.environ.get("HF_TOKEN") or hf_get_token()


def has_token() -> bool:
    """Whether a token is available (what the UI may show; never the token itself)."""
    return bool(get_token())


def token_path() -> Path:
    """Where huggingface_hub reads the stored token (HF_HOME relocates it)."""
    from huggingface_hub import constants

    return Path(constants.HF_TOKEN_PATH)


def token_status() -> str:
    """One line on the token: stored, in HF_TOKEN, or none (never the token itself)."""
    try:
        stored = token_path().is_file() and token_path().stat().st_size > 0
    except OSError:
        stored = False
    env = bool(os.environ.get("HF_TOKEN"))
    if stored:
        also = " (HF_TOKEN is also set and wins.)" if env else ""
        return "A Hugging Face token is stored." + also
    return (
        "HF_TOKEN is set in the environment."
        if env
        else "No Hugging Face token stored (public repos need none)."
    )


TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
MAX_TOKEN_CHARS = 512


def store_token(token: str) -> str:
    """Write the token where huggingface_hub reads it (0600); returns the status line only."""
    token = (token or "").strip()
    if not token:
        raise UserError("paste a Hugging Face token first (hf_…)")
    if any(c.isspace() for c in token):
        raise UserError("a Hugging Face token has no spaces; paste it again")
    if not all(c in TOKEN_CHARS for c in token) or len(token) > MAX_TOKEN_CHARS:
        # ESC, NUL, a zero-width space: a paste that went wrong, and bytes an HTTP header
        # or a terminal must not carry
        raise UserError("a Hugging Face token is letters, digits, '_' and '-' only (hf_…); "
                        "paste it again.")
    path = token_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, token)
    os.chmod(path, 0o600)
    return token_status()


LOGIN_HINT = (
    "run `hf auth login` (or set HF_TOKEN) in the shell that starts gguf-trainer, then retry"
)


def explain_hub_error(exc: Exception, repo: str, repo_type: str = "model") -> str:
    """One sentence for a Hub failure, naming the repo and what to do."""
    from huggingface_hub import errors as e

    kind = "dataset" if repo_type == "dataset" else "model"
    page = f"https://huggingface.co/{'datasets/' if repo_type == 'dataset' else ''}{repo}"
    if isinstance(exc, e.GatedRepoError):
        return (
            f"{repo} is a gated {kind}: accept its terms at {page} and {LOGIN_HINT}"
            if not has_token()
            else f"{repo} is a gated {kind} and your token has no access yet: accept its terms at "
            f"{page} (logged in as the token's user), then retry"
        )
    if isinstance(exc, e.RevisionNotFoundError):
        return f"{repo} has no such revision; check the material's revision"
    if isinstance(exc, e.RemoteEntryNotFoundError):
        return f"a file of {repo} is gone from the Hub ({exc}); press Refresh and retry"
    if isinstance(exc, e.RepositoryNotFoundError):
        if has_token():
            return f"{repo} was not found, or your token cannot see it; check the name at {page}"
        return f"{repo} was not found or is private; check the name, or {LOGIN_HINT}"
    if isinstance(exc, e.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        if status == 401:
            return f"the Hub refused your token for {repo} (401); {LOGIN_HINT}"
        return f"the Hub answered {status} for {repo}; retry later (the partial download is kept)"
    if isinstance(exc, e.OfflineModeIsEnabled):  # HF_HUB_OFFLINE=1 in the environment
        return (f"the Hub is switched off in this shell (HF_HUB_OFFLINE is set), so {repo} cannot "
                "be downloaded; unset HF_HUB_OFFLINE and retry, or link a local copy")
    if isinstance(exc, OSError) and exc.errno is not None:  # disk full, permissions
        return (
            f"downloading {repo} failed: {exc.strerror} ({exc.filename or 'the destination'}); "
            "free space or fix permissions, then retry - partial files are kept"
        )
    return (
        f"cannot reach the Hub for {repo} ({type(exc).__name__}); check the network or "
        "proxy and retry - finished files and partial downloads are kept"
    )


def _hub_call(fn, repo: str, repo_type: str, url: str | None = None):
    """Run a huggingface_hub call, turning its failures into one-sentence UserErrors.
    `url`: the endpoint it asks, named when the answer is not the JSON the API speaks."""
    from huggingface_hub import errors as e

    try:
        return fn()
    except (e.HfHubHTTPError, OSError, *transport_errors()) as exc:
        raise UserError(explain_hub_error(exc, repo, repo_type) + ".") from None
    except json.JSONDecodeError:  # a captive portal, a proxy's login page, a wrong HF_ENDPOINT
        raise UserError(
            f"{url or endpoint() or 'the Hub'} answered with something that is not "
            f"JSON (an HTML page?) when asked about {repo}; check HF_ENDPOINT and "
            "any proxy, then retry."
        ) from None


def _api_url(repo: str, repo_type: str, what: str) -> str:
    return f"{endpoint() or 'https://huggingface.co'}/api/{repo_type}s/{repo}/{what}"


def check_remote_path(repo: str, path: object) -> str:
    """A repo file path from a listing, normalised, that stays under any destination it is
    joined to: relative, '/'-separated, no '..' or '.' parts, no backslash, NUL or empty
    part. A Hub (or a server posing as one) chooses these names; `dest / path` must never
    leave `dest`. UserError naming the repo and the entry otherwise."""
    text = path if isinstance(path, str) else ""
    parts = text.split("/")
    if (
        not text
        or text.startswith("/")
        or "\\" in text
        or "\0" in text
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise UserError(
            f"{repo} lists a file named {quote(path)}, which would be written outside "
            "its download folder; refusing to download from this listing (check the "
            "repo name and HF_ENDPOINT)."
        )
    return text


_HEX = {"sha256": 64, "blob_id": 40}


def check_remote_file(repo: str, f: RemoteFile) -> RemoteFile:
    """A listing entry whose path, size and hashes are safe to use: the path as
    `check_remote_path` wants it, a size that is a whole number >= 0, and hashes of hex digits
    of their length (the partial file's name carries the hash, so a hash like `/../../..`
    would otherwise place that file outside the destination). UserError naming the repo and
    the entry otherwise."""
    path = check_remote_path(repo, f.path)
    bad = None
    if isinstance(f.size, bool) or not isinstance(f.size, int) or f.size < 0:
        bad = f"a size of {quote(f.size)}"
    for kind, value in (("sha256", f.sha256), ("blob_id", f.blob_id)):
        if value is None and kind == "sha256":
            continue  # a file outside LFS: checked by its blob id
        if not isinstance(value, str) or not re.fullmatch(f"[0-9a-fA-F]{{{_HEX[kind]}}}", value):
            bad = bad or f"a {kind} of {quote(value)}"
    if bad:
        raise UserError(
            f"{repo} lists {quote(path)} with {bad}, which is not a valid listing entry; "
            "refusing to download from this listing (check the repo name and HF_ENDPOINT)."
        )
    return RemoteFile(path, f.size, f.sha256.lower() if f.sha256 else None, f.blob_id.lower())


def transport_errors() -> tuple[type[Exception], ...]:
    """The HTTP library's network errors: huggingface_hub 1.x uses httpx, 2.x httpx2."""
    import importlib

    found = []
    for name in ("httpx", "httpx2"):
        try:
            found.append(importlib.import_module(name).HTTPError)
        except (ImportError, AttributeError):  # not the library this huggingface_hub uses
            continue
    return tuple(found)


def list_remote(
    repo: str, repo_type: str = "model", patterns: tuple[str, ...] = (), revision: str = "main"
) -> Listing:
    """The files of `repo` matching `patterns`, at the commit `revision` points to now.

    Raises UserError when the Hub refuses or cannot be reached, or when a pattern matches no
    file (the pack declares a file the repo no longer has)."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=endpoint(), token=get_token() or False)
    info = _hub_call(
        lambda: api.repo_info(repo, repo_type=repo_type, revision=revision),
        repo,
        repo_type,
        _api_url(repo, repo_type, f"revision/{revision}"),
    )
    if not isinstance(info.sha, str) or not info.sha:
        raise UserError(
            f"{_api_url(repo, repo_type, 'revision/' + revision)} gave no commit for "
            f"{repo}; check HF_ENDPOINT and any proxy, then retry."
        )
    tree = _hub_call(
        lambda: list(
            api.list_repo_tree(repo, recursive=True, revision=info.sha, repo_type=repo_type)
        ),
        repo,
        repo_type,
        _api_url(repo, repo_type, f"tree/{info.sha}"),
    )
    files = {}
    for f in tree:
        if isinstance(f, RepoFile) and matches(f.path, patterns):
            entry = RemoteFile(f.path, f.size, f.lfs.sha256 if f.lfs else None, f.blob_id)
            entry = check_remote_file(repo, entry)
            files[entry.path] = entry
    unmatched = [p for p in patterns if not any(matches(f, (p,)) for f in files)]
    if unmatched:
        raise UserError(
            f"{repo} has no file matching {', '.join(unmatched)} at {info.sha[:10]}; "
            "the pack's material list needs updating."
        )
    lic = getattr(getattr(info, "card_data", None), "license", None)
    return Listing(repo, repo_type, revision, info.sha, files,
                   lic if isinstance(lic, str) and lic else None)


def save_listing(listing: Listing, dest: Path) -> None:
    atomic.write_json(Path(dest) / MANIFEST_DIR / LISTING_JSON, listing.as_json())


def partial_path(dest: Path, f: RemoteFile) -> Path:
    etag = f.sha256 or f.blob_id
    return Path(dest) / PARTIAL_DIR / f"{f.path}.{etag[:16]}.part"


class _Bar:
    """The tqdm-shaped object http_get updates per chunk; forwards byte counts to a callback.
    (Passed as http_get's `_tqdm_bar`, present from huggingface_hub 0.x to 2.x, so the client
    draws no bar of its own and our counts include the resumed bytes.)"""

    def __init__(self, path: str, done: int, total: int, on_progress: Progress | None):
        self.path, self.n, self.total, self.on_progress = path, done, total, on_progress
        self._report()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n: float | None = 1) -> None:
        self.n += int(n or 0)
        self._report()

    def close(self) -> None:
        pass

    def _report(self) -> None:
        if self.on_progress:
            self.on_progress(self.path, self.n, self.total)


def _sha256(path: Path) -> str:
    return file_hash(path, "sha256")


def git_blob_id(path: Path) -> str:
    """The git blob id of a file (sha1 of `blob <size>\\0` + its bytes): what the Hub lists
    as the `oid` of every file and the only hash it gives for files not in LFS."""
    return file_hash(path, "blob_id")


def listed_hash(f: RemoteFile) -> tuple[str, str]:
    """(kind, hash) the file is checked against: its sha256 when in LFS, else its blob id."""
    return ("sha256", f.sha256) if f.sha256 else ("blob_id", f.blob_id)


def hash_problem(path: Path, f: RemoteFile) -> str:
    """ "" when `path` holds exactly the listed file; else what differs. LFS files are checked
    by their sha256, other files by their git blob id."""
    size = path.stat().st_size
    if size != f.size:
        return f"is {size} bytes, not {f.size}"
    if f.sha256:
        return "" if _sha256(path) == f.sha256 else "does not match its sha256"
    return "" if git_blob_id(path) == f.blob_id else "does not match its git blob id"


class ServerSentTooMuch(UserError):
    """The server kept sending past the size the listing declares: stopped there."""


class _Capped:
    """The file http_get writes into, refusing bytes past the declared size: a server that
    sends more (a loop, a wrong file, an attack on the disk) is stopped at once instead of
    streaming on until the disk is full."""

    def __init__(self, fh, limit: int, what: str):
        self._fh, self._limit, self._what = fh, limit, what

    def write(self, chunk: bytes) -> int:
        room = self._limit - self._fh.tell()
        if len(chunk) > room:
            self._fh.write(chunk[: max(room, 0)])
            raise ServerSentTooMuch(
                f"{self._what}: the server sent more than the "
                f"{self._limit} bytes the listing declares; the download "
                "was stopped and discarded - retry later, or check "
                "HF_ENDPOINT and any proxy."
            )
        return self._fh.write(chunk)

    def __getattr__(self, name):
        return getattr(self._fh, name)


RETRY_WAITS_S = (2.0, 10.0, 30.0)  # after a refused or broken transfer that made progress


def fetch_file(
    listing: Listing, f: RemoteFile, dest: Path, on_progress: Progress | None = None
) -> Path:
    """Download one file into `dest`, continuing its partial file; verified, then renamed.

    A transfer that fails after receiving bytes (a signed CDN URL that expired mid-file, a
    5xx, a dropped connection the client gave up on) is asked for again from where it
    stopped, with a fresh URL, up to len(RETRY_WAITS_S) times; one that makes no progress
    fails at once with its sentence."""
    f = check_remote_file(listing.repo, f)  # a listing built by hand or read back from disk
    rel = f.path
    final = Path(dest) / rel
    part = partial_path(dest, f)
    _check_inside(Path(dest), final, listing.repo, rel)
    _check_inside(Path(dest), part, listing.repo, rel)
    # Same size is not the same file; a hash recorded with this size and mtime stands for it.
    if (
        final.is_file()
        and final.stat().st_size == f.size
        and not hash_mismatches(Path(dest), {rel: listed_hash(f)})
    ):
        if on_progress:
            on_progress(f.path, f.size, f.size)
        return final
    part.parent.mkdir(parents=True, exist_ok=True)
    for wait_s in (*RETRY_WAITS_S, None):
        before = part.stat().st_size if part.exists() else 0
        try:
            _transfer(listing, f, part, on_progress)
            break
        except ServerSentTooMuch:
            part.unlink(missing_ok=True)  # asking again gets the same stream
            raise
        except UserError:
            grew = part.exists() and part.stat().st_size > before
            if wait_s is None or not grew:
                raise
            log.warning(
                "%s: %s stopped at %d bytes; asking again in %.0f s",
                listing.repo,
                f.path,
                part.stat().st_size,
                wait_s,
            )
            time.sleep(wait_s)
    _verify(part, f, listing.repo)
    final.parent.mkdir(parents=True, exist_ok=True)
    # Recorded before the file appears, so a status asked meanwhile never re-reads it.
    record_hash(Path(dest), rel, *listed_hash(f), source=part)
    os.replace(part, final)
    return final


def _check_inside(dest: Path, path: Path, repo: str, rel: str) -> None:
    """`path` (a file of the download or its partial) must stay under the destination's real
    path once the links on the way are resolved: a folder inside the destination linked
    elsewhere (planted, or left by another tool) must not receive the download. The
    destination itself may be a link (a materials folder on a bigger disk)."""
    base = os.path.realpath(dest)
    real = os.path.realpath(path)
    if real != base and not real.startswith(base.rstrip(os.sep) + os.sep):
        raise UserError(
            f"{repo}/{rel} would be written to {real}, outside its download folder {dest} "
            "(a folder there is a link leading out); remove that link, then retry."
        )


def _transfer(listing: Listing, f: RemoteFile, part: Path, on_progress: Progress | None) -> None:
    """One HEAD (fresh location) + one ranged GET appending to `part`."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    url = hf_hub_url(
        listing.repo,
        f.path,
        repo_type=listing.repo_type,
        revision=listing.commit,
        endpoint=endpoint(),
    )
    headers = build_hf_headers(token=get_token() or False)
    meta = _hub_call(
        lambda: get_hf_file_metadata(url, token=get_token() or False, endpoint=endpoint()),
        listing.repo,
        listing.repo_type,
    )
    if urlsplit(meta.location).netloc != urlsplit(url).netloc:
        headers.pop("authorization", None)  # a signed CDN URL: the token stays with the Hub
    with open(part, "ab") as fh:
        resume = fh.tell()
        if resume > f.size:  # not this file's bytes: start over
            fh.truncate(0)
            resume = 0
        if resume:
            log.info("%s: resuming %s at %d of %d bytes", listing.repo, f.path, resume, f.size)
        try:
            capped = _Capped(fh, f.size, f"{listing.repo}/{f.path}")
            _hub_call(
                lambda: http_get(
                    meta.location,
                    capped,
                    resume_size=resume,
                    headers=headers,
                    expected_size=f.size,
                    displayed_filename=f.path,
                    _tqdm_bar=_Bar(f.path, resume, f.size, on_progress),
                ),
                listing.repo,
                listing.repo_type,
            )
        finally:  # what arrived is kept for the next try, even when this one failed
            fh.flush()
            os.fsync(fh.fileno())


def _verify(part: Path, f: RemoteFile, repo: str) -> None:
    problem = hash_problem(part, f)
    if problem:
        part.unlink()  # wrong bytes can never be resumed into right ones
        raise UserError(
            f"{repo}/{f.path} {problem} after download; it was discarded - retry to fetch it again."
        )


def fetch_listing(
    listing: Listing,
    dest: str | Path,
    on_progress: Progress | None = None,
    on_file_done: Callable[[str], None] | None = None,
) -> Path:
    """Every file of the listing into `dest` (small files first), resuming partial ones."""
    dest = Path(dest)
    save_listing(listing, dest)
    for f in sorted(listing.files.values(), key=lambda f: (f.size, f.path)):
        fetch_file(listing, f, dest, on_progress)
        if on_file_done:
            on_file_done(f.path)
    return dest
