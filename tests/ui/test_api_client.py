"""gradio_client drives a demo project end to end through the GUI's API, against a real GUI
process: create, save (one invalid value refused with its message, one stale field refused by
compare-and-set), start, poll until done, eval, snapshot, set steps, reset. Also: logins
(wrong credentials refused) on top of the GUI's token, the HF token never in any response,
and the GUI's token never on its command line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error

import psutil
import pytest
from gradio_client import Client
from gui_helpers import GuiServer, demo_project, wait_for

from gguf_trainer.demo import demo_overrides

pytestmark = pytest.mark.slow
TOKEN = "hf_TESTTOKENthatmustneverleak0123456789"
SMALL = {"corpus.n_train": 96, "corpus.n_val": 16, "precompute.shard_size": 32,
         "precompute.val_shard_size": 16, "train.val_every": 10}  # a quicker demo


class Recorder:
    """A gradio_client.Client that keeps every response, to search them for the token.

    download_files=False: the client would otherwise take any {"path": ...} object in a
    response (a material, a snapshot) for a file to download (the README says so too)."""

    def __init__(self, url, **kw):
        self.client = Client(url, verbose=False, download_files=False, **kw)
        self.seen: list[str] = []

    def __call__(self, api_name, *args):
        out = self.client.predict(*args, api_name=api_name)
        self.seen.append(json.dumps(out, default=str))
        return out


@pytest.fixture(scope="module")
def token_file(gui):
    path = gui.base / "home" / ".cache" / "huggingface" / "token"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TOKEN)
    return path


def test_api_end_to_end(gui, token_file):
    env = gui.env
    src = demo_project(env, gui.base / "materials_src", steps=40)
    mats = src / "materials"
    assert gui.token not in " ".join(psutil.Process(gui.proc.pid).cmdline())
    api = Recorder(gui.url, headers=gui.headers)
    names = set(api.client.view_api(print_info=False, return_format="dict")["named_endpoints"])
    for name in (
        "create_project",
        "open_project",
        "save_settings",
        "start",
        "stop",
        "kill",
        "status",
        "set_steps",
        "snapshot",
        "export",
        "list_snapshots",
        "read_eval",
        "materials",
        "download_missing",
        "reset",
        "publish_plan",
        "publish",
    ):
        assert f"/{name}" in names
    assert not any(n.startswith(("/do_", "/lambda")) for n in names)  # UI events are not API

    root = str(gui.base / "projects" / "api_demo")
    view = api("/create_project", root, "t5xxl_pixart", "")
    assert view["ok"] and view["root"] == root and view["pack"]["id"] == "t5xxl_pixart"

    changes = dict(demo_overrides("t5xxl_pixart", mats / "demo_prompts.txt", 20))
    changes.update(SMALL)
    changes.update(
        {
            "materials.student.path": str(mats / "pig_clip-tiny-f16.gguf"),
            "materials.student_tokenizer.path": str(mats / "pig-clip-tokenizer"),
            "export.output_dir": str(gui.base / "projects" / "api_out"),
        }
    )
    res = api("/save_settings", root, changes, view["settings"])
    assert res["ok"], res["message"]

    # one invalid value: refused with the message, nothing written
    before = (gui.base / "projects" / "api_demo" / "project.json").read_bytes()
    view = api("/open_project", root)
    res = api("/save_settings", root, {"train.width": 100, "train.lr": 0.001}, view["settings"])
    assert not res["ok"] and "multiple of 64" in res["errors"]["train.width"] and not res["applied"]
    assert (gui.base / "projects" / "api_demo" / "project.json").read_bytes() == before

    # one stale field: changed on disk by the CLI after the page read it
    view = api("/open_project", root)
    cli = subprocess.run(
        [sys.executable, "-m", "gguf_trainer.cli", "set", "--project", root, "--steps", "30"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    res = api("/save_settings", root, {"train.steps": 25, "train.lr": 0.003}, view["settings"])
    assert not res["ok"] and res["conflicts"]["train.steps"]["disk"] == 30
    assert res["applied"] == {"train.lr": 0.003}
    now = api("/open_project", root)["settings"]
    assert now["train"]["steps"] == 30 and now["train"]["lr"] == 0.003

    started = api("/start", root, None, False)
    assert started["pid"] > 0
    info = wait_for(
        lambda: (s := api("/status", root))["status"] in ("done", "failed", "interrupted") and s,
        240,
        "the run to end",
        every_s=1.0,
    )
    assert info["status"] == "done", info["message"]
    assert info["mock"] is True and info["step"] == 30

    ev = api("/read_eval", root)
    assert ev["mock"] is True and ev["trained_steps"] == 30 and 0 < ev["val_cos"] <= 1

    job = api("/snapshot", root, "best", False)
    assert job["status"] in ("running", "done")
    wait_for(
        lambda: (
            ((api("/status", root).get("jobs") or {}).get("snapshot") or {}).get("status")
            in ("done", "failed")
        ),
        120,
        "the snapshot job",
    )
    snaps = api("/list_snapshots", root)
    assert len(snaps) == 1 and snaps[0]["checkpoint"] == "best" and snaps[0]["step"] <= 30

    steps = api("/set_steps", root, "60")
    assert steps["steps"] == 60 and "60" in steps["message"]

    plan = api("/reset_plan", root, "train")
    assert any(p.endswith("checkpoints") for p in plan["delete"]) and plan["blocked"] is None
    done = api("/reset", root, "train")
    assert sorted(done["deleted"]) == sorted(plan["delete"])
    assert not (gui.base / "projects" / "api_demo" / "checkpoints").exists()

    with pytest.raises(Exception, match="not a gguf-trainer project"):
        api("/status", str(gui.base / "nowhere"))

    assert api("/materials", root)["available"] in (True, False)
    # a demo's adapter is never published: the plan says why, and publish refuses with it
    plan = api("/publish_plan", root)
    assert plan["files"] == [] and plan["refused"]
    with pytest.raises(Exception, match=re.escape(plan["refused"][:40])):
        api("/publish", root, "me/demo-adapter", False, None, "")
    for text in api.seen:
        assert TOKEN not in text
    for extra in ("config", ""):
        with gui.get(extra) as r:
            assert TOKEN.encode() not in r.read()
    # Gradio's file route serves none of the machine's files: not the token store, not a
    # project file under the GUI's working folder
    for path in (token_file, gui.base / "projects" / "api_demo" / "project.json"):
        with pytest.raises(urllib.error.HTTPError) as err:
            gui.get(f"gradio_api/file={path}")
        assert err.value.code in (403, 404)


def _login_works(server, user, password, folder) -> None:
    """The login is on top of the token: each alone is refused, both reach the app."""
    url, headers = server.url, server.headers
    with pytest.raises(Exception, match="(?i)login|auth|401|403|credentials|unauthori"):
        Client(url, headers=headers, verbose=False).predict(folder, api_name="/status")
    with pytest.raises(Exception, match="(?i)login|auth|401|403|credentials|unauthori"):
        Client(url, auth=(user, "wrong-" + password), headers=headers, verbose=False)
    with pytest.raises(Exception, match="(?i)401|token|unauthori|credentials"):
        Client(url, auth=(user, password), verbose=False)  # the right login, no token
    client = Client(url, auth=(user, password), headers=headers, verbose=False)
    with pytest.raises(Exception, match="not a gguf-trainer project"):  # reached the app
        client.predict(folder, api_name="/status")


def test_non_loopback_host_needs_the_generated_login(gui_base):
    (gui_base / "lan").mkdir()
    server = GuiServer(gui_base / "lan", ["--host", "0.0.0.0"])
    try:
        m = re.search(r"user 'trainer', password '([^']+)'", server.log)
        assert m, server.log
        _login_works(server, "trainer", m.group(1), str(gui_base))
        assert server.log.count(m.group(1)) == 1  # printed once
    finally:
        server.stop()


def test_explicit_auth_on_loopback(gui_base):
    (gui_base / "authd").mkdir()
    server = GuiServer(gui_base / "authd", ["--auth", "ann:pa55word"])
    try:
        _login_works(server, "ann", "pa55word", str(gui_base))
        assert "pa55word" not in server.log
    finally:
        server.stop()
