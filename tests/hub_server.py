"""A local HTTP server that speaks the Hugging Face Hub's file protocol, for tests.

The real `huggingface_hub` client (and everything built on it) talks to it when
`HF_ENDPOINT` points here; detached jobs get the variable in their environment. It serves
the endpoints the installed client calls:

    GET  /api/{models|datasets}/{repo}[/revision/{rev}]    repo_info / model_info / dataset_info
    GET  /api/{models|datasets}/{repo}/tree/{rev}[/{dir}]  list_repo_tree (recursive, one page)
    HEAD /[datasets/]{repo}/resolve/{rev}/{file}           X-Repo-Commit, ETag/X-Linked-Etag, sizes
    GET  /[datasets/]{repo}/resolve/{rev}/{file}           bytes, with `Range: bytes=N-` -> 206

and the ones it calls to upload (huggingface_hub 2.4's create_repo and create_commit with
Xet off, `HF_HUB_DISABLE_XET`, which this fixture sets: the legacy LFS path):

    POST /api/repos/create                                  create_repo (409 when it exists)
    POST /api/validate-yaml                                 the README's front matter, parsed
    POST /api/{models|datasets}/{repo}/preupload/{rev}      upload mode per file + remote oid
    POST /[datasets/]{repo}.git/info/lfs/objects/batch      LFS batch, `basic` transfer: an
                                                            upload action only for objects the
                                                            server lacks
    PUT  /_lfs/{type}/{repo}/{oid}                          the object's bytes (sha256 checked)
    POST /_lfs_verify/{type}/{repo}                         verify: 404 unless stored
    POST /api/{models|datasets}/{repo}/commit/{rev}         NDJSON: header, file (base64),
                                                            lfsFile (an object it holds)

With Xet on (no HF_HUB_DISABLE_XET) and `hub_server.xet = XetStore()`, the Xet write token and
the CAS routes of hub_xet_routes.py answer too.

Writes need a token in `tokens` (else 401). LFS objects stay stored per repo whether or not a
commit names them, as on the Hub, so a second upload after a kill sends only what is missing.

Files at least `LFS_MIN_BYTES` long are served as LFS files (sha256 ETag, `lfs` in the
listing), like the Hub does for weights. Gated repos answer 401 with `X-Error-Code:
GatedRepo` unless the request carries an accepted token; private repos answer 401
`RepoNotFound`; missing repos 404 `RepoNotFound`; missing files 404 `EntryNotFound`.

Test controls (all thread-safe):
* `pause(path, after_bytes)`: a GET of that file sends `after_bytes` bytes, then waits
  until `release(path)` - a deterministic "mid-file" for kill tests (no timing guesses).
* `break_after(path, after_bytes, then_status)`: the next GET of that file sends
  `after_bytes` bytes and drops the connection, and the GET after that answers
  `then_status` (403: the signed URL expired) - a transfer that breaks mid-file.
* `requests`: every request as (method, url path, headers dict), to assert on Range
  headers, on how many times a file was fetched, or on the Authorization a client sent.
* Uploads: `lfs[(repo_type, repo_id)]` the objects stored (oid -> bytes); `commits` one
  record per commit (repo, summary, files it wrote); `hold_put(oid)`: the PUT of that object
  waits until `release_put(oid)` (`put_arrived(oid)` says it came), then ends unstored, as a
  PUT cut off mid-object does - a deterministic "killed mid-upload".
* A hostile Hub: `lie(path, data)` serves other bytes for a file than its listing declares
  (same size, other hash); `overflow(path, extra_bytes)` sends that many bytes more than
  the file's size (Content-Length included); `html_api = True` answers every /api/ call
  with status 200 and an HTML page (a proxy's login page).

Usage:
    from hub_server import hub_server          # the pytest fixture (function scope)
    hub_server.add_repo("org/model", {"config.json": b"{}", "model.safetensors": data})
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import pytest
from hub_upload_routes import _UploadRoutes

LFS_MIN_BYTES = 1024
CHUNK = 4096
_RANGE_RE = re.compile(r"bytes=(\d+)-(\d*)$")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    repo_id: str
    repo_type: str
    files: dict[str, bytes]
    gated: bool = False
    private: bool = False
    branches: tuple[str, ...] = ("main",)
    commit: str = field(default="")
    card_data: dict | None = None  # repo_info's cardData (license ...)
    # The paths committed as LFS files; None: every file of LFS_MIN_BYTES or more (add_repo's)
    lfs_paths: set[str] | None = None

    def __post_init__(self):
        if not self.commit:
            h = hashlib.sha1(self.repo_id.encode())
            for path in sorted(self.files):
                h.update(path.encode() + b"\0" + hashlib.sha1(self.files[path]).digest())
            self.commit = h.hexdigest()

    def is_lfs(self, path: str) -> bool:
        if self.lfs_paths is not None:
            return path in self.lfs_paths
        return len(self.files[path]) >= LFS_MIN_BYTES

    def oid(self, path: str) -> str:
        """What preupload answers as a committed file's oid: the sha256 of an LFS file, the git
        blob id of another (CommitOperationAdd._local_oid compares with the same)."""
        data = self.files[path]
        return hashlib.sha256(data).hexdigest() if self.is_lfs(path) else git_blob_sha1(data)

    def etag(self, path: str) -> str:
        data = self.files[path]
        return hashlib.sha256(data).hexdigest() if self.is_lfs(path) else git_blob_sha1(data)

    def tree_entry(self, path: str) -> dict:
        data = self.files[path]
        entry = {"type": "file", "path": path, "size": len(data), "oid": git_blob_sha1(data)}
        if self.is_lfs(path):
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                            "pointerSize": 134}
        return entry


class HubServer:
    """The server and its repos; see the module docstring."""

    def __init__(self):
        self.repos: dict[tuple[str, str], Repo] = {}
        self.tokens: set[str] = set()
        self.requests: list[tuple[str, str, dict]] = []
        self._pauses: dict[str, tuple[int, threading.Event]] = {}
        self._breaks: dict[str, list] = {}  # path -> [after_bytes or None, then_status or None]
        self.lies: dict[str, bytes] = {}  # path -> the bytes actually served
        self.overflows: dict[str, int] = {}  # path -> extra bytes sent after the file
        self.html_api = False
        self.lfs: dict[tuple[str, str], dict[str, bytes]] = {}
        self.commits: list[dict] = []
        self._holds: dict[str, tuple[threading.Event, threading.Event]] = {}
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"hub": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def add_repo(self, repo_id: str, files: dict[str, bytes], repo_type: str = "model",
                 gated: bool = False, private: bool = False,
                 branches: tuple[str, ...] = ("main",), card_data: dict | None = None) -> Repo:
        """Serve `files`; `branches` are the revision names that resolve to its one commit
        (e.g. "refs/convert/parquet", sent URL-encoded by the client); `card_data` is what
        repo_info reports of its README's front matter."""
        repo = Repo(repo_id, repo_type, dict(files), gated, private, tuple(branches),
                    card_data=card_data)
        self.repos[(repo_type, repo_id)] = repo
        return repo

    def pause(self, path: str, after_bytes: int) -> None:
        with self._lock:
            self._pauses[path] = (after_bytes, threading.Event())

    def release(self, path: str) -> None:
        with self._lock:
            pause = self._pauses.pop(path, None)
        if pause:
            pause[1].set()

    def lie(self, path: str, data: bytes) -> None:
        self.lies[path] = data

    def overflow(self, path: str, extra_bytes: int) -> None:
        self.overflows[path] = extra_bytes

    def hold_put(self, oid: str) -> None:
        with self._lock:
            self._holds[oid] = (threading.Event(), threading.Event())  # (arrived, released)

    def put_arrived(self, oid: str) -> bool:
        with self._lock:
            hold = self._holds.get(oid)
        return bool(hold and hold[0].is_set())

    def release_put(self, oid: str) -> None:
        with self._lock:
            hold = self._holds.pop(oid, None)
        if hold:
            hold[1].set()

    def lfs_puts(self) -> list[str]:
        """The oid of every LFS PUT received, in order (whole or not)."""
        with self._lock:
            return [p.rsplit("/", 1)[-1] for m, p, _ in self.requests
                    if m == "PUT" and p.startswith("/_lfs/")]

    def break_after(self, path: str, after_bytes: int, then_status: int = 403) -> None:
        with self._lock:
            self._breaks[path] = [after_bytes, then_status]

    def _take_break(self, path: str) -> tuple[int | None, int | None]:
        """(bytes to send before dropping, status to answer instead) for this GET."""
        with self._lock:
            plan = self._breaks.get(path)
            if not plan:
                return None, None
            if plan[0] is not None:
                after, plan[0] = plan[0], None
                return after, None
            self._breaks.pop(path)
            return None, plan[1]

    def get_requests(self, path_suffix: str, method: str = "GET") -> list[dict]:
        """Headers of every `method` request whose URL path ends with `path_suffix`."""
        with self._lock:
            return [h for m, p, h in self.requests if m == method and p.endswith(path_suffix)]

    def close(self) -> None:
        with self._lock:
            for _, event in self._pauses.values():
                event.set()
            for _, released in self._holds.values():
                released.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    # ---- used by the handler --------------------------------------------------------
    def _record(self, method: str, path: str, headers: dict) -> None:
        with self._lock:
            self.requests.append((method, path, headers))

    def _pause_for(self, path: str) -> tuple[int, threading.Event] | None:
        with self._lock:
            return self._pauses.get(path)



class _Handler(BaseHTTPRequestHandler, _UploadRoutes):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # keep test output clean
        pass

    # ---- routing -----------------------------------------------------------------------
    def do_GET(self):
        if not self._xet_get():  # the Xet token and CAS reads (hub_xet_routes.py)
            self._dispatch(send_body=True)

    def do_HEAD(self):
        self._dispatch(send_body=False)

    def do_POST(self):
        self._upload_dispatch()

    def do_PUT(self):
        self._upload_dispatch()

    def _dispatch(self, send_body: bool) -> None:
        raw = urlsplit(self.path).path  # match before unquoting: a revision may hold %2F
        path = unquote(raw)
        self.hub._record(self.command, path, {k.lower(): v for k, v in self.headers.items()})
        # repo_info without a revision asks /api/models/{repo}: the main branch's answer
        m = re.match(r"^/api/(models|datasets)/(.+?)(?:/(revision|tree)/([^/]+)(/.*)?)?$", raw)
        if m and self.hub.html_api:
            return self._html()
        if m:
            return self._api(m.group(1)[:-1], unquote(m.group(2)), m.group(3) or "revision",
                             unquote(m.group(4) or "main"), unquote(m.group(5) or ""))
        m = re.match(r"^/(datasets/)?(.+?)/resolve/([^/]+)/(.+)$", raw)
        if m:
            return self._resolve("dataset" if m.group(1) else "model", unquote(m.group(2)),
                                 unquote(m.group(3)), unquote(m.group(4)), send_body)
        self._error(404, "RepoNotFound", "not a Hub endpoint")

    # ---- helpers -------------------------------------------------------------------------
    def _error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _html(self) -> None:
        body = b"<!doctype html><html><body>Please log in to the proxy</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _repo_or_error(self, repo_type: str, repo_id: str) -> Repo | None:
        repo = self.hub.repos.get((repo_type, repo_id))
        auth = self.headers.get("Authorization", "")
        has_token = auth.startswith("Bearer ") and auth[7:] in self.hub.tokens
        if repo is None or (repo.private and not has_token):
            # The Hub answers 401 for a private repo without a token, 404 for none at all.
            self._error(401 if repo else 404, "RepoNotFound", "Repository not found")
            return None
        if repo.gated and not has_token:
            self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must "
                        "have access to it and be authenticated to access it. Please log in.")
            return None
        return repo

    def _api(self, repo_type: str, repo_id: str, kind: str, rev: str, sub: str) -> None:
        repo = self._repo_or_error(repo_type, repo_id)
        if repo is None:
            return
        if rev not in (*repo.branches, repo.commit):
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        if kind == "revision":
            return self._json(
                {
                    "id": repo_id,
                    "sha": repo.commit,
                    "private": repo.private,
                    "gated": "manual" if repo.gated else False,
                    "siblings": [
                        {"rfilename": p, "size": len(d)} for p, d in sorted(repo.files.items())
                    ],
                    **({"cardData": repo.card_data} if repo.card_data else {}),
                }
            )
        prefix = sub.strip("/")
        paths = sorted(p for p in repo.files if not prefix or p.startswith(prefix + "/"))
        folders = sorted({p.rsplit("/", 1)[0] for p in paths if "/" in p})
        self._json(
            [{"type": "directory", "path": f, "oid": "0" * 40} for f in folders]
            + [repo.tree_entry(p) for p in paths]
        )

    def _resolve(
        self, repo_type: str, repo_id: str, rev: str, filename: str, send_body: bool
    ) -> None:
        repo = self._repo_or_error(repo_type, repo_id)
        if repo is None:
            return
        if rev not in (*repo.branches, repo.commit):
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        if filename not in repo.files:
            return self._error(404, "EntryNotFound", f"{filename} does not exist", repo.commit)
        data = self.hub.lies.get(filename, repo.files[filename])
        data += b"\0" * self.hub.overflows.get(filename, 0)
        drop_after, status = self.hub._take_break(filename) if send_body else (None, None)
        if status:
            return self._error(status, "Forbidden", "Request has expired (signed URL)")
        start = 0
        m = _RANGE_RE.match(self.headers.get("Range", ""))
        if m and send_body:
            start = int(m.group(1))
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{git_blob_sha1(data)}"')
        if repo.is_lfs(filename):
            self.send_header("X-Linked-Etag", f'"{repo.etag(filename)}"')
            self.send_header("X-Linked-Size", str(len(data)))
        self.send_header("Accept-Ranges", "bytes")
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        if send_body:
            self._send_body(filename, data, start, drop_after)

    def _send_body(
        self, filename: str, data: bytes, start: int, drop_after: int | None = None
    ) -> None:
        pause = self.hub._pause_for(filename)
        pos = start
        try:
            while pos < len(data):
                if drop_after is not None and pos - start >= drop_after:
                    self.close_connection = True  # promised more bytes: the client sees a break
                    return
                if pause and pos >= pause[0]:
                    pause[1].wait()
                    pause = None
                end = min(len(data), pos + CHUNK)
                if pause:
                    end = min(end, max(pause[0], pos + 1))
                if drop_after is not None:
                    end = min(end, start + drop_after)
                self.wfile.write(data[pos:end])
                self.wfile.flush()
                pos = end
        except (BrokenPipeError, ConnectionResetError):  # the client was killed mid-file
            self.close_connection = True


@pytest.fixture
def hub_server(monkeypatch, tmp_path):
    """A fresh local Hub; HF_ENDPOINT points at it and HF_HOME/HF_TOKEN are isolated."""
    server = HubServer()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    from huggingface_hub import constants  # read at import: this process may have it loaded

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield server
    server.close()
