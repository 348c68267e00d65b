"""Serving the GUI: address, port, authentication, browser, Gradio's security switches.

Owns the rules for exposing the app: loopback by default; every request proves the GUI's
token, on loopback too (ui/gui_token.py: GGUF_TRAINER_TOKEN, else ~/.gguf-trainer/gui-token);
`--share` (Gradio's tunnel) and any non-loopback `--host` also with a login (`--auth
user:pass`, else a generated password printed once); strict CORS on, SSR off, run history
off, monitoring off; the SSH folder and the Hugging Face token store blocked. The browser is
opened on an owner-only redirect file, never with the token on its command line; a second
launch on a port where this GUI already runs opens that one. Must not import torch (the GUI
process never does) nor build components (app.py does).

    opts = LaunchOptions(port=8655, share=False)
    serve(opts)                              # blocks until Ctrl-C
    launch_kwargs(opts, auth=..., token=...) # what goes to Blocks.launch (tests intercept it)
"""

from __future__ import annotations

import contextlib
import errno
import io
import ipaddress
import os
import re
import secrets
import socket
import sys
import webbrowser
from dataclasses import dataclass, field

import psutil

from gguf_trainer.base.errors import UserError
from gguf_trainer.ui import files, gui_token, host_guard

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


def local_url(opts: LaunchOptions) -> str:
    """The address this machine opens the GUI by (an any-address bind: loopback)."""
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(opts.host, opts.host)
    return f"http://[{host}]:{opts.port}/" if ":" in host else f"http://{host}:{opts.port}/"


def address(opts: LaunchOptions, token: str, **params: str) -> str:
    """local_url with `?token=` (which sets the cookie and redirects to the bare address)."""
    return gui_token.with_token(local_url(opts), token, **params)


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
        # the program and its first arguments by their names (a venv's long paths would
        # otherwise cut the name off): "python gguf-trainer gui"
        what = " ".join(os.path.basename(a) if os.sep in a else a
                        for a in psutil.Process(pid).cmdline()[:4])[:160]
    except psutil.Error:  # it ended in between, or belongs to another user
        what = ""
    return f" by pid {pid}" + (f" ({what})" if what else "")


def launch_kwargs(opts: LaunchOptions, auth: tuple[str, str] | None, token: str) -> dict:
    """Everything passed to Blocks.launch (the security switches live here, in one place).
    The browser is not Gradio's to open (it would put the address on a command line)."""
    from starlette.middleware import Middleware

    return {
        "server_name": opts.host,
        "server_port": opts.port,
        "share": opts.share,
        "auth": auth,
        "auth_message": "gguf-trainer: log in with the user and password given at launch"
        if auth
        else None,
        "inbrowser": False,
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
        "js": _toast_js(),
        # DNS rebinding: only the Host names this GUI was started for (ui/host_guard.py, 403),
        # then the token (ui/gui_token.py, 401)
        "app_kwargs": {
            "lifespan": host_guard.lifespan(
                host_guard.allowed_hosts(opts.host, opts.allow_hosts), share=opts.share,
                inner=[Middleware(gui_token.TokenGuard, token=token, port=opts.port)],
            )
        },
    }


def _css() -> str:
    from gguf_trainer.ui.app import CSS

    return CSS


def _toast_js() -> str:
    from gguf_trainer.ui.app import TOAST_JS

    return TOAST_JS


def serve(opts: LaunchOptions, launch=None, say=print, opener=webbrowser.open) -> int:
    """Build the app and serve it until Ctrl-C. `launch(app, **kwargs)` replaces
    `app.launch` in tests (the tunnel needs the internet); `opener(file_url)` opens the
    browser. A port where this GUI already runs is opened instead (0)."""
    token = gui_token.gui_token()
    try:
        check_port_free(opts.host, opts.port)
    except UserError:
        if already_open(opts, token, say, opener):
            return 0
        raise
    auth = resolve_auth(opts, say)
    # Gradio reads these at import time in places; set them before it is imported.
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from gguf_trainer.ui.app import build_app

    app = build_app(roots=opts.roots, project=opts.project)
    kwargs = launch_kwargs(opts, auth, token)
    if launch is not None:
        return launch(app, **kwargs)
    say(f"gguf-trainer GUI on {address(opts, token)} (Ctrl-C to quit; runs keep going)")
    opened = None
    try:
        with ours_for_gradios(opts, token):
            app.launch(prevent_thread_lock=True, **kwargs)
            if opts.open_browser:
                try:
                    opened = gui_token.open_in_browser(address(opts, token), opts.port, opener)
                except UserError as e:  # no browser then; the address is printed above
                    say(f"could not open the browser: {e}")
            app.block_thread()
    except KeyboardInterrupt:
        pass
    except OSError as e:  # lost a race for the port between the check and the bind
        raise UserError(
            f"cannot serve on {opts.host}:{opts.port}: {e}; pick another --port"
        ) from None
    finally:
        if opened is not None:
            with contextlib.suppress(OSError):
                opened.unlink()
        sys.stdout.flush()
    return 0


def already_open(opts: LaunchOptions, token: str, say=print, opener=webbrowser.open) -> bool:
    """The second launch: when this GUI already listens on the port and takes our token,
    open it (on `opts.project`, if any) and say so; True then. Another GUI's token is one
    sentence; anything else on the port is the caller's "port in use"."""
    host = local_url(opts).split("//", 1)[1].rsplit(":", 1)[0].strip("[]")
    found = gui_token.probe(host, opts.port, token)
    if found == "other token":
        raise UserError(f"port {opts.port} on {opts.host} is held by a gguf-trainer GUI started "
                        "with another token; open it by the address it printed (it ends in "
                        "?token=…), or pick another --port")
    if found != "ours":
        return False
    url = address(opts, token, **({"project": str(opts.project)} if opts.project else {}))
    here = local_url(opts)
    if opts.open_browser:
        say(f"gguf-trainer is already open at {here}; opening it in the browser with its "
            f"token ({url})")
        gui_token.open_in_browser(url, opts.port, opener)
    else:
        say(f"gguf-trainer is already open at {here}; open it with its token: {url}")
    return True


class _OurWords(io.TextIOBase):
    """stdout while Gradio launches: its lines about share links (written for Python users
    of `launch()`) become ours, its local address is ours (with the token, printed before),
    its public address gets the token; everything else passes through unchanged."""

    def __init__(self, out, opts: LaunchOptions, token: str | None = None):
        self.out, self.opts, self.token = out, opts, token

    def write(self, text: str) -> int:
        if "set `share=True` in `launch()`" in text or "Running on local URL" in text:
            return len(text)  # our own first line already says where the GUI is
        if "Running on public URL" in text and self.token:
            def tokened(m):
                return gui_token.with_token(m.group(1) + "/", self.token)

            return self.out.write(re.sub(r"(https?://[^\s/]+)/?", tokened, text, count=1))
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
def ours_for_gradios(opts: LaunchOptions, token: str | None = None):
    """Replace Gradio's share-link messages on stdout with our sentence (see _OurWords)."""
    real = sys.stdout
    sys.stdout = _OurWords(real, opts, token)
    try:
        yield
    finally:
        sys.stdout = real


# ---- the command line (cli/gui.py adds these to the top-level parser) ---------------------
def add_arguments(parser) -> None:
    """The GUI's options on bare `gguf-trainer` (and `--auto-resume`)."""
    g = parser.add_argument_group(
        "GUI (bare gguf-trainer opens it)",
        "Every request proves the GUI's token, on this machine too: GGUF_TRAINER_TOKEN when "
        "set, else the one kept in ~/.gguf-trainer/gui-token. The launch prints the address "
        "with it (…/?token=…); scripts send 'Authorization: Bearer <token>'.")
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
        "address requires a login as well as the token)",
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
