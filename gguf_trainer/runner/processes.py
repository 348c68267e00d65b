"""Child processes of the tool: their environment, detached launches, verified signals.

The pipeline, the background jobs and the launcher are all started and signalled through
here, below every module that starts one (supervisor, jobs, launch), so none of them needs
another to do it. Must not: import torch, or signal a pid it has not just matched to its
start time (pids are reused).

    proc = spawn_detached(argv, log_path, cwd, exit_path)   # a new session, output to the log
    signal_verified(pid, start_time, signal.SIGTERM)        # False when that process is gone
"""

from __future__ import annotations

import datetime
import errno
import os
import shlex
import signal
import site
import subprocess
import sys
import threading
from pathlib import Path

import gguf_trainer
from gguf_trainer.base import locks, project_file
from gguf_trainer.base.errors import UserError

MONITOR_MODULE = "gguf_trainer.runner.supervisor"  # records how a detached job ended
# Every log line the tool's processes write (pipeline.log, the rank logs, the job logs).
LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def child_env() -> dict:
    """The environment of a child python process of the tool (the pipeline, a job, the
    launcher): ours, unbuffered, and able to import this very package."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    # A source checkout works without `pip install`: the child finds this very package.
    # Never for an installed package: site-packages on PYTHONPATH would go before the
    # standard library and let a stray backport shadow it.
    pkg_parent = str(Path(gguf_trainer.__file__).resolve().parent.parent)
    site_dirs = {str(Path(p).resolve()) for p in [*site.getsitepackages(),
                                                   site.getusersitepackages()]}
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if pkg_parent not in parts and pkg_parent not in site_dirs:
        env["PYTHONPATH"] = os.pathsep.join([pkg_parent, *parts])
    return env


def spawn_detached(argv: list[str], log_path: Path, cwd: Path, exit_path: Path | None = None,
                   extra_env: dict | None = None) -> subprocess.Popen:
    """Start `argv` in a new session, stdin /dev/null, output appended to `log_path`.

    A banner "===== launch <time>: <cmd>" goes to the log first. With `exit_path`, the job
    runs under the monitor, which appends {pid, returncode, signal, ...} to that file when
    the job ends. Never a shell; never os.fork. The returned Popen is the monitor (or the
    job); a daemon thread reaps it so long-lived clients (the GUI) collect no zombies, so
    read `returncode` rather than calling poll().
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = list(argv)
    if exit_path is not None:
        cmd = [sys.executable, "-m", MONITOR_MODULE, "monitor", "--exit-file", str(exit_path),
               "--", *cmd]
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    with project_file.open_append(log_path.parent, log_path) as out:  # never through a link
        out.write(f"===== launch {stamp}: {shlex.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                close_fds=True, env={**child_env(), **(extra_env or {})})
    threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
    return proc


def signal_verified(pid: int, start_time: float, sig: int) -> bool:
    """Send `sig` to `pid` only if it is still the process that started at `start_time`.

    Uses a pidfd where the kernel has one: the check and the signal then address the same
    process even if the pid is recycled in between. False if that process is gone.
    """
    pidfd = None
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError as e:  # ENOSYS: kernel < 5.3; fall back to check-then-kill
        if e.errno != errno.ENOSYS:
            raise
    try:
        if not locks.is_same_process(pid, start_time):
            return False
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError as e:
        raise UserError(f"cannot signal pid {pid}: it belongs to another user") from e
    finally:
        if pidfd is not None:
            os.close(pidfd)
