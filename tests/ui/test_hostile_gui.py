"""The GUI as a hostile web page sees it: DNS rebinding and foreign Origins are refused.

A real Gradio server in this process, launched with exactly the keyword arguments the GUI
uses (`launch.launch_kwargs`), on a trivial Blocks with one API endpoint: what is tested is
the Host / Origin rule in front of it (ui/host_guard.py), not the tabs. Requests are sent
with http.client so the Host and Origin headers are whatever a browser on a rebinding page
would send.
"""

from __future__ import annotations

import http.client
import json

import gradio as gr
import pytest
from gui_helpers import free_port

from gguf_trainer.ui import host_guard, launch
from gguf_trainer.ui.launch import LaunchOptions

CALLS: list[str] = []


def _echo(text: str) -> str:
    CALLS.append(text)
    return text


@pytest.fixture(scope="module")
def server():
    port = free_port()
    opts = LaunchOptions(port=port, open_browser=False, allow_hosts=["proxy.example"])
    with gr.Blocks() as app:
        gr.api(_echo, api_name="echo")
    kwargs = launch.launch_kwargs(opts, None)
    app.launch(prevent_thread_lock=True, **kwargs)
    yield port
    app.close()


def post(port: int, host: str, origin: str | None = None) -> tuple[int, dict, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Host": host, "Content-Type": "application/json"}
    if origin:
        headers["Origin"] = origin
    conn.request("POST", "/gradio_api/call/echo", body=json.dumps({"data": ["hi"]}),
                 headers=headers)
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
