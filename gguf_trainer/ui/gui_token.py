"""Who may drive the GUI: the token every request proves, on loopback too (as Jupyter does).

Anyone who can reach the port (any local account, on loopback) could otherwise set the ggk
path to any executable and run it, start runs with remote code, or reset projects. One
contract, the README's ("A token, even on this machine"):

* the token is `GGUF_TRAINER_TOKEN` when set (tests, scripts), else a random one kept in the
  tool's home folder as `gui-token` (mode 0600, made once: written to a temp file and linked
  into place, so two first launches agree on one; a file others could read is replaced);
* a request proves it by the cookie `gguf-trainer-token-<port>`, by `?token=` (a GET sets
  the cookie and is redirected to the same address without it), or by
  `Authorization: Bearer <token>`; anything else is 401 with one sentence. Two requests
  Gradio itself makes without headers are let through, neither reads nor changes anything
  of ours: its login form (`POST /login`, with --share, a non-loopback --host or --auth;
  gradio_client posts it without its headers, and it only hands out Gradio's own cookie,
  which opens nothing without the token) and its own start-up call (`GET
  /gradio_api/startup-events`, which starts the queue once and is a no-op after);
* tokens are compared in constant time (hmac.compare_digest);
* the launch prints the address with the token and opens the browser on an owner-only
  redirect file (`gui-open-<port>.html` in the home folder), never on the address itself:
  any local account reads a browser's command line (/proc/<pid>/cmdline). There is no
  --token flag for the same reason.

Host/Origin refusals (ui/host_guard.py, 403) come first: TokenGuard sits inside HostGuard.

    token = gui_token()                                   # env, else the stored one
    Middleware(TokenGuard, token=token, port=8655)        # host_guard.lifespan puts it in
    open_in_browser(with_token("http://127.0.0.1:8655/", token), 8655)
    probe("127.0.0.1", 8655, token)   # "ours" | "other token" | None (the second launch)
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import html
import http.client
import json
import logging
import os
import re
import secrets
import stat
import tempfile
import webbrowser
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode

from gguf_trainer.base import atomic
from gguf_trainer.base.errors import UserError, os_error_sentence

log = logging.getLogger(__name__)

TOKEN_ENV = "GGUF_TRAINER_TOKEN"
TOKEN_FILE = "gui-token"
QUERY = "token"
PROBE_PATH = "/gguf-trainer-gui"  # answered by the guard itself: is this our GUI, our token?
REALM = 'Bearer realm="gguf-trainer"'
COOKIE_MAX_AGE_S = 30 * 24 * 3600
OPEN = {  # what Gradio itself sends without our headers (see the module's docstring)
    ("POST", "/login"), ("POST", "/login/"), ("GET", "/gradio_api/startup-events"),
}
_VALID = re.compile(r"[A-Za-z0-9._~-]{16,256}")  # goes into a URL, a cookie and a header as is


# ---- the token -------------------------------------------------------------------------------
def token_path() -> Path:
    from gguf_trainer.runner import supervisor  # the one place GGUF_TRAINER_HOME is read

    return supervisor.home_dir() / TOKEN_FILE


def gui_token() -> str:
    """GGUF_TRAINER_TOKEN when set, else the stored token (made on first use)."""
    env = (os.environ.get(TOKEN_ENV) or "").strip()
    if env:
        if not _VALID.fullmatch(env):
            raise UserError(f"{TOKEN_ENV} must be 16 to 256 letters, digits or '-_.~' (it goes "
                            "into an address, a cookie and a header as it is); fix it, or "
                            "unset it to use the token stored in gguf-trainer's home folder")
        return env
    return stored_token()


def stored_token(path: Path | None = None) -> str:
    """The token in `gui-token`, made (0600, atomically, once) when there is none."""
    path = path or token_path()
    token, why = _read_token(path)
    if token:
        return token
    if why:
        log.warning("%s %s; a new token replaces it", path, why)
    return _make_token(path, replace=why is not None)


def _read_token(path: Path) -> tuple[str | None, str | None]:
    """(token, None) when the file holds a usable one; (None, None) when there is no file;
    (None, why) when a file is there that must be replaced."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None, "is a link, not the token file the GUI wrote"
        raise UserError(os_error_sentence(e, path) or f"cannot read {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UserError(f"{path} is a folder, not the GUI's token file; move it away")
        if not stat.S_ISREG(st.st_mode):
            return None, "is not a regular file"
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            return None, "belongs to another account"
        if st.st_mode & 0o077:
            return None, f"could be read by other accounts (mode {stat.S_IMODE(st.st_mode):o})"
        text = os.read(fd, 1024).decode("ascii", errors="replace").strip()
    finally:
        os.close(fd)
    if not _VALID.fullmatch(text):
        return None, "does not hold a token"
    return text, None


def _make_token(path: Path, replace: bool) -> str:
    token = secrets.token_urlsafe(32)
    tmp = None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{TOKEN_FILE}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w") as f:  # mkstemp: mode 0600
            f.write(token + "\n")
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)  # never over a token another launch made meanwhile
            except FileExistsError:
                theirs, why = _read_token(path)
                if theirs:
                    return theirs
                os.replace(tmp, path)
                log.warning("%s %s; a new token replaces it", path, why)
        _fsync_dir(path.parent)
    except OSError as e:
        sentence = os_error_sentence(e, path) or f"cannot write {path}: {e.strerror}"
        raise UserError(sentence) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return token


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def proves(given: str | bytes | None, token: str) -> bool:
    """Whether `given` is the token (constant time)."""
    if given is None:
        return False
    if isinstance(given, str):
        given = given.encode("utf-8", errors="surrogateescape")
    return hmac.compare_digest(given, token.encode())


def cookie_name(port: int) -> str:
    """Cookies are shared by every port of a host: one name per GUI port."""
    return f"gguf-trainer-token-{port}"


def with_token(url: str, token: str, **params: str) -> str:
    """`url` (ending in /) with `?…&token=` (extra params first, e.g. project=DIR)."""
    query = urlencode({**params, QUERY: token}, quote_via=quote)
    return f"{url}?{query}"


# ---- the middleware ----------------------------------------------------------------------------
class TokenGuard:
    """Raw ASGI middleware: 401 for a request that does not prove the token."""

    def __init__(self, app, token: str, port: int):
        self.app, self.token, self.cookie = app, token, cookie_name(port)

    def _cookie(self, headers: list[tuple[bytes, bytes]]) -> bytes | None:
        want = self.cookie.encode()
        for name, value in headers:
            if name.lower() != b"cookie":
                continue
            for part in value.split(b";"):
                key, sep, val = part.strip().partition(b"=")
                if sep and key == want:
                    return val.strip().strip(b'"')
        return None

    @staticmethod
    def _bearer(headers: list[tuple[bytes, bytes]]) -> bytes | None:
        for name, value in headers:
            if name.lower() == b"authorization":
                scheme, _, cred = value.strip().partition(b" ")
                if scheme.lower() == b"bearer":
                    return cred.strip()
        return None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = scope.get("headers") or []
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                          keep_blank_values=True)
        given = [v for k, v in query if k == QUERY]
        method = scope.get("method", "GET")
        if given:
            if not all(proves(v, self.token) for v in given):
                return await _refuse(scope, send)
            if scope["type"] == "http" and method in ("GET", "HEAD"):
                return await self._redirect(scope, send, [(k, v) for k, v in query if k != QUERY])
            return await self.app(scope, receive, send)
        path = _app_path(scope)
        if proves(self._bearer(headers), self.token) or proves(self._cookie(headers), self.token):
            if path == PROBE_PATH and scope["type"] == "http":
                return await _answer(send, 200, json.dumps({"app": "gguf-trainer"}).encode(),
                                     b"application/json")
            return await self.app(scope, receive, send)
        if scope["type"] == "http" and (method, path) in OPEN:
            return await self.app(scope, receive, send)
        return await _refuse(scope, send)

    async def _redirect(self, scope, send, rest: list[tuple[str, str]]) -> None:
        """Set the cookie and send the browser to the same address without the token. The
        Location is relative (the last path segment), so a reverse proxy's prefix is kept."""
        raw = scope.get("raw_path") or scope.get("path", "/").encode()
        last = raw.split(b"?", 1)[0].rsplit(b"/", 1)[-1].decode("latin-1")
        location = "./" + last + ("?" + urlencode(rest, quote_via=quote) if rest else "")
        cookie = (f"{self.cookie}={self.token}; Path=/; Max-Age={COOKIE_MAX_AGE_S}; HttpOnly; "
                  "SameSite=Lax" + ("; Secure" if scope.get("scheme") == "https" else ""))
        await _answer(send, 303, b"", b"text/plain; charset=utf-8", [
            (b"location", location.encode("latin-1")),
            (b"set-cookie", cookie.encode()),
            (b"cache-control", b"no-store"),
            (b"referrer-policy", b"no-referrer"),
        ])


def _app_path(scope) -> str:
    path, root = scope.get("path", "/"), scope.get("root_path") or ""
    if root and path.startswith(root):
        path = path[len(root):] or "/"
    return path


UNPROVEN = ("this gguf-trainer GUI needs its token: open the address it printed at launch "
            "(it ends in ?token=…), or send the header 'Authorization: Bearer <token>'; the "
            f"token is {TOKEN_ENV} when the GUI was started with it, else the one in the "
            f"{TOKEN_FILE} file of gguf-trainer's home folder (~/.gguf-trainer)")


async def _refuse(scope, send) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    await _answer(send, 401, (UNPROVEN + "\n").encode(), b"text/plain; charset=utf-8",
                  [(b"www-authenticate", REALM.encode())])


async def _answer(send, status: int, body: bytes, ctype: bytes, extra=()) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype),
                            (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})


# ---- the browser and the second launch ---------------------------------------------------------
def redirect_file(port: int) -> Path:
    return token_path().parent / f"gui-open-{port}.html"


def open_in_browser(url: str, port: int, opener=webbrowser.open) -> Path:
    """Open `url` (which holds the token) through an owner-only local file, so that the
    token is never on the browser's command line. Returns the file."""
    path = redirect_file(port)
    shown = html.escape(url, quote=True)
    atomic.write_text(path, (  # a temp file from mkstemp: mode 0600
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="0;url={shown}">'
        '<meta name="referrer" content="no-referrer"><title>gguf-trainer</title></head>\n'
        f'<body><p>Opening gguf-trainer… If nothing happens, <a href="{shown}">click here</a>.'
        "</p></body></html>\n"))
    os.chmod(path, 0o600)
    opener(path.as_uri())
    return path


def probe(host: str, port: int, token: str, timeout_s: float = 3.0) -> str | None:
    """What listens on host:port: "ours" (a gguf-trainer GUI that takes this token),
    "other token" (a gguf-trainer GUI started with another token), or None (something else,
    or no answer)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", PROBE_PATH, headers={"Authorization": f"Bearer {token}"})
        res = conn.getresponse()
        body = res.read(4096)
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    if res.status == 401 and res.getheader("www-authenticate") == REALM:
        return "other token"
    if res.status == 200:
        with contextlib.suppress(ValueError):
            answer = json.loads(body)
            if isinstance(answer, dict) and answer.get("app") == "gguf-trainer":
                return "ours"
    return None
