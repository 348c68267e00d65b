"""The GUI answers only requests addressed to it: the Host and Origin allow-list.

DNS rebinding: a web page the user visits at `rebind.example` re-points that name at
127.0.0.1, and its script then POSTs to `http://rebind.example:8655/gradio_api/...`. The
browser sends `Host: rebind.example:8655` and `Origin: http://rebind.example`; Gradio's
CORS rule only guards a loopback Host, so it answers 200 and even reflects the Origin, and
the page drives the trainer. So every request must name one of the hosts the GUI was
started for in its Host header, and an Origin, when sent, must be one of them too:

* the loopback names (localhost, 127.0.0.1, ::1);
* the `--host` address; with `--host 0.0.0.0` / `::`, this machine's own names and addresses;
* with `--share`, the share link's host (known once the tunnel is up);
* every `--allow-host NAME` (the name a reverse proxy forwards).

Anything else gets 403 with one sentence, before Gradio (and its CORS headers) see it: the
guard is put outermost when the server starts (`lifespan`), because Gradio adds its own
CORS middleware around anything passed in at construction.

Right inside it, `BodyLimit` bounds a request's body: the GUI uploads nothing (every file is a
path; Gradio's own upload route is held to max_file_size 1mb), so no request needs more than
MAX_BODY_BYTES, while a 256 MB body read whole by a route would cost three times that, kept.
A Content-Length over the bound is 413 before a byte is read; a body without one (chunked) is
counted as it streams, and the request is cut with 413 the moment it passes the bound.

    kwargs["app_kwargs"] = {"lifespan": host_guard.lifespan(allowed_hosts(...))}
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

import psutil

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
# The largest request body the GUI reads: its JSON calls carry settings, paths and a prompt
# (kilobytes); it takes no uploads (Gradio's upload route is capped at 1mb by launch.py).
MAX_BODY_BYTES = 4 << 20
ANY_ADDRESS = ("0.0.0.0", "::", "")


def hostname(value: str | None) -> str | None:
    """The host name of a Host header ("name:port", "[::1]:8655") or an Origin URL,
    lower-case and without the port; None when it cannot be parsed."""
    if not value:
        return None
    text = value.strip()
    if "://" not in text:
        text = "//" + text
    try:
        name = urlsplit(text).hostname
    except ValueError:  # a malformed IPv6 literal
        return None
    return name.rstrip(".").lower() if name else None


def machine_names() -> set[str]:
    """This machine's host names and interface addresses (for `--host 0.0.0.0`)."""
    names = {socket.gethostname(), socket.getfqdn()}
    try:
        for addrs in psutil.net_if_addrs().values():
            names.update(a.address.split("%")[0] for a in addrs
                         if a.family in (socket.AF_INET, socket.AF_INET6))
    except OSError:  # no interface list here: the names still count
        pass
    resolved: set[str] = set()
    for name in names:
        try:
            resolved.update(info[4][0] for info in socket.getaddrinfo(name, None))
        except (OSError, UnicodeError):  # a name the resolver does not know
            continue
    return {n.lower() for n in names | resolved if n}


def allowed_hosts(host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The names a request may address: loopback, `host` (or, for an any-address bind, the
    machine's names), and `extra` (--allow-host)."""
    names = set(LOOPBACK_NAMES)
    if host in ANY_ADDRESS:
        names |= machine_names()
    else:
        names.add(hostname(host) or host.lower())
    names |= {hostname(h) or h.lower() for h in extra}
    return frozenset(_canonical(n) for n in names)


def _canonical(name: str) -> str:
    """One spelling per IP address ("::0001" and "::1" are the same host)."""
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name


class HostGuard:
    """Raw ASGI middleware: 403 for a Host or an Origin the GUI was not started for.
    `more()` adds names known only later (the share link's host)."""

    def __init__(self, app, allowed: frozenset[str], more: Callable[[], Iterable[str]] = tuple):
        self.app, self.allowed, self.more = app, allowed, more

    def is_allowed(self, name: str | None) -> bool:
        if name is None:
            return False
        name = _canonical(name)
        return name in self.allowed or name in {_canonical(n) for n in self.more() if n}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers") or []}
        host = headers.get("host")
        origin = headers.get("origin")
        if not self.is_allowed(hostname(host)):
            return await _refuse(scope, send, f"this gguf-trainer GUI does not answer to host "
                                 f"{(host or '(none)')[:80]!r}; open it by the address it was "
                                 "started on, or start it with --allow-host NAME")
        if origin is not None and not self.is_allowed(hostname(origin)):
            return await _refuse(scope, send, f"requests from pages at {origin[:80]!r} are not "
                                 "accepted by this gguf-trainer GUI")
        return await self.app(scope, receive, send)


class BodyLimit:
    """Raw ASGI middleware: 413 for a request body over `max_bytes`: by its Content-Length
    before anything is read, else counted chunk by chunk as the app receives it (the app then
    sees the client gone, and nothing it answers is sent)."""

    def __init__(self, app, max_bytes: int = MAX_BODY_BYTES):
        self.app, self.max_bytes = app, max_bytes

    def sentence(self) -> str:
        return (f"this request's body is over {self.max_bytes:,} bytes, more than any call of "
                "this gguf-trainer GUI sends; it is not read (the GUI takes paths, never "
                "uploads)")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for key, value in scope.get("headers") or []:
            if key.lower() == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0  # the server refuses a malformed one; counted below anyway
                if declared > self.max_bytes:
                    return await _refuse(scope, send, self.sentence(), 413)
        received, cut, started = 0, False, False

        async def limited_receive():
            nonlocal received, cut
            if cut:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    cut = True
                    if not started:
                        await _refuse(scope, send, self.sentence(), 413)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message):
            nonlocal started
            if cut:
                return  # 413 already answered: what the app makes of the cut is not sent
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, limited_receive, guarded_send)


async def _refuse(scope, send, sentence: str, status: int = 403) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    body = (sentence + "\n").encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def share_hosts(app) -> Iterable[str]:
    """The share link's host once Gradio's tunnel has set it (Blocks.share_url)."""
    blocks = getattr(app, "blocks", None)
    url = getattr(blocks, "share_url", None)
    name = hostname(url) if isinstance(url, str) else None
    return (name,) if name else ()


def lifespan(allowed: frozenset[str], share: bool = False, inner: Iterable = (),
             max_body: int = MAX_BODY_BYTES):
    """A FastAPI lifespan that puts HostGuard outermost, then BodyLimit (`max_body`: 413),
    then the `inner` middleware (the token check, ui/gui_token.py: a refused Host is 403
    before a missing token is 401), and rebuilds the middleware stack. It runs once at
    server start, before the first request is accepted."""
    from starlette.middleware import Middleware

    @contextlib.asynccontextmanager
    async def _lifespan(app):
        more = (lambda: share_hosts(app)) if share else tuple
        app.user_middleware[0:0] = [Middleware(HostGuard, allowed=allowed, more=more),
                                    Middleware(BodyLimit, max_bytes=max_body), *inner]
        app.middleware_stack = app.build_middleware_stack()
        yield

    return _lifespan
