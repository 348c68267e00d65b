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


async def _refuse(scope, send, sentence: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    body = (sentence + "\n").encode()
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def share_hosts(app) -> Iterable[str]:
    """The share link's host once Gradio's tunnel has set it (Blocks.share_url)."""
    blocks = getattr(app, "blocks", None)
    url = getattr(blocks, "share_url", None)
    name = hostname(url) if isinstance(url, str) else None
    return (name,) if name else ()


def lifespan(allowed: frozenset[str], share: bool = False):
    """A FastAPI lifespan that puts HostGuard outermost and rebuilds the middleware stack.
    It runs once at server start, before the first request is accepted."""
    from starlette.middleware import Middleware

    @contextlib.asynccontextmanager
    async def _lifespan(app):
        more = (lambda: share_hosts(app)) if share else tuple
        app.user_middleware.insert(0, Middleware(HostGuard, allowed=allowed, more=more))
        app.middleware_stack = app.build_middleware_stack()
        yield

    return _lifespan
