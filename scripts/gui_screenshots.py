"""Regenerate the README's GUI screenshots (gui-setup.png, gui-train.png, gui-hardware.png,
gui-logs.png, gui-output.png) from a real demo run, as a user sees it: the PixArt demo trained
with its tiny real teacher (no MOCK) in a plain home folder, then the GUI opened on it.

    python scripts/gui_screenshots.py --home /home/you --out .

`--home` becomes HOME for the demo and the GUI, so the paths on screen read like a user's
(`/home/you/gguf-trainer/projects/demo`); it is created if missing and may be thrown away
after. Needs Chromium (`apt-get install -y chromium`) and the `playwright` package (the test
extras). Takes a few minutes on 2 cores (the demo trains to the end first).
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

CHROMIUM = os.environ.get("GGUF_TRAINER_CHROMIUM", "/usr/bin/chromium")
TABS = {"Setup": "gui-setup.png", "Train": "gui-train.png", "Hardware": "gui-hardware.png",
        "Logs": "gui-logs.png", "Output": "gui-output.png"}


def user_env(home: Path, token: str) -> dict:
    env = dict(os.environ)
    for key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "GGUF_TRAINER_MOCK_TEACHER",
                "GGUF_TRAINER_MATERIALS", "GGUF_TRAINER_HOME", "GGUF_TRAINER_PROJECTS", "HF_HOME"):
        env.pop(key, None)
    env.update(HOME=str(home), GGUF_TRAINER_TOKEN=token, GRADIO_ANALYTICS_ENABLED="False",
               HF_HUB_OFFLINE="1")
    return env


def wait(predicate, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.5)
    sys.exit(f"timed out after {seconds:.0f} s waiting for {what}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", type=Path, required=True, help="HOME for the demo and the GUI")
    ap.add_argument("--out", type=Path, default=Path("."), help="where the PNGs go")
    ap.add_argument("--port", type=int, default=8761)
    args = ap.parse_args()
    home = args.home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(16)
    env = user_env(home, token)
    project = home / "gguf-trainer" / "projects" / "demo"
    if not (project / "eval.json").is_file():
        subprocess.run([sys.executable, "-m", "gguf_trainer.cli", "demo", "--dir", str(project)],
                       env=env, cwd=home, check=True)
    url = f"http://127.0.0.1:{args.port}/"
    gui = subprocess.Popen([sys.executable, "-m", "gguf_trainer.cli", "--no-browser", "--port",
                            str(args.port)], env=env, cwd=home, stdout=subprocess.DEVNULL,
                           stderr=subprocess.STDOUT)
    try:
        def up():
            try:
                urllib.request.urlopen(url + "config", timeout=2)
            except urllib.error.HTTPError:
                return True  # up, asking for the token
            except OSError:
                return False
            return True

        wait(up, 120, "the GUI")
        shoot(url, args.port, token, project, args.out.resolve())
    finally:
        gui.terminate()
        gui.wait(15)


def shoot(url: str, port: int, token: str, project: Path, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    from gguf_trainer.ui import gui_token

    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM,
                                     args=["--headless", "--no-sandbox", "--disable-gpu"])
        ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
        ctx.add_cookies([{"name": gui_token.cookie_name(port), "value": token, "url": url}])
        pg = ctx.new_page()
        pg.set_default_timeout(120_000)
        pg.goto(f"{url}?project={project}")
        wait(lambda: str(project) in pg.locator("#header").inner_text(), 120, "the project")
        for name, png in TABS.items():
            pg.get_by_role("tab", name=name).click()
            if name == "Hardware":
                wait(lambda: "CUDA available" in pg.locator("#hw-text").inner_text(), 180,
                     "torch's facts")
            if name == "Train":
                wait(lambda: pg.locator("#cos-plot .mark-line path").count() > 0, 120,
                     "the chart")
            if name == "Output":
                wait(lambda: "--llm-adapter" in pg.locator("#ggk-command textarea").input_value(),
                     60, "the ggk command")
            pg.wait_for_timeout(2000)  # let charts and tables finish drawing
            pg.screenshot(path=str(out / png), full_page=True)
            print(f"wrote {out / png}")
        browser.close()


if __name__ == "__main__":
    main()
