"""Uploading files to a Hugging Face model repo as one commit, resumable across processes.

Built on `huggingface_hub` (create_repo, create_commit): the client asks the Hub which upload
mode each file takes (preupload), asks the LFS batch endpoint for an upload action per object
and gets one only for objects the Hub does not hold yet, PUTs those, and then writes one
commit naming every file. An object the Hub already stores - sent by an upload that was killed
before its commit - is never sent again, so a second upload after a kill sends only what is
missing and still ends in one commit; a file that is committed already and unchanged is left
out of the commit (no empty commit is made). That is the LFS path, taken only without hf_xet
or with HF_HUB_DISABLE_XET=1: huggingface_hub 2.4 uploads through Xet whenever hf_xet is
installed (its dependency on x86_64 and arm64, so the usual case), with no question to the Hub.
Xet packs the files into xorbs of up to 64 MB sent to the Hub's CAS, notes each xorb sent in
HF_HOME/xet/.../staging, and a later upload skips the xorbs noted; hub_upload asks for a note
after every xorb (XET_NOTE_EVERY), so a second upload after a kill sends only the xorbs that
were in flight, then the one commit (tests/e2e/test_publish_resume.py runs both paths).

The token is `hub.get_token()` (HF_TOKEN or the stored login), read when the upload starts and
never put in a message. Knows nothing of projects: the caller says which files go where.

    upload("me/pig_t5_adapter", {"pig_t5_adapter-f16.gguf": Path(...), "README.md": b"..."},
           private=False, message="Upload pig_t5_adapter")
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gguf_trainer.base.errors import UserError
from gguf_trainer.materials.hub import endpoint, get_token, transport_errors

# What the Hub accepts as a repo name under a user or an organization (USER/NAME).
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9_.-]{1,96}")
XET_NOTE_EVERY = "HF_XET_SESSION_XORB_METADATA_FLUSH_MAX_COUNT"
LOGIN = "log in with a token that may write (`gguf-trainer login`, or HF_TOKEN), then publish again"


def check_repo_id(repo: str) -> str:
    """`repo` as USER/NAME, or a UserError saying what a repo id looks like."""
    repo = (repo or "").strip()
    if not REPO_ID.fullmatch(repo) or ".." in repo or repo.endswith((".", "-")):
        raise UserError(
            f"{repo!r} is not a Hub repo id; give it as USER/NAME (your user or organization, "
            "a slash, then letters, digits, '-', '_' or '.')."
        )
    return repo


def require_token() -> str:
    """The write token, or the sentence saying how to log in (before any request is made)."""
    token = get_token()
    if not token:
        raise UserError(f"publishing needs a Hugging Face login: {LOGIN}.")
    return token


def upload(repo: str, files: dict[str, Path | bytes], private: bool, message: str) -> dict:
    """Create `repo` when missing (private if asked; an existing repo keeps its visibility)
    and commit `files` (path in the repo -> a local file or bytes) to its main branch in one
    commit. Returns {"url", "commit", "created", "changed"}: `changed` False when every file
    was on the Hub already as it is (no commit was made). UserError on every failure."""
    from huggingface_hub import CommitOperationAdd, HfApi

    repo = check_repo_id(repo)
    token = require_token()
    # hf_xet notes each xorb it has sent in its session folder (HF_HOME/xet/.../staging), and
    # the next upload skips what is noted; by default the note is written every few xorbs, so
    # a kill re-sent every xorb (up to 64 MB each) since the last one. One xorb: a kill costs
    # only the xorbs in flight. Read when the process's Xet session starts.
    os.environ.setdefault(XET_NOTE_EVERY, "1")
    api = HfApi(endpoint=endpoint(), token=token)
    ops = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=data if isinstance(data, bytes)
                              else str(data)) for name, data in files.items()]
    before = _call(lambda: _head(api, repo), repo)
    if before is None:
        _call(lambda: api.create_repo(repo, private=private or None, exist_ok=True), repo)
    info = _call(lambda: api.create_commit(repo, ops, commit_message=message), repo)
    return {"url": f"{endpoint() or 'https://huggingface.co'}/{repo}", "commit": info.oid,
            "created": before is None, "changed": info.oid != before}


def _head(api, repo: str) -> str | None:
    """The commit `repo`'s main branch is at, or None when the repo does not exist (or the
    token cannot see it: create_repo then says which)."""
    from huggingface_hub import errors as e

    try:
        return api.repo_info(repo).sha
    except e.RepositoryNotFoundError:
        return None


def explain_upload_error(exc: BaseException, repo: str) -> str:
    """One sentence for a failed upload, naming the repo and what to do."""
    from huggingface_hub import errors as e

    base = endpoint() or "https://huggingface.co"
    kept = "objects already sent stay on the Hub, so publishing again sends only the rest"
    if isinstance(exc, e.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status == 401:
            return f"the Hub refused your token for {repo} (401); {LOGIN}"
        if status == 403 or isinstance(exc, e.RepositoryNotFoundError):
            return (f"your token may not write to {repo} ({status}): use a token with write "
                    "access, and a repo under your own user or an organization you belong to")
        if status == 400 and "metadata" in str(exc).lower():
            return f"the Hub refused the model card's front matter for {repo} ({exc})"
        return f"the Hub answered {status} while publishing to {repo}; retry later ({kept})"
    if isinstance(exc, (OSError, *transport_errors())):
        return (f"cannot reach the Hub at {base} ({type(exc).__name__}) while publishing to "
                f"{repo}; check the network or proxy, then publish again ({kept})")
    return f"publishing to {repo} failed ({type(exc).__name__}: {exc}); {kept}"


def _call(fn, repo: str):
    """A huggingface_hub call whose failure becomes a one-sentence UserError."""
    from huggingface_hub import errors as e

    try:
        return fn()
    # ValueError: the client's own refusals of a server answer (LFS batch errors, metadata);
    # RuntimeError: an object's PUT failing inside the upload threads (its cause says why)
    except (e.HfHubHTTPError, OSError, ValueError, RuntimeError, *transport_errors()) as exc:
        cause = exc.__cause__ if isinstance(exc, RuntimeError) and exc.__cause__ else exc
        raise UserError(explain_upload_error(cause, repo) + ".") from None
