"""A detached job's target raises `gguf_trainer.runner.jobs.JobStopped` (the class it imports):
the job records "stopped", not an internal error. The job process is started as
`python -m gguf_trainer.runner.jobs`, so its `__main__` must run the imported module's
`main()`; otherwise run_job would catch only its own `__main__.JobStopped`."""

from __future__ import annotations

import textwrap

from gguf_trainer.runner import jobs

TARGET = textwrap.dedent('''
    from gguf_trainer.runner import jobs

    def stop_now(folder, job):
        job.log.info("stopping from the target")
        raise jobs.JobStopped()

    def is_imported_module(folder, job):
        return {"same": type(job) is jobs.JobHandle}
''')


def test_job_stopped_raised_by_an_importing_target_is_stopped(tmp_path, monkeypatch):
    (tmp_path / "stop_target.py").write_text(TARGET, encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    folder = tmp_path / "work"
    folder.mkdir()
    jobs.start_job(folder, "stopper", "stop_target:stop_now")
    st = jobs.wait(folder, "stopper", timeout_s=300)
    assert st["status"] == "stopped" and st["error"] == "stopped on request", st
    assert "internal error" not in jobs.log_path(folder, "stopper").read_text()

    jobs.start_job(folder, "handle", "stop_target:is_imported_module")
    st = jobs.wait(folder, "handle", timeout_s=300)
    assert st["status"] == "done" and st["result"] == {"same": True}, st
