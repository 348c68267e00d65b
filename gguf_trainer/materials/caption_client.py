"""Captions from an OpenAI-compatible chat endpoint, and the file that keeps them.

`CaptionClient` asks a server's `/v1` (llama.cpp's llama-server, llama-cpp-python's server, the
gguf-server ggk bundles, vLLM ...) for the model it serves (`GET /models`) and for one caption
per prompt (`POST /chat/completions`, the body upsampler_request builds). Every way the server
can fail — nothing listening, an HTTP error, a reply that is no chat completion, no answer in
pup.py's 900 s — is a `CaptionError`: one sentence naming the endpoint and the fix. The API key,
when a server wants one, comes from $GGUF_TRAINER_CAPTION_API_KEY (never project.json).

`CaptionCache` is `data/captions.jsonl`: one JSON line per caption, appended and fsynced as it
arrives (a kill -9 loses at most the caption being written; a torn last line is cut off before
the next append), keyed by (prompt, reference images, the server's model id, the system
prompt's sha256, max_tokens), so another model, another system prompt or another token cap
never reuses a caption.

    client = CaptionClient("http://127.0.0.1:8080/v1")
    model = client.resolve_model()                      # the id /v1/models lists
    reply = client.caption("a red fox", model, max_tokens=512)   # {"caption", "usage", ...}
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from gguf_trainer.base import project_file
from gguf_trainer.base.errors import UserError, quote

from . import upsampler_request as pup

API_KEY_ENV = "GGUF_TRAINER_CAPTION_API_KEY"
CONNECT_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 30.0  # GET /models: answered at once by a live server
DETAIL_CHARS = 200  # of a server's error text quoted in a sentence
FIX = "start it (README, \"Captions from the upsampler\") or clear corpus.caption_endpoint"


class CaptionError(UserError):
    """The caption endpoint failed; the message is the sentence to show."""


def base_url(endpoint: str) -> str:
    """The endpoint without a trailing slash; a bare `http://host:port` gets `/v1` (where
    every OpenAI-compatible server serves). UserError for anything but an http(s) URL."""
    text = endpoint.strip()
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"corpus.caption_endpoint {quote(endpoint)} is not an http(s) address; "
                        "set it like http://127.0.0.1:8080/v1.")
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def _loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _flat(text: str) -> str:
    """A server's text on one line, cut to DETAIL_CHARS."""
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS] + "..."


def _error_detail(body: bytes) -> str:
    """The message in an error reply ({"error": {"message"}}, {"detail"}, or the text)."""
    text = body.decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except ValueError:
        return _flat(text)
    if isinstance(data, dict):
        err = data.get("error", data.get("detail"))
        if isinstance(err, dict):
            err = err.get("message", err)
        if err is not None:
            return _flat(err if isinstance(err, str) else json.dumps(err))
    return _flat(text)


class CaptionClient:
    """One endpoint; safe to use from several threads (an HTTP connection pool per thread)."""

    def __init__(self, endpoint: str, model: str = "",
                 timeout_s: float = pup.GENERATE_TIMEOUT_S) -> None:
        self.url = base_url(endpoint)
        self.model = model.strip()
        self.timeout_s = timeout_s
        self._local = threading.local()
        # httpx logs every request at INFO: one line per caption would flood pipeline.log
        logging.getLogger("httpx").setLevel(max(logging.WARNING,
                                                logging.getLogger("httpx").level))

    def _http(self):
        import httpx

        client = getattr(self._local, "client", None)
        if client is None:
            key = os.environ.get(API_KEY_ENV, "").strip()
            client = httpx.Client(
                timeout=httpx.Timeout(self.timeout_s, connect=CONNECT_TIMEOUT_S),
                headers={"Authorization": f"Bearer {key}"} if key else {},
                trust_env=not _loopback(self.url),  # a proxy never stands before loopback
            )
            self._local.client = client
        return client

    def _call(self, method: str, path: str, body: dict | None = None,
              timeout_s: float | None = None):
        """The JSON reply of one request; CaptionError (one sentence) for every failure."""
        import httpx

        url = self.url + path
        try:
            r = self._http().request(method, url, json=body,
                                     timeout=timeout_s if timeout_s else httpx.USE_CLIENT_DEFAULT)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            raise CaptionError(f"the caption endpoint {self.url} cannot be reached "
                               f"({_flat(str(e)) or type(e).__name__}); {FIX}.") from None
        except httpx.TimeoutException:
            raise CaptionError(f"the caption endpoint {self.url} did not answer {path} within "
                               f"{timeout_s or self.timeout_s:.0f} s; check the server (is it "
                               "busy or stuck?) and start again: captions already written "
                               "are kept.") from None
        except httpx.HTTPError as e:
            raise CaptionError(f"the caption endpoint {self.url} dropped the request to {path} "
                               f"({_flat(str(e)) or type(e).__name__}); check the server and "
                               "start again: captions already written are kept.") from None
        if r.status_code >= 400:
            detail = _error_detail(r.content)
            hint = ("its context is too small for the upsampler's system prompt (~11k tokens): "
                    f"restart it with a context of {pup.CONTEXT_SIZE}"
                    if re.search(r"context|n_ctx|too long|exceed", detail, re.IGNORECASE)
                    else "check the server and corpus.caption_model")
            raise CaptionError(f"the caption endpoint {self.url} answered HTTP {r.status_code} "
                               f"to {path} ({detail or 'no detail'}); {hint}.")
        try:
            return r.json()
        except ValueError:
            raise CaptionError(f"the caption endpoint {self.url} answered {path} with something "
                               f"that is not JSON ({_flat(r.text) or 'nothing'}); it must be an "
                               "OpenAI-compatible /v1 address.") from None

    def resolve_model(self) -> str:
        """The model id to ask: corpus.caption_model if the server lists it, else the first
        it lists. CaptionError when the server is unreachable or lists none."""
        reply = self._call("GET", "/models", timeout_s=PROBE_TIMEOUT_S)
        data = reply.get("data") if isinstance(reply, dict) else None
        ids = [m["id"] for m in data or () if isinstance(m, dict) and isinstance(m.get("id"), str)]
        if not ids:
            raise CaptionError(f"the caption endpoint {self.url} lists no model at /models; it "
                               "must be an OpenAI-compatible /v1 address with a model loaded.")
        if self.model and self.model not in ids:
            raise CaptionError(f"the caption endpoint {self.url} serves {', '.join(ids[:8])}, not "
                               f"corpus.caption_model {quote(self.model)}; choose one of those "
                               "or leave it empty.")
        return self.model or ids[0]

    def caption(self, prompt: str, model: str, max_tokens: int = pup.MAX_TOKENS,
                images: Sequence[Path] = ()) -> dict:
        """{"caption" (think block stripped, "" when the model wrote nothing), "usage",
        "seconds"} for one prompt (and its reference images: the i2i request)."""
        t0 = time.monotonic()
        try:
            body = pup.chat_body(prompt, model, max_tokens, images)
        except ValueError as e:  # a reference past pup.py's 200:1: ggk sends such a prompt as typed
            return {"caption": "", "seconds": 0.0, "usage": {}, "skipped": str(e)}
        reply = self._call("POST", "/chat/completions", body)
        try:
            text = pup.caption_of(reply)
        except ValueError as e:
            raise CaptionError(f"the caption endpoint {self.url} did not answer with a chat "
                               f"completion ({e}: {_flat(json.dumps(reply))}); it must be an "
                               "OpenAI-compatible /v1 address.") from None
        usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
        return {"caption": text, "seconds": round(time.monotonic() - t0, 3),
                "usage": {k: v for k, v in usage.items() if isinstance(v, int)}}


# ---------------------------------------------------------------- the cache


def cache_key(prompt: str, images: Sequence[str], model: str, system_sha256: str,
              max_tokens: int) -> str:
    return json.dumps([prompt, list(images), model, system_sha256, int(max_tokens)],
                      ensure_ascii=False)


def _key_of(rec) -> str:
    if not isinstance(rec, dict) or not isinstance(rec.get("caption"), str):
        raise TypeError("not a caption record")
    return cache_key(rec["prompt"], rec.get("images") or [], rec["model"],
                     rec["system_sha256"], rec["max_tokens"])


class CaptionCache:
    """data/captions.jsonl: read once, then appended to (one writer: the corpus stage)."""

    def __init__(self, root: Path, path: Path) -> None:
        self.root, self.path = Path(root), Path(path)
        self.entries: dict[str, dict] = {}
        self.unreadable = 0  # damaged or foreign lines, skipped
        self._handle = None
        try:
            with project_file.open_file(self.root, self.path) as f:
                data = f.read()
        except FileNotFoundError:
            return
        for line in data[: data.rfind(b"\n") + 1].splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                self.entries[_key_of(rec)] = rec
            except (ValueError, KeyError, TypeError):
                self.unreadable += 1

    def get(self, key: str) -> dict | None:
        return self.entries.get(key)

    def add(self, key: str, rec: dict) -> None:
        """Append one record and fsync it (a torn last line is cut off first)."""
        if self._handle is None:
            self._handle = project_file.open_append(self.root, self.path)  # refuses a link
            size = os.fstat(self._handle.fileno()).st_size
            if size:
                fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    if os.pread(fd, 1, size - 1) != b"\n":
                        os.ftruncate(fd, os.pread(fd, size, 0).rfind(b"\n") + 1)
                finally:
                    os.close(fd)
        line = json.dumps(rec, ensure_ascii=False) + "\n"
        assert _key_of(json.loads(line)) == key
        self._handle.write(line.encode("utf-8"))
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self.entries[key] = rec

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
