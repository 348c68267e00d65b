"""Stop stops the engine (issue 29, item 8): with `ggk` a shell wrapper that runs the engine
as its child, Stop signals the render's whole process group, so the engine ends too. And the
render's `-o` is found by position: a prompt `-o` never turns the next argument into a path."""

from __future__ import annotations

import os
import time

import pytest

from gguf_trainer.runner import jobs, render_job


class _StopSoon:
    """A job handle whose check() says Stop once the engine child has written its pid."""

    def __init__(self, pid_file):
        self.pid_file = pid_file

    def check(self):
        if self.pid_file.exists() and self.pid_file.read_text().strip():
            raise jobs.JobStopped()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
        return f.read().split(") ")[-1][0] != "Z"


def test_stop_ends_the_engine_a_wrapper_started(tmp_path):
    pid_file = tmp_path / "engine.pid"
    wrapper = tmp_path / "ggk"
    # the engine ignores SIGTERM and the wrapper waits for it: only the group's end stops it
    wrapper.write_text(f"#!/bin/sh\nsh -c 'trap \"\" TERM; sleep 60' &\necho $! > {pid_file}\n"
                       "wait\n")
    wrapper.chmod(0o755)
    out = tmp_path / "render"
    out.mkdir()
    with pytest.raises(jobs.JobStopped):
        render_job._run_ggk(_StopSoon(pid_file), [str(wrapper)], str(tmp_path), out,
                            "teacher.log", None, None)
    engine = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(engine) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(engine)


def test_the_output_path_is_set_by_position_not_by_a_prompt_o(tmp_path):
    args = tmp_path / "args"
    fake = tmp_path / "ggk"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {args}\ntouch "$6"\n')
    fake.chmod(0o755)
    out = tmp_path / "render"
    out.mkdir()

    class _Never:
        def check(self):
            pass

    argv = [str(fake), "-p", "-o", "-s", "42", "-o", "adapter.png"]
    render_job._run_ggk(_Never(), argv, str(tmp_path), out, "a.log", None, out / "adapter.png",
                        (5,))
    assert args.read_text().split("\n")[:6] == ["-p", "-o", "-s", "42", "-o",
                                                str(out / "adapter.png")]
