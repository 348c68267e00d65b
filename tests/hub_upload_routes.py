"""The write half of the local Hub (hub_server.py): the endpoints huggingface_hub 2.4 calls to
upload with Xet off - create_repo, validate-yaml, preupload, the LFS batch with the `basic`
transfer, the object PUT and its verify, and the NDJSON commit - and, with Xet on, the CAS
routes of hub_xet_routes.py instead of the LFS ones (the commit takes a file the CAS rebuilt
as it takes an LFS object). Mixed into hub_server's request handler; the server's state
(repos, stored LFS objects, commits, holds, `xet`) is its `hub`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from urllib.parse import unquote, urlsplit

from hub_xet_routes import _XetRoutes, xet_object

_WRITE_ROUTES = (
    ("preupload", re.compile(r"^/api/(models|datasets)/(.+?)/preupload/([^/]+)$")),
    ("commit", re.compile(r"^/api/(models|datasets)/(.+?)/commit/([^/]+)$")),
    ("batch", re.compile(r"^/(datasets/)?(.+?)\.git/info/lfs/objects/batch$")),
    ("put", re.compile(r"^/_lfs/(model|dataset)/(.+)/([0-9a-f]{64})$")),
    ("verify", re.compile(r"^/_lfs_verify/(model|dataset)/(.+)$")),
)


def _front_matter_error(content: str) -> str | None:
    """Why a README's YAML front matter does not parse (the Hub's validate-yaml), or None."""
    import yaml

    if not content.startswith("---\n"):
        return None
    end = content.find("\n---", 4)
    if end < 0:
        return "the front matter has no closing ---"
    try:
        data = yaml.safe_load(content[4:end])
    except yaml.YAMLError as e:
        return f"invalid YAML: {e}"
    return None if isinstance(data, dict) else "the front matter is not a mapping"


class _UploadRoutes(_XetRoutes):
    """The write half of the Hub protocol (module docstring); mixed into the handler."""

    hub: object  # hub_server.HubServer

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []  # joined once: a 64 MB xorb arrives in many small pieces
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0] or b"0", 16)
                if not size:
                    self.rfile.readline()
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _authorized(self) -> bool:
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer ") and auth[7:] in self.hub.tokens:
            return True
        self._error(401, "", "Invalid credentials in Authorization header")
        return False

    def _upload_dispatch(self) -> None:
        raw = urlsplit(self.path).path
        self.hub._record(self.command, unquote(raw), {k.lower(): v for k, v in
                                                      self.headers.items()})
        if self.command == "POST" and self._xet_post(raw):
            return None
        if self.command == "POST" and raw == "/api/repos/create":
            return self._create_repo(json.loads(self._body() or b"{}"))
        if self.command == "POST" and raw == "/api/validate-yaml":
            why = _front_matter_error(json.loads(self._body() or b"{}").get("content", ""))
            if why:
                return self._reply(400, {"errors": [{"message": why}], "warnings": []})
            return self._reply(200, {"errors": [], "warnings": []})
        for name, pattern in _WRITE_ROUTES:
            m = pattern.match(raw)
            if m and (name == "put") == (self.command == "PUT"):
                return getattr(self, f"_{name}")(*[unquote(g or "") for g in m.groups()])
        self._body()
        self._error(404, "RepoNotFound", "not a Hub endpoint")

    def _reply(self, status: int, obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _writable(self, repo_type: str, repo_id: str):
        if not self._authorized():
            return None
        repo = self.hub.repos.get((repo_type, repo_id))
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
        return repo

    def _create_repo(self, payload: dict) -> None:
        if not self._authorized():
            return
        repo_type = payload.get("type") or "model"
        repo_id = "/".join(p for p in (payload.get("organization"), payload.get("name")) if p)
        url = f"{self.hub.url}/{'datasets/' if repo_type == 'dataset' else ''}{repo_id}"
        if (repo_type, repo_id) in self.hub.repos:
            return self._reply(409, {"error": "You already created this model repo",
                                     "url": url})
        repo = self.hub.add_repo(repo_id, {}, repo_type,
                                 private=payload.get("visibility") == "private")
        repo.lfs_paths = set()
        self._reply(200, {"url": url, "name": repo_id})

    def _preupload(self, kind: str, repo_id: str, rev: str) -> None:
        payload = json.loads(self._body() or b"{}")
        repo = self._writable(kind[:-1], repo_id)
        if repo is None:
            return
        files = []
        for f in payload.get("files", []):
            sample = base64.b64decode(f.get("sample", ""))
            lfs = (f["path"].endswith((".gguf", ".safetensors", ".bin"))
                   or f.get("size", 0) >= 10 << 20 or b"\0" in sample)
            files.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular",
                          "shouldIgnore": False,
                          "oid": repo.oid(f["path"]) if f["path"] in repo.files else None})
        self._reply(200, {"files": files, "commitOid": repo.commit})

    def _batch(self, datasets: str, repo_id: str) -> None:
        payload = json.loads(self._body() or b"{}")
        repo_type = "dataset" if datasets else "model"
        if self._writable(repo_type, repo_id) is None:
            return
        with self.hub._lock:
            stored = self.hub.lfs.setdefault((repo_type, repo_id), {})
        objects = []
        for o in payload.get("objects", []):
            entry = {"oid": o["oid"], "size": o["size"]}
            if len(stored.get(o["oid"], b"")) != o["size"] or o["oid"] not in stored:
                entry["authenticated"] = True
                entry["actions"] = {
                    "upload": {"href": f"{self.hub.url}/_lfs/{repo_type}/{repo_id}/{o['oid']}"},
                    "verify": {"href": f"{self.hub.url}/_lfs_verify/{repo_type}/{repo_id}"},
                }
            objects.append(entry)
        self._reply(200, {"transfer": "basic", "objects": objects})

    def _put(self, repo_type: str, repo_id: str, oid: str) -> None:
        with self.hub._lock:
            hold = self.hub._holds.get(oid)
        if hold:  # killed mid-upload: the client goes while this object is on its way
            hold[0].set()
            hold[1].wait()
            self.close_connection = True  # a body cut off is never stored, whatever came
            return
        try:
            data = self._body()
        except (OSError, ValueError):
            self.close_connection = True
            return
        if hashlib.sha256(data).hexdigest() != oid:  # a torn body is never stored
            self.close_connection = True
            try:
                self._reply(400, {"error": "sha256 does not match the oid"})
            except OSError:  # the client is gone (killed mid-upload)
                pass
            return
        with self.hub._lock:
            self.hub.lfs.setdefault((repo_type, repo_id), {})[oid] = data
        try:
            self._reply(200, {})
        except OSError:  # the client is gone; the object is whole and stays stored
            pass

    def _verify(self, repo_type: str, repo_id: str) -> None:
        payload = json.loads(self._body() or b"{}")
        if self._writable(repo_type, repo_id) is None:
            return
        held = self.hub.lfs.get((repo_type, repo_id), {}).get(payload.get("oid"))
        if held is None or len(held) != payload.get("size"):
            return self._error(404, "", "object not found")
        self._reply(200, {})

    def _commit(self, kind: str, repo_id: str, rev: str) -> None:
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        repo = self._writable(kind[:-1], repo_id)
        if repo is None:
            return
        if rev not in repo.branches:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        stored = self.hub.lfs.get((repo.repo_type, repo_id), {})
        files, lfs_paths = dict(repo.files), set(repo.lfs_paths or ())
        summary, written = "", []
        for item in lines:
            key, value = item.get("key"), item.get("value") or {}
            if key == "header":
                summary = value.get("summary", "")
            elif key == "file":
                files[value["path"]] = base64.b64decode(value["content"])
                lfs_paths.discard(value["path"])
                written.append(value["path"])
            elif key == "lfsFile":
                data = stored.get(value["oid"])
                data = xet_object(self.hub, value["oid"]) if data is None else data
                if data is None:
                    return self._error(422, "", f"LFS object {value['oid']} was never uploaded")
                files[value["path"]] = data
                lfs_paths.add(value["path"])
                written.append(value["path"])
            elif key in ("deletedFile", "deletedFolder"):
                files.pop(value["path"], None)
                lfs_paths.discard(value["path"])
        with self.hub._lock:
            repo.files, repo.lfs_paths = files, lfs_paths
            repo.commit = hashlib.sha1((repo.commit + json.dumps(lines)).encode()).hexdigest()
            self.hub.commits.append({"repo": repo_id, "summary": summary, "files": written,
                                     "oid": repo.commit})
        self._reply(200, {"commitUrl": f"{self.hub.url}/{repo_id}/commit/{repo.commit}",
                          "commitOid": repo.commit, "success": True})

