"""GUI test helpers: an isolated home, a demo project, and a real GUI server process.

The server is `python -m gguf_trainer.cli --no-browser --port N` in a fresh interpreter
with HOME, GGUF_TRAINER_HOME, GGUF_TRAINER_PROJECTS and HF_HOME pointing into a tmp folder:
nothing touches the real home, and the GUI process is exactly what users run. Its token is
the tests' GGUF_TRAINER_TOKEN (tests/conftest.py): `server.headers` for gradio_client and
urllib, `server.cookie()` for a browser context.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from waiting import PATIENCE, wait_for  # noqa: F401  (the ui tests import wait_for from here)

CHROMIUM = os.environ.get("GGUF_TRAINER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu"]
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def isolated_env(base: Path) -> dict:
    env = dict(os.environ)
    home = base / "home"
    for d in (home, base / "gt_home", base / "projects"):
        d.mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(home),
        GGUF_TRAINER_HOME=str(base / "gt_home"),
        GGUF_TRAINER_PROJECTS=str(base / "projects"),
        HF_HOME=str(home / ".cache" / "huggingface"),
        GRADIO_ANALYTICS_ENABLED="False",
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="2",
    )
    for key in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "GGUF_TRAINER_MOCK_TEACHER",
        "GGUF_TRAINER_MATERIALS",
    ):
        env.pop(key, None)
    pypath = [str(REPO), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env["PYTHONPATH"] = os.pathsep.join(pypath)
    return env


class GuiServer:
    """A GUI process; `url`, `env`, `token`, `headers`, `log` (its output so far), `stop()`."""

    def __init__(self, base: Path, extra_args: list[str] | None = None, env: dict | None = None):
        self.base = base
        self.env = env or isolated_env(base)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.token = self.env.setdefault("GGUF_TRAINER_TOKEN", os.environ["GGUF_TRAINER_TOKEN"])
        self.headers = {"Authorization": f"Bearer {self.token}"}
        self.log_path = base / f"gui-{self.port}.log"
        with open(self.log_path, "wb") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gguf_trainer.cli",
                    "--no-browser",
                    "--port",
                    str(self.port),
                    *(extra_args or []),
                ],
                cwd=base,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait_up()

    def _wait_up(self, timeout_s: float = 300.0) -> None:
        # a bound on a hang, not on speed: at a load of ~25 the GUI's imports alone took 90 s
        timeout_s *= PATIENCE
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the GUI exited with {self.proc.returncode}:\n{self.log}")
            try:
                with urllib.request.urlopen(self.url + "config", timeout=2):
                    return
            except urllib.error.HTTPError:
                return  # up, but wants a login
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"the GUI did not come up in {timeout_s}s:\n{self.log}")

    def cookie(self) -> dict:
        """The token's cookie, as a browser holds it after opening the printed address."""
        from gguf_trainer.ui import gui_token

        return {"name": gui_token.cookie_name(self.port), "value": self.token, "url": self.url}

    def get(self, path: str = "", timeout: float = 10):
        """urlopen of the GUI's `path` with the token."""
        req = urllib.request.Request(self.url + path, headers=self.headers)
        return urllib.request.urlopen(req, timeout=timeout)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def demo_project(env: dict, dest: Path, steps: int) -> Path:
    """`gguf-trainer demo --no-run` in the isolated env (mock teacher, tiny student)."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gguf_trainer.cli",
            "demo",
            "--dir",
            str(dest),
            "--steps",
            str(steps),
            "--no-run",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600 * PATIENCE,  # a hang bound (the demo's preparation imports torch)
        check=False,
    )
    assert res.returncode == 0, res.stderr + res.stdout
    return dest


