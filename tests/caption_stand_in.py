"""A stand-in OpenAI-compatible chat endpoint on loopback, for the caption client's error paths
and the corpus's bookkeeping (tests/caption_server/ runs a real server with a real model).

It serves `GET /v1/models` and `POST /v1/chat/completions`, records every body it is sent, and
answers as `mode` says: "ok" (a caption made from the request: "detailed caption N of <user
text>"), "500", "malformed" (bytes that are not JSON), "shape" (JSON with no choices),
"context" (llama.cpp's 400 for a prompt past the context), "empty" (an empty caption).

    with stand_in() as server:
        server.url   # http://127.0.0.1:PORT/v1
        server.mode = "500"
"""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StandIn:
    def __init__(self, model: str = "stand-in-model") -> None:
        self.model = model
        self.mode = "ok"
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        self.gate: threading.Event | None = None  # when set: each answer waits for it
        self.url = ""

    def prompts(self) -> list[str]:
        """The user text of every chat request received, in order."""
        out = []
        for b in self.bodies:
            content = b["messages"][1]["content"]
            out.append(content if isinstance(content, str) else content[-1]["text"])
        return out


def _handler(server: StandIn):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _send(self, code: int, payload: bytes, ctype="application/json"):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self):
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [
                    {"id": server.model, "object": "model"}]}).encode())
            else:
                self._send(404, b'{"detail": "Not Found"}')

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with server.lock:
                server.bodies.append(body)
                n = len(server.bodies)
            if server.gate is not None:
                server.gate.wait(30)
            mode = server.mode
            if self.path != "/v1/chat/completions":
                return self._send(404, b'{"detail": "Not Found"}')
            if mode == "500":
                return self._send(500, b'{"error": {"message": "the model crashed", "code": 500}}')
            if mode == "context":
                return self._send(400, json.dumps({"error": {"code": 400, "message": (
                    "the request exceeds the available context size, try increasing it"),
                    "type": "exceed_context_size_error"}}).encode())
            if mode == "malformed":
                return self._send(200, b"<html>not json at all")
            if mode == "shape":
                return self._send(200, b'{"object": "chat.completion", "choices": []}')
            user = body["messages"][1]["content"]
            text = user if isinstance(user, str) else user[-1]["text"]
            caption = "" if mode == "empty" else f"detailed caption {n} of <{text}>"
            self._send(200, json.dumps({
                "object": "chat.completion", "model": server.model,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": caption}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107},
            }).encode())

    return Handler


@contextlib.contextmanager
def stand_in(model: str = "stand-in-model"):
    server = StandIn(model)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    httpd.daemon_threads = True
    server.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        if server.gate is not None:
            server.gate.set()
        httpd.shutdown()
        httpd.server_close()
