"""The CLI edge: exit codes, one-line outputs, and that the light commands stay light.

In-process except the two fresh-interpreter import checks (a subprocess is the only way
to see what an import pulls in)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from gguf_trainer import cli
from gguf_trainer.base import atomic, locks
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import control, downloads, lock, state, supervisor
from gguf_trainer.ui import launch as gui_launch

STATUS_KEYS = {"status", "message", "pid", "stage", "stages", "step", "steps", "val_cos",
               "best_val_cos", "error", "mock", "heartbeat", "heartbeat_age_s",
               "progress_time", "started", "finished", "exit_code", "project", "last_pid"}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv(supervisor.HOME_ENV, str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(autouse=True)
def served(monkeypatch):
    """Bare `gguf-trainer` serves the GUI: record the launch instead of serving."""
    calls = []
    monkeypatch.setattr(gui_launch, "serve", lambda opts: calls.append(opts) or 0)
    return calls


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "project.json").write_text('{"pack": "t5xxl_pixart"}')
    return root


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_the_commands_and_auto_resume(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    for word in ("new", "run", "start", "stop", "kill", "status", "set", "snapshot", "reset",
                 "inspect", "demo", "--auto-resume", "--version"):
        assert word in out


def test_bare_command_opens_the_gui(capsys, served):
    code, _, _ = run_cli(capsys, "--no-browser", "--port", "8700")
    assert code == 0 and len(served) == 1
    assert (served[0].port, served[0].open_browser, served[0].host) == (8700, False, "127.0.0.1")


def test_version(capsys):
    code, out, _ = run_cli(capsys, "--version")
    assert code == 0 and out.strip().startswith("gguf-trainer ")


def test_usage_error_is_exit_1(capsys):
    code, _, err = run_cli(capsys, "status")  # --project missing
    assert code == 1 and "--project" in err
    assert run_cli(capsys, "run", "--project", "x", "--only", "nope")[0] == 1


def test_no_such_project_is_exit_2(capsys, tmp_path):
    for argv in (["status"], ["stop"], ["kill"], ["start"]):
        code, out, err = run_cli(capsys, *argv, "--project", str(tmp_path / "missing"))
        assert code == 2 and "not a gguf-trainer project" in err and out == ""
        assert "Traceback" not in err


def test_status_idle_text_and_json(capsys, project):
    code, out, _ = run_cli(capsys, "status", "--project", str(project))
    assert code == 0 and "idle" in out
    code, out, _ = run_cli(capsys, "status", "--project", str(project), "--json")
    info = json.loads(out)
    assert code == 0 and STATUS_KEYS <= set(info) and info["status"] == "idle"


def test_status_text_of_an_interrupted_run_says_how_to_resume(capsys, project):
    st = state.empty_state()
    st.update(status="running", pid=2**22 + 3, pid_start_time=5.0, heartbeat=time.time(),
              progress_time=time.time(), host=socket.gethostname(), stage="train",
              stages={"train": {"status": "running", "done": 5, "total": 9, "unit": "step",
                                "eta_s": 30, "loss": 0.25}})
    atomic.write_json(ProjectPaths(project).state_json, st)
    code, out, _ = run_cli(capsys, "status", "--project", str(project))
    assert code == 0
    assert "interrupted" in out and "gguf-trainer start --project" in out
    assert "train" in out and "5/9 step" in out and "loss=0.25" in out


def test_stop_and_kill_when_nothing_runs_are_ok(capsys, project):
    code, out, _ = run_cli(capsys, "stop", "--project", str(project))
    assert code == 0 and "not running" in out
    code, out, _ = run_cli(capsys, "kill", "--project", str(project))
    assert code == 0 and "not running" in out
    assert not ProjectPaths(project).stop_request.exists()


def test_stop_without_waiting_only_asks(capsys, project):
    # This process holds the lock (a "pipeline"); a stop with --timeout 0 only asks.
    with lock.hold(ProjectPaths(project)):
        code, out, _ = run_cli(capsys, "stop", "--project", str(project), "--timeout", "0")
    assert code == 0 and "stop requested" in out
    assert ProjectPaths(project).stop_request.exists()


def test_error_mapping(capsys, project, monkeypatch):
    def raiser(exc):
        def f(*a, **k):
            raise exc
        return f

    monkeypatch.setattr(supervisor, "stop", raiser(supervisor.StopTimeout("still finishing")))
    assert run_cli(capsys, "stop", "--project", str(project))[0] == 3
    monkeypatch.setattr(downloads, "check_materials", lambda *a: None)  # a bare project
    monkeypatch.setattr(supervisor, "start", raiser(locks.LockHeld(4242)))
    code, _, err = run_cli(capsys, "start", "--project", str(project))
    assert code == 1 and "already running (pid 4242)" in err and "Traceback" not in err
    monkeypatch.setattr(control, "status", raiser(KeyboardInterrupt()))
    assert run_cli(capsys, "status", "--project", str(project))[0] == 130
    monkeypatch.setattr(control, "status", raiser(UserError("a sentence.")))
    code, _, err = run_cli(capsys, "status", "--project", str(project))
    assert code == 1 and err.strip() == "error: a sentence."


def test_auto_resume_without_history(capsys, home):
    code, out, _ = run_cli(capsys, "--auto-resume")
    assert code == 0 and "auto-resume" in out and "no project" in out


def test_auto_resume_leaves_finished_projects_alone(capsys, project, served):
    supervisor.remember_project(project)
    st = state.empty_state()
    st.update(status="done", pid=1, pid_start_time=1.0)
    atomic.write_json(ProjectPaths(project).state_json, st)
    code, out, _ = run_cli(capsys, "--auto-resume")
    assert code == 0 and "is done; nothing to resume" in out
    assert served[-1].project == str(project.resolve())  # the GUI opens on it


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)


def test_cli_import_is_light():
    r = _fresh(
        "import sys, gguf_trainer.cli\n"
        "heavy = [m for m in ('torch', 'transformers', 'datasets', 'gguf') if m in sys.modules]\n"
        "assert not heavy, heavy"
    )
    assert r.returncode == 0, r.stderr


def test_status_json_is_light_in_a_fresh_interpreter(project, home):
    r = _fresh(
        "import sys, json, io, contextlib\n"
        "from gguf_trainer import cli\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        f"    code = cli.main(['status', '--project', {str(project)!r}, '--json'])\n"
        "assert code == 0, code\n"
        "json.loads(buf.getvalue())\n"
        "for argv in (['--help'], ['stop', '--project', " + repr(str(project)) + "],"
        " ['kill', '--project', " + repr(str(project)) + "]):\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        cli.main(argv)\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
    )
    assert r.returncode == 0, r.stderr


def test_inspect_on_a_language_model_says_so(capsys, tiny_materials):
    code, out, err = run_cli(capsys, "inspect", str(tiny_materials["student"]))
    assert code == 1 and "Traceback" not in err
    problems = [ln for ln in out.splitlines() if ln.strip().startswith("- ")]
    assert len(problems) == 1 and "is a language model (qwen3), not an adapter" in problems[0]


def test_demo_help_lists_the_pack_ids(capsys):
    from gguf_trainer.packs import pack_ids

    code, out, _ = run_cli(capsys, "demo", "--help")
    assert code == 0 and all(p in out for p in pack_ids())


def test_demo_refuses_a_folder_that_holds_files_but_no_project(capsys, tmp_path):
    """`demo --dir ~` once built a project inside a home folder: a non-empty folder that is
    not a project is refused with one sentence, before anything is written; the demo's own
    folder (new, empty, or already a demo project) is used and reused."""
    home = tmp_path / "someones_home"
    (home / ".config").mkdir(parents=True)
    (home / "notes.txt").write_text("mine")
    before = sorted(p.relative_to(home) for p in home.rglob("*"))
    code, out, err = run_cli(capsys, "demo", "--dir", str(home), "--no-run")
    assert code == 1 and "is not empty and holds no project" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not out
    assert sorted(p.relative_to(home) for p in home.rglob("*")) == before
    demo = tmp_path / "demo"
    demo.mkdir()  # empty: fine
    code, out, _ = run_cli(capsys, "demo", "--dir", str(demo), "--no-run", "--steps", "7")
    assert code == 0 and (demo / "project.json").is_file()
    code, out, _ = run_cli(capsys, "demo", "--dir", str(demo), "--no-run", "--steps", "9")
    assert code == 0 and "demo project ready" in out  # reused, not refused
    assert control.read_settings(demo).values["train"]["steps"] == 9


def test_status_text_says_done_earlier_for_a_stage_a_resume_skipped():
    """A stage the run found done reads as the GUI reads it ('done earlier'), not 'done
    (already done)'; a stage done in this run stays plain 'done'."""
    from gguf_trainer.cli.run import format_status

    text = format_status({"project": "/p", "status": "done", "message": "done",
                          "stages": {"corpus": {"status": "done", "skipped": True},
                                     "eval": {"status": "done"}}})
    corpus, ev = (next(ln for ln in text.splitlines() if ln.strip().startswith(s))
                  for s in ("corpus", "eval"))
    assert corpus.split() == ["corpus", "done", "earlier"] and ev.split() == ["eval", "done"]
    assert "already" not in text
