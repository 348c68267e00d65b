"""The GUI as a hostile web page or another local account sees it: DNS rebinding and
foreign Origins are refused (403), and so is every request without the GUI's token (401).

A real Gradio server in this process, launched with exactly the keyword arguments the GUI
uses (`launch.launch_kwargs`), on a trivial Blocks with one API endpoint: what is tested is
the Host / Origin rule and the token check in front of it (ui/host_guard.py,
ui/gui_token.py), not the tabs. Requests are sent with http.client so the Host, Origin,
Cookie and Authorization headers are whatever a browser or a script would send.
"""

from __future__ import annotations

import http.client
import json
import os
import stat
from pathlib import Path
from urllib.parse import urlsplit

import gradio as gr
import pytest
from gradio_client import Client
from gui_helpers import free_port

from gguf_trainer.base.errors import UserError
from gguf_trainer.ui import gui_token, host_guard, launch
from gguf_trainer.ui.launch import LaunchOptions

CALLS: list[str] = []
TOKEN = os.environ["GGUF_TRAINER_TOKEN"]  # tests/conftest.py
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def _echo(text: str) -> str:
    CALLS.append(text)
    return text


@pytest.fixture(scope="module")
def server():
    port = free_port()
    opts = LaunchOptions(port=port, open_browser=False, allow_hosts=["proxy.example"])
    with gr.Blocks() as app:
        gr.api(_echo, api_name="echo")
    kwargs = launch.launch_kwargs(opts, None, TOKEN)
    app.launch(prevent_thread_lock=True, **kwargs)
    yield port
    app.close()


def post(port: int, host: str, origin: str | None = None, auth: dict | None = None,
         path: str = "/gradio_api/call/echo") -> tuple[int, dict, str]:
    """POST to the echo endpoint; `auth` headers default to the token's Bearer."""
    headers = {"Host": host, "Content-Type": "application/json", **(BEARER if auth is None
                                                                     else auth)}
    if origin:
        headers["Origin"] = origin
    return request(port, "POST", path, headers, json.dumps({"data": ["hi"]}))


def request(port: int, method: str, path: str, headers: dict,
            body: str | None = None) -> tuple[int, dict, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body=body, headers=headers)
    res = conn.getresponse()
    out = res.status, {k.lower(): v for k, v in res.getheaders()}, res.read().decode()
    conn.close()
    return out


def test_a_rebound_host_is_refused_and_its_origin_never_reflected(server):
    calls = len(CALLS)
    status, headers, body = post(server, f"rebind.example:{server}", "http://rebind.example")
    assert status == 403
    assert "access-control-allow-origin" not in headers
    assert "does not answer to host 'rebind.example" in body and "--allow-host" in body
    assert len(CALLS) == calls


def test_a_foreign_origin_on_the_loopback_host_is_refused(server):
    status, headers, body = post(server, f"127.0.0.1:{server}", "http://evil.example")
    assert status == 403 and "access-control-allow-origin" not in headers
    assert "evil.example" in body


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "proxy.example"])
def test_the_names_it_was_started_for_are_answered(server, host):
    status, headers, _body = post(server, f"{host}:{server}", f"http://{host}:{server}")
    assert status == 200
    assert headers.get("access-control-allow-origin") == f"http://{host}:{server}"


def test_no_origin_from_a_script_client_is_fine(server):
    assert post(server, f"localhost:{server}")[0] == 200


def test_allowed_names_follow_the_launch():
    assert host_guard.allowed_hosts("127.0.0.1") == {"127.0.0.1", "localhost", "::1"}
    lan = host_guard.allowed_hosts("192.168.7.9", ["Trainer.Example:443"])
    assert {"192.168.7.9", "trainer.example", "localhost"} <= lan and "rebind.example" not in lan
    anywhere = host_guard.allowed_hosts("0.0.0.0")
    assert host_guard.machine_names() <= anywhere and "rebind.example" not in anywhere


def test_allow_host_flag_reaches_the_launch(monkeypatch):
    from gguf_trainer import cli

    seen = {}
    monkeypatch.setattr(launch, "serve", lambda opts: seen.setdefault("opts", opts) and 0)
    cli.main(["--no-browser", "--port", "1", "--allow-host", "a.example",
              "--allow-host", "b.example"])
    assert seen["opts"].allow_hosts == ["a.example", "b.example"]


# ---- the token (issue 29 item 9) -------------------------------------------------------------
def test_without_the_token_it_is_401_and_nothing_runs(server):
    calls = len(CALLS)
    for auth in ({}, {"Authorization": "Bearer wrong-token-0123456789"},
                 {"Authorization": f"Basic {TOKEN}"},
                 {"Cookie": f"{gui_token.cookie_name(server)}=wrong-token-0123456789"},
                 {"Cookie": f"gguf-trainer-token-1={TOKEN}"}):  # another port's cookie
        status, headers, body = post(server, f"127.0.0.1:{server}", auth=auth)
        assert status == 401, auth
        assert headers["www-authenticate"] == gui_token.REALM
        assert "needs its token" in body and "access-control-allow-origin" not in headers
    status, _h, _b = request(server, "GET", "/config", {"Host": f"127.0.0.1:{server}"})
    assert status == 401
    status, _h, _b = request(server, "GET", f"/?token=wrong-{TOKEN}",
                             {"Host": f"127.0.0.1:{server}"})
    assert status == 401
    assert len(CALLS) == calls


def test_a_refused_host_is_403_before_the_token_is_asked(server):
    status, _h, body = post(server, f"rebind.example:{server}", auth={})
    assert status == 403 and "does not answer to host" in body


def test_bearer_proves_the_token(server):
    status, _h, _b = post(server, f"127.0.0.1:{server}")
    assert status == 200  # queued (the call itself runs when its stream is read)
    assert request(server, "GET", "/config", {"Host": f"localhost:{server}", **BEARER})[0] == 200


def test_the_token_in_the_address_sets_the_cookie_and_redirects(server):
    host = {"Host": f"127.0.0.1:{server}"}
    status, headers, _b = request(server, "GET", f"/?project=%2Ftmp%2Fa%20b&token={TOKEN}", host)
    assert status == 303
    assert headers["location"] == "./?project=%2Ftmp%2Fa%20b"  # the same address, no token
    assert TOKEN not in headers["location"]
    cookie = headers["set-cookie"]
    assert cookie.startswith(f"{gui_token.cookie_name(server)}={TOKEN};")
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Path=/" in cookie
    assert request(server, "GET", f"/config?token={TOKEN}", host)[1]["location"] == "./config"
    jar = {"Cookie": f"other=1; {cookie.split(';')[0]}"}
    assert request(server, "GET", "/config", {**host, **jar})[0] == 200
    assert post(server, f"127.0.0.1:{server}", auth=jar)[0] == 200


def test_gradio_client_with_the_bearer_header(server):
    url = f"http://127.0.0.1:{server}/"
    client = Client(url, headers=BEARER, verbose=False)
    assert client.predict("hello", api_name="/echo") == "hello"
    with pytest.raises(Exception, match="(?i)401|unauthori|token|credentials"):
        Client(url, verbose=False)


def test_the_token_file_is_made_once_owner_only_and_reused(tmp_path, monkeypatch):
    monkeypatch.delenv(gui_token.TOKEN_ENV)
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "home"))
    first = gui_token.gui_token()
    path = tmp_path / "home" / "gui-token"
    assert path.read_text().strip() == first and len(first) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert gui_token.gui_token() == first  # reused, not remade
    assert [p.name for p in path.parent.iterdir()] == ["gui-token"]  # no temp file left
    monkeypatch.setenv(gui_token.TOKEN_ENV, "from-the-environment-123")
    assert gui_token.gui_token() == "from-the-environment-123"  # the environment wins
    assert path.read_text().strip() == first
    monkeypatch.setenv(gui_token.TOKEN_ENV, "short")
    with pytest.raises(UserError, match="GGUF_TRAINER_TOKEN must be"):
        gui_token.gui_token()


def test_a_token_file_others_could_read_or_a_link_is_replaced(tmp_path, monkeypatch):
    monkeypatch.delenv(gui_token.TOKEN_ENV)
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path))
    path = tmp_path / "gui-token"
    path.write_text("readable-by-everyone-0123456789\n")
    path.chmod(0o644)
    token = gui_token.gui_token()
    assert token != "readable-by-everyone-0123456789"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("a-file-somewhere-else-0123456789\n")
    elsewhere.chmod(0o600)
    path.symlink_to(elsewhere)
    token = gui_token.gui_token()
    assert not path.is_symlink() and path.read_text().strip() == token
    assert elsewhere.read_text() == "a-file-somewhere-else-0123456789\n"  # never followed
    path.unlink()
    path.mkdir()
    with pytest.raises(UserError, match="is a folder"):
        gui_token.gui_token()


def test_the_browser_opens_an_owner_only_file_never_the_token(tmp_path, monkeypatch):
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path))
    opened = []
    url = gui_token.with_token("http://127.0.0.1:8655/", TOKEN)
    path = gui_token.open_in_browser(url, 8655, opener=opened.append)
    assert opened == [path.as_uri()] and TOKEN not in opened[0]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.parent == tmp_path
    assert f'url={url}"' in path.read_text()


def test_launch_hands_gradio_no_browser_and_the_token_check(server):
    kw = launch.launch_kwargs(LaunchOptions(port=8655), None, TOKEN)
    assert kw["inbrowser"] is False  # Gradio would open the address on a command line


def test_a_second_launch_opens_the_running_gui_with_its_token(server, tmp_path, monkeypatch):
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path))
    said, opened = [], []
    opts = LaunchOptions(port=server, project="/tmp/p q")
    assert launch.serve(opts, say=said.append, opener=opened.append) == 0
    assert len(said) == 1 and TOKEN in said[0]
    assert said[0].startswith(f"gguf-trainer is already open at http://127.0.0.1:{server}/; ")
    assert len(opened) == 1 and TOKEN not in opened[0]
    page = Path(urlsplit(opened[0]).path).read_text()
    assert f"project=%2Ftmp%2Fp%20q&amp;token={TOKEN}" in page
    assert gui_token.probe("127.0.0.1", server, TOKEN) == "ours"
    monkeypatch.setenv(gui_token.TOKEN_ENV, "another-token-0123456789")
    with pytest.raises(UserError, match="another token"):
        launch.serve(LaunchOptions(port=server), say=said.append, opener=opened.append)
    assert len(opened) == 1


# ---- the request-size limit (issue 29 item 7) ----------------------------------------------------
def raw_request(port: int, head: str, chunks=()) -> tuple[int, str]:
    """Send `head` (request line and headers) then each of `chunks` on a raw socket, stopping
    when the server hangs up; the status and body of its answer."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head.encode() + b"\r\n")
        try:
            for chunk in chunks:
                s.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the rest was read
        data = b""
        try:
            while part := s.recv(65536):
                data += part
                if b"\r\n\r\n" in data and b"over" in data:
                    break
        except (ConnectionResetError, TimeoutError):
            pass
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[-1].decode(errors="replace")


def test_a_body_declared_over_the_bound_is_413_before_it_is_read(server):
    calls = len(CALLS)
    # 256 MB declared, not one byte sent: a reply at all proves nothing waited for the body
    status, body = raw_request(server, (
        f"POST /gradio_api/call/echo HTTP/1.1\r\nHost: 127.0.0.1:{server}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Length: {256 << 20}\r\n"))
    assert status == 413 and "is over 4,194,304 bytes" in body and "\n" not in body.strip()
    assert len(CALLS) == calls


def test_a_streamed_body_is_cut_at_the_bound(server):
    calls = len(CALLS)
    piece = b"x" * (1 << 20)
    chunk = b"%x\r\n" % len(piece) + piece + b"\r\n"
    status, body = raw_request(server, (
        f"POST /gradio_api/call/echo HTTP/1.1\r\nHost: 127.0.0.1:{server}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n"), [chunk] * 8 + [b"0\r\n\r\n"])
    assert status == 413 and "is over 4,194,304 bytes" in body
    assert len(CALLS) == calls
    assert post(server, f"127.0.0.1:{server}")[0] == 200  # an ordinary call still runs


def test_the_body_limit_never_hands_the_app_more_than_the_bound():
    import asyncio

    seen, sent = [], []

    async def app(scope, receive, send):  # reads the whole body, as a route would
        while (message := await receive())["type"] == "http.request":
            seen.append(len(message["body"]))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    messages = iter([{"type": "http.request", "body": b"x" * 600, "more_body": True}] * 10)

    async def receive():
        return next(messages)

    async def send(message):
        sent.append(message)

    guard = host_guard.BodyLimit(app, max_bytes=1000)
    asyncio.run(guard({"type": "http", "headers": []}, receive, send))
    assert sum(seen) <= 1000 and sent[0]["status"] == 413 and len(sent) == 2
