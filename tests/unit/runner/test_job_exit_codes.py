"""`run_job` (the detached job's process body) returns the exit-code protocol's codes:
0 done, 1 a user error, 4 an internal error (3 is `stop` still finishing, never a job's)."""

from __future__ import annotations

import signal
import textwrap

import pytest

from gguf_trainer.base.exit_codes import EXIT_INTERNAL, EXIT_OK, EXIT_USER
from gguf_trainer.runner import jobs

TARGET = textwrap.dedent('''
    from gguf_trainer.base.errors import UserError

    def ok(folder, job):
        return {"fine": True}

    def user(folder, job):
        raise UserError("set materials.teacher.path to a folder")

    def bug(folder, job):
        raise ZeroDivisionError("oops")
''')


@pytest.fixture
def target_module(tmp_path, monkeypatch):
    (tmp_path / "exit_target.py").write_text(TARGET, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    # run_job installs its own SIGTERM/SIGINT handlers: give pytest its own back afterwards
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield tmp_path
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.mark.parametrize(("func", "code", "status"), [
    ("ok", EXIT_OK, "done"), ("user", EXIT_USER, "failed"), ("bug", EXIT_INTERNAL, "failed")])
def test_run_job_exit_codes_follow_the_protocol(target_module, func, code, status):
    folder = target_module / "work"
    folder.mkdir()
    assert jobs.run_job(folder, "j", f"exit_target:{func}", "id1", {}) == code
    st = jobs.job_status(folder, "j")
    assert st["status"] == status, st
    if func == "bug":
        assert st["error"].startswith("internal error (ZeroDivisionError)"), st
    if func == "user":
        assert st["error"] == "set materials.teacher.path to a folder", st
