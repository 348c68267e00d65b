"""The control API: every operation the CLI and the GUI perform on a project, torch-free.

The CLI's handlers and the GUI's callbacks only wrap these functions (no business rule lives
in argument parsing or in a click handler). Importing this package imports neither torch nor
transformers (tests/unit/test_import_graph.py checks it); work that needs torch runs in a
detached job process (runner.jobs), never in the caller.

Errors: a bad value, a broken file, a held lock ... raise `UserError` (one sentence naming
the thing and the fix; `NoProjectError`, a subclass, when the folder holds no project).
Functions that a GUI shows next to fields (`update_settings`) return their refusals in the
result instead of raising, so every field's message can be placed.

Every function takes the project folder `root` first (str or Path) and re-reads the files
on each call: no state is kept in memory, so any number of clients (a CLI, two browser
tabs, a restarted GUI) see the same thing.

    from gguf_trainer.runner import control
    control.new_project("~/gguf-trainer/projects/t5", "t5xxl_pixart")
    got = control.read_settings(root)                      # values + version token
    res = control.update_settings(root, {"train.lr": 1e-4}, got)
    res.conflicts  # {"train.steps": ...} when the file changed on disk since `got`
    control.start(root); control.status(root)["status"]; control.stop(root)
    control.reset_plan(root, "train").delete  # exactly what reset(root, "train") deletes

Callers use the names below from this package (`control.X`); each lives in one module by role:

* `projects`: list_packs, new_project, check_demo_folder, open_project, read_settings,
  update_settings, set_steps, field_metadata, settings_table_markdown.
* `materials`: material_statuses, start_download, link_material, untrusted_code, trust_code,
  token_status, store_token, confirm_trust.
* `runs`: preflight_run, resolve_launch, preflight, clear_stale_requests, start, JOIN_WAIT_S,
  export, stop, kill, status, wait, read_metrics, results, results_text.
* `outputs`: list_exports, read_eval, list_snapshots, request_snapshot, snapshot_job,
  wait_snapshot, start_verify, verify_job, tail_log, LOGS; reset_plan, reset.
* `kept`: list_kept_steps, delete_kept_step, kept_plan (data.kept_steps).
* `publishing`: publish_plan, publish (the adapter and its model card to the Hub).
* `helpers`: check_folder_arg, read_tail, TAIL_MAX_BYTES, PathLike, and the private helpers
  the modules above share.

A module calls its siblings' functions directly (`start` calls `runs.preflight_run`), so a
test that replaces a function for those inner calls patches it on the module that calls it,
not on this package. The modules import downward only: helpers ← runs ← projects; materials
and outputs on helpers alone.
"""

from __future__ import annotations

from gguf_trainer.runner.control.helpers import (
    TAIL_MAX_BYTES,
    PathLike,
    check_folder_arg,
    read_tail,
)
from gguf_trainer.runner.control.kept import delete_kept_step, kept_plan, list_kept_steps
from gguf_trainer.runner.control.materials import (
    confirm_trust,
    link_material,
    material_statuses,
    start_download,
    store_token,
    token_status,
    trust_code,
    untrusted_code,
)
from gguf_trainer.runner.control.outputs import (
    LOGS,
    list_exports,
    list_snapshots,
    read_eval,
    request_snapshot,
    reset,
    reset_plan,
    snapshot_job,
    start_verify,
    tail_log,
    verify_job,
    wait_snapshot,
)
from gguf_trainer.runner.control.projects import (
    check_demo_folder,
    field_metadata,
    list_packs,
    new_project,
    open_project,
    read_settings,
    set_steps,
    settings_table_markdown,
    update_settings,
)
from gguf_trainer.runner.control.publishing import publish, publish_plan
from gguf_trainer.runner.control.runs import (
    JOIN_WAIT_S,
    clear_stale_requests,
    export,
    kill,
    preflight,
    preflight_run,
    read_metrics,
    resolve_launch,
    results,
    results_text,
    start,
    status,
    stop,
    wait,
)

__all__ = [
    "JOIN_WAIT_S",
    "LOGS",
    "TAIL_MAX_BYTES",
    "PathLike",
    "check_demo_folder",
    "check_folder_arg",
    "clear_stale_requests",
    "confirm_trust",
    "delete_kept_step",
    "export",
    "field_metadata",
    "kept_plan",
    "kill",
    "link_material",
    "list_exports",
    "list_kept_steps",
    "list_packs",
    "list_snapshots",
    "material_statuses",
    "new_project",
    "open_project",
    "preflight",
    "preflight_run",
    "publish",
    "publish_plan",
    "read_eval",
    "read_metrics",
    "read_settings",
    "read_tail",
    "request_snapshot",
    "reset",
    "reset_plan",
    "resolve_launch",
    "results",
    "results_text",
    "set_steps",
    "settings_table_markdown",
    "snapshot_job",
    "start",
    "start_download",
    "start_verify",
    "status",
    "stop",
    "store_token",
    "tail_log",
    "token_status",
    "trust_code",
    "untrusted_code",
    "update_settings",
    "verify_job",
    "wait",
    "wait_snapshot",
]
