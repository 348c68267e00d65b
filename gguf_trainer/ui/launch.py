"""Serving the GUI: address, port, authentication, browser, Gradio's security switches.

Owns the rules for exposing the app: loopback by default; `--share` (Gradio's tunnel) and
any non-loopback `--host` always with authentication (`--auth user:pass`, else a generated
password printed once); strict CORS on, SSR off, run history off, monitoring off; the SSH
folder and the Hugging Face token store blocked. Must not import torch (the GUI process
never does) nor build components (app.py does).

    opts = LaunchOptions(port=8655, share=False)
    serve(opts)                      # blocks until Ctrl-C
    launch_kwargs(opts, auth=...)    # what goes to Blocks.launch (tests intercept it)
"""

from __future__ import annotations

import contextlib
import errno
import io
import ipaddress
import os
import secrets
import socket
import sys
from dataclasses import dataclass, field

import psutil

from gguf_trainer.base.errors import UserError
from gguf_trainer.ui import files, host_guard

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8655
GENERATED_USER = "trainer"


@dataclass
class LaunchOptions:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    share: bool = False
    auth: str | None = None  # "user:pass"
    open_browser: bool = True
    roots: list[str] = field(default_factory=list)  # --root DIR (repeatable)
    project: str | None = None  # the project to open first (auto-resume)
    allow_hosts: list[str] = field(default_factory=list)  # --allow-host NAME (repeatable)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost: may resolve to anything


def needs_auth(opts: LaunchOptions) -> bool:
    return opts.share or not is_loopback(opts.host)


def parse_auth(text: str) -> tuple[str, str]:
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise UserError(f"--auth must be user:password (both non-empty), not {text!r}")
    return user, password


def resolve_auth(opts: LaunchOptions, say=print) -> tuple[str, str] | None:
    """The (user, password) to require, or None on a loopback-only launch without --auth.

    A generated password is printed once, here, and kept nowhere else.
    """
    if opts.auth:
        return parse_auth(opts.auth)
    if not needs_auth(opts):
        return None
    password = secrets.token_urlsafe(12)
    where = "the share link" if opts.share else f"http://{opts.host}:{opts.port}/"
    say(f"{where} needs a login: user {GENERATED_USER!r}, password {password!r} "
        "(generated for this session; pass --auth user:pass to choose your own)")
    return GENERATED_USER, password


def check_port_free(host: str, port: int) -> None:
    """One sentence instead of a traceback when the port is taken."""
    if not 1 <= port <= 65535:
        raise UserError(f"--port must be between 1 and 65535, not {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # As the server binds (uvicorn sets it too): connections of a GUI that just quit sit
        # in TIME_WAIT for ~60 s and must not block a restart; a live listener still does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                raise UserError(f"port {port} on {host} is already in use{port_holder(port)}; "
                                "pick another with --port N") from None
            raise UserError(f"cannot listen on {host}:{port}: {e.strerror}; check --host") from None


def port_holder(port: int) -> str:
    """The words naming the process listening on `port` (" by pid N (its command)"), or the
    old guess when the system does not say (another user's process, no right to list sockets)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):  # e.g. macOS without root: no socket table
        conns = []
    pids = {c.pid for c in conns if c.laddr and c.laddr.port == port
            and c.status == psutil.CONN_LISTEN and c.pid}
    if not pids:
        return " (is gguf-trainer already open?)"
    pid = min(pids)
    try:
        what = " ".join(psutil.Process(pid).cmdline()[:4])[:80]
    except psutil.Error:  # it ended in between, or belongs to another user
        what = ""
    return f" by pid {pid}" + (f" ({what})" if what else "")


def launch_kwargs(opts: LaunchOptions, auth: tuple[str, str] | None) -> dict:
    """Everything passed to Blocks.launch (the security switches live here, in one place)."""
    return {
        "server_name": opts.host,
        "server_port": opts.port,
        "share": opts.share,
        "auth": auth,
        "auth_message": "gguf-trainer: log in with the user and password given at launch"
        if auth
        else None,
        "inbrowser": opts.open_browser,
        "strict_cors": True,
        "ssr_mode": False,
        "run_history": False,
        "enable_monitoring": False,
        "mcp_server": False,
        "pwa": False,
        "allowed_paths": [],
        "blocked_paths": files.blocked_paths(),
        "max_file_size": "1mb",
        "show_error": False,
        "quiet": False,
        "footer_links": ["api", "gradio"],
        "css": _css(),
        # DNS rebinding: only the Host names this GUI was started for (ui/host_guard.py)
        "app_kwargs": {
            "lifespan": host_guard.lifespan(
                host_guard.allowed_hosts(opts.host, opts.allow_hosts), share=opts.share
            )
        },
    }


def _css() -> str:
    from gguf_trainer.ui.app import CSS

    return CSS


def serve(opts: LaunchOptions, launch=None, say=print) -> int:
    """Build the app and serve it until Ctrl-C. `launch(app, **kwargs)` replaces
    `app.launch` in tests (the tunnel needs the internet)."""
    check_port_free(opts.host, opts.port)
    auth = resolve_auth(opts, say)
    # Gradio reads these at import time in places; set them before it is imported.
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from gguf_trainer.ui.app import build_app

    app = build_app(roots=opts.roots, project=opts.project)
    kwargs = launch_kwargs(opts, auth)
    if launch is not None:
        return launch(app, **kwargs)
    say(f"gguf-trainer GUI on http://{opts.host}:{opts.port}/ (Ctrl-C to quit; runs keep going)")
    try:
        with ours_for_gradios(opts):
            app.launch(**kwargs)
    except KeyboardInterrupt:
        pass
    except OSError as e:  # lost a race for the port between the check and the bind
        raise UserError(
            f"cannot serve on {opts.host}:{opts.port}: {e}; pick another --port"
        ) from None
    finally:
        sys.stdout.flush()
    return 0


class _OurWords(io.TextIOBase):
    """stdout while Gradio launches: its lines about share links (written for Python users
    of `launch()`) become ours; everything else passes through unchanged."""

    def __init__(self, out, opts: LaunchOptions):
        self.out, self.opts = out, opts

    def write(self, text: str) -> int:
        if "set `share=True` in `launch()`" in text:
            return len(text)  # our own first line already says where the GUI is
        if "Could not create share link" in text:  # with the tunnel binary's download steps
            self.out.write(
                f"--share could not open a public link: the tunnel needs the internet "
                f"(gradio.live), and it was not reachable from here. The GUI runs on "
                f"http://{self.opts.host}:{self.opts.port}/ only; reach it through an "
                "SSH tunnel (ssh -L) or start it with --host 0.0.0.0 on a trusted "
                "network.\n"
            )
            return len(text)
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()

    # what loggers and terminals ask of stdout: the real stream's answers
    def fileno(self) -> int:
        return self.out.fileno()

    def isatty(self) -> bool:
        return self.out.isatty()

    @property
    def encoding(self) -> str:
        return getattr(self.out, "encoding", "utf-8")


@contextlib.contextmanager
def ours_for_gradios(opts: LaunchOptions):
    """Replace Gradio's share-link messages on stdout with our sentence (see _OurWords)."""
    real = sys.stdout
    sys.stdout = _OurWords(real, opts)
    try:
        yield
    finally:
        sys.stdout = real


# ---- the command line (cli/gui.py adds these to the top-level parser) ---------------------
def add_arguments(parser) -> None:
    """The GUI's options on bare `gguf-trainer` (and `--auto-resume`)."""
    g = parser.add_argument_group("GUI (bare gguf-trainer opens it)")
    g.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    g.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        metavar="N",
        help=f"port to serve on (default {DEFAULT_PORT})",
    )
    g.add_argument(
        "--host",
        default=DEFAULT_HOST,
        metavar="ADDR",
        help=f"address to listen on (default {DEFAULT_HOST}, this machine only; any other "
        "address requires a login)",
    )
    g.add_argument(
        "--share",
        action="store_true",
        help="also serve through a public Gradio share link (for a remote "
        "GPU box; requires a login)",
    )
    g.add_argument(
        "--auth",
        metavar="USER:PASS",
        help="require this login (default with --share or a non-loopback --host: user "
        f"{GENERATED_USER!r} and a generated password, printed once)",
    )
    g.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests addressed to this host name (e.g. the name a "
        "reverse proxy forwards; repeatable). Other names are refused, so a web "
        "page cannot reach the GUI through DNS rebinding",
    )
    g.add_argument(
        "--root",
        action="append",
        default=[],
        metavar="DIR",
        help="an extra folder the file browser may show (repeatable)",
    )


def run_from_args(args) -> int:
    """Bare `gguf-trainer [--auto-resume]`: serve the GUI (on the last project after an
    auto-resume, which cli.main has already attempted)."""
    project = None
    if getattr(args, "auto_resume", False):
        from gguf_trainer.ui import recent

        project = recent.last()
    opts = LaunchOptions(
        host=args.host,
        port=args.port,
        share=args.share,
        auth=args.auth,
        open_browser=not args.no_browser,
        roots=list(args.root or []),
        project=project,
        allow_hosts=list(getattr(args, "allow_host", None) or []),
    )
    return serve(opts)
