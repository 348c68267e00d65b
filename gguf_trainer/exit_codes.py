"""The exit-code protocol shared by the CLI and the pipeline process (README, "Exit codes").

| code | meaning |
| --- | --- |
| 0 | ok: done, stopped on request, or nothing to do |
| 1 | user error: a bad value or usage, a broken project.json, a refused input, already running, or the run failed on one |
| 2 | no such project (the folder has no project.json) |
| 3 | `stop`: still finishing its step when the timeout ran out |
| 4 | internal error: a bug; the traceback is in pipeline.log |
| 130 | interrupted (Ctrl-C) |

Torch-free; every module that returns or interprets an exit code imports these names.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_USER = 1
EXIT_NO_PROJECT = 2
EXIT_STILL_STOPPING = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130
