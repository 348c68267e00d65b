"""The exit-code protocol shared by the CLI and the pipeline process (README, "Exit codes").

| code | meaning |
| --- | --- |
| 0 | ok: done, stopped on request, or nothing to do |
| 1 | user error: a bad value or usage, a broken project.json, a refused input, already running, |
|   | or the run failed on one |
| 2 | no such project (the folder has no project.json) |
| 3 | `stop`: still finishing its step when the timeout ran out |
| 4 | internal error: a bug; the traceback is in pipeline.log |
| 130 | interrupted (Ctrl-C) |

Torch-free; every module that returns or interprets an exit code imports these names.

This table, not ../shared/style.md §6 ("0 ok, 2 user error, 1 internal error"), is the
protocol: it is the one the README documents and scripts rely on (1 for anything the user can
fix, 2 only for a folder without a project, 4 for a bug, so a caller can tell "fix your input"
from "report a bug" from "wrong folder"). style.md §6 predates it and should be brought in line.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_USER = 1
EXIT_NO_PROJECT = 2
EXIT_STILL_STOPPING = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130
