"""Launching the GUI: who must log in, the security switches, the port, no torch in the GUI.

The launch itself is intercepted (`serve(..., launch=...)`): a share tunnel needs the
internet, and these checks are about what we pass to Gradio, not about Gradio.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from gguf_trainer import cli
from gguf_trainer.base.errors import UserError
from gguf_trainer.ui import launch
from gguf_trainer.ui.launch import LaunchOptions


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "gt_home"))
    monkeypatch.setenv("GGUF_TRAINER_PROJECTS", str(tmp_path / "projects"))


def intercepted(opts: LaunchOptions):
    said, launched = [], []

    def fake_launch(app, **kwargs):
        launched.append((app, kwargs))
        return 0

    assert launch.serve(opts, launch=fake_launch, say=said.append) == 0
    return said, launched[0][1]


def test_loopback_default_has_no_login_and_the_security_switches():
    said, kw = intercepted(LaunchOptions(port=_free_port(), open_browser=False))
    assert kw["server_name"] == "127.0.0.1" and kw["auth"] is None and kw["share"] is False
    assert kw["strict_cors"] is True and kw["ssr_mode"] is False and kw["run_history"] is False
    assert (
        kw["enable_monitoring"] is False and kw["allowed_paths"] == [] and kw["inbrowser"] is False
    )
    blocked = " ".join(kw["blocked_paths"])
    assert ".ssh" in blocked and "huggingface" in blocked
    assert said == []


def test_share_generates_a_password_printed_once():
    said, kw = intercepted(LaunchOptions(port=_free_port(), share=True, open_browser=False))
    user, password = kw["auth"]
    assert kw["share"] is True and user == launch.GENERATED_USER and len(password) >= 12
    assert len(said) == 1 and password in said[0] and "share link" in said[0]
    _, kw2 = intercepted(LaunchOptions(port=_free_port(), share=True, open_browser=False))
    assert kw2["auth"][1] != password  # generated per launch, never stored


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.7", "::", "myhost.example"])
def test_non_loopback_host_always_logs_in(host):
    opts = LaunchOptions(host=host, port=8655, open_browser=False)
    assert launch.needs_auth(opts)
    said = []
    user, password = launch.resolve_auth(opts, say=said.append)
    assert user == "trainer" and password in said[0]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_hosts_need_no_login(host):
    assert not launch.needs_auth(LaunchOptions(host=host))


def test_explicit_auth_is_used_and_checked():
    said, kw = intercepted(
        LaunchOptions(port=_free_port(), share=True, auth="ann:s3cret:x", open_browser=False)
    )
    assert kw["auth"] == ("ann", "s3cret:x") and said == []
    for bad in ("nopassword", ":pw", "user:"):
        with pytest.raises(UserError, match="user:password"):
            launch.parse_auth(bad)


def test_busy_port_is_one_sentence(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(UserError) as err:
            launch.check_port_free("127.0.0.1", port)
        assert (
            "\n" not in str(err.value)
            and f"port {port}" in str(err.value)
            and "--port" in str(err.value)
        )
        assert f"by pid {os.getpid()}" in str(err.value)  # the live holder is named
        assert "(python" in str(err.value)  # by its program's name, not a cut-off path
        code = cli.main(["--no-browser", "--port", str(port)])
    assert code == 1
    _, stderr = capsys.readouterr()
    assert stderr.strip().startswith("error: port") and "Traceback" not in stderr


def test_a_port_left_in_time_wait_is_free_for_a_restart():
    """Issue 24: restarting the GUI was refused for ~60 s ("already in use" with nothing
    listening): the probe bound without SO_REUSEADDR while the old connections sat in
    TIME_WAIT. The server side closes first here, so its connection is in TIME_WAIT."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # the server's end closes first: TIME_WAIT on (127.0.0.1, port)
    server.close()
    client.close()
    launch.check_port_free("127.0.0.1", port)  # no listener: free, TIME_WAIT or not


def test_cli_flags_reach_the_launch(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(launch, "serve", lambda opts: seen.append(opts) or 0)
    assert (
        cli.main(
            [
                "--no-browser",
                "--port",
                "9123",
                "--host",
                "0.0.0.0",
                "--share",
                "--auth",
                "a:b",
                "--root",
                str(tmp_path),
                "--root",
                "/srv",
            ]
        )
        == 0
    )
    o = seen[0]
    assert (o.port, o.host, o.share, o.auth, o.open_browser, o.roots) == (
        9123,
        "0.0.0.0",
        True,
        "a:b",
        False,
        [str(tmp_path), "/srv"],
    )


@pytest.mark.e2e  # a fresh interpreter importing the GUI: seconds, not the fast tier
def test_importing_and_building_the_gui_imports_no_torch():
    code = (
        "import sys; from gguf_trainer.ui.app import build_app; build_app(); "
        "import gguf_trainer.ui.launch, gguf_trainer.cli; "
        "bad = [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gradios_share_lines_become_our_sentence(capsys):
    """Issue 24: with --share and no internet, Gradio printed "set share=True in launch()"
    and the tunnel binary's manual download steps. Our sentence replaces both; other lines
    pass through."""
    opts = LaunchOptions(port=8655, share=True)
    with launch.ours_for_gradios(opts, "tok-0123456789abcdef"):
        print("* Running on local URL:  http://127.0.0.1:8655")
        print("* Running on public URL: https://abc123.gradio.live")
        print("* To create a public link, set `share=True` in `launch()`.")
        print(
            "\nCould not create share link. Missing file: /x/frpc_linux_amd64_v0.3. \n\nPlease "
            "check your internet connection. ... \n\n1. Download this file: https://cdn/frpc"
        )
        print("Keyboard interruption in main thread... closing server.")
    out = capsys.readouterr().out
    assert "share=True" not in out and "frpc" not in out
    # the local address without the token is ours, printed before with it; the public one
    # gets the token (a share link is refused without it too)
    assert "Running on local URL" not in out
    assert "https://abc123.gradio.live/?token=tok-0123456789abcdef" in out
    assert "--share could not open a public link" in out and "http://127.0.0.1:8655/ only" in out
    assert "Keyboard interruption" in out  # other lines pass through


def test_serve_prints_the_address_with_the_token_and_opens_the_browser_on_a_file(monkeypatch):
    """The real launch: the GUI answers 401 without the token and 200 with it; the printed
    address carries the token; the browser is handed an owner-only file, not the address;
    the file is gone when the GUI stops."""
    import http.client
    import stat
    from pathlib import Path
    from urllib.parse import urlsplit

    import gradio as gr

    from gguf_trainer.ui import gui_token

    token = os.environ[gui_token.TOKEN_ENV]
    port = _free_port()
    said, opened, answers = [], [], []

    def block_thread(app):  # instead of waiting for Ctrl-C: ask the running GUI, then stop
        for headers in ({}, {"Authorization": f"Bearer {token}"}):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("GET", "/config", headers=headers)
            answers.append(conn.getresponse().status)
            conn.close()
        page = Path(urlsplit(opened[0]).path)
        answers.append((stat.S_IMODE(page.stat().st_mode), page.read_text()))
        app.close()

    monkeypatch.setattr(gr.Blocks, "block_thread", block_thread)
    assert launch.serve(LaunchOptions(port=port), say=said.append, opener=opened.append) == 0
    url = f"http://127.0.0.1:{port}/?token={token}"
    assert said == [f"gguf-trainer GUI on {url} (Ctrl-C to quit; runs keep going)"]
    assert answers[:2] == [401, 200]
    mode, page = answers[2]
    assert mode == 0o600 and f"url={url}" in page
    assert len(opened) == 1 and opened[0].startswith("file://") and token not in opened[0]
    assert not Path(urlsplit(opened[0]).path).exists()
