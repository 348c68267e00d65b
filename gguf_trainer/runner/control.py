"""The control API: every operation the CLI and the GUI perform on a project, torch-free.

The CLI's handlers and the GUI's callbacks only wrap these functions (no business rule lives
in argument parsing or in a click handler). Importing this module imports neither torch nor
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
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gguf_trainer import atomic, locks, places, project_file
from gguf_trainer.errors import NoProjectError, UserError, quote
from gguf_trainer.paths import PROJECT_JSON, ProjectPaths
from gguf_trainer.runner import capacity, lock, supervisor
from gguf_trainer.runner import status as status_mod
from gguf_trainer.runner.stages import env_wants_mock
from gguf_trainer.runner.views import (
    ProjectView,
    ResetPlan,
    ResetResult,
    RunPlan,
    SettingsRead,
    StepsResult,
    UpdateResult,
)
from gguf_trainer.stage_list import EVALUATING, EXPORTING, TRAINING, stages_from

PathLike = str | os.PathLike
LOGS = ("pipeline", "snapshot", "download")
TAIL_MAX_BYTES = 256 * 1024


# ---- packs and projects ---------------------------------------------------------------
def list_packs() -> list[dict]:
    """Every registered pack: {id, title, description, default_name, adapter_kind,
    materials, ...} (TrainerPack.describe())."""
    from gguf_trainer.packs import get_pack, pack_ids

    return [get_pack(pid).describe() for pid in pack_ids()]


def new_project(root: PathLike, pack_id: str, name: str | None = None,
                overrides: dict[str, Any] | None = None) -> ProjectView:
    """Create a project folder with a project.json for `pack_id` (schema defaults, then the
    pack's, then `overrides` as dotted keys). Refuses an existing project, an unknown pack,
    a bad name, a folder that is a file, or one that already holds files but no project
    (a later reset would then clear that folder's own data/, shards/ ...), before writing
    anything."""
    from gguf_trainer import project

    path = _root(root)
    if not (path / PROJECT_JSON).exists():
        _refuse_foreign_folder(path, "a project", f"gguf-trainer new --pack {pack_id} "
                               f"{path / 'gguf_project'}")
    project.create_project(path, pack_id, name, overrides)
    return open_project(root)


def check_demo_folder(root: PathLike) -> None:
    """`demo --dir`: refuse a folder that holds files but no project, so the demo never
    builds its materials and project.json inside someone's own folder (it was run on a home
    folder). Accepted: a folder that does not exist yet, an empty one, an existing project
    (the demo reuses it), and one holding only the `materials` folder a demo set-up that was
    cut short before writing project.json leaves behind."""
    path = _root(root)
    if (path / PROJECT_JSON).exists():
        return
    _refuse_foreign_folder(path, "the demo", f"--dir {path / 'gguf_demo'}", {"materials"})


def _refuse_foreign_folder(path: Path, what: str, example: str,
                           allowed: set[str] = frozenset()) -> None:
    """A folder that does not exist yet or is empty (but for `allowed` names) may become a
    project; one holding someone's files may not: the tool would mix its data/, shards/ and
    checkpoints/ with theirs, and a reset would delete them."""
    if not path.exists():
        return
    if not path.is_dir():
        raise UserError(f"{path} is a file, not a folder; choose a new folder for {what}.")
    try:
        names = {p.name for p in path.iterdir()}
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror}); choose a folder you can write to "
                        f"for {what}.") from None
    if names <= allowed:
        return
    raise UserError(f"{path} is not empty and holds no project, so {what} will not be made "
                    f"inside it; choose a new or empty folder (e.g. {example}).")


def open_project(root: PathLike) -> ProjectView:
    """The project's settings, pack description, status and errors. A broken project.json
    (not JSON, bad values) is reported in `errors` with ok=False, never as "idle".
    NoProjectError when the folder holds no project.json."""
    from gguf_trainer import project, project_schema
    from gguf_trainer.packs import get_pack

    paths = _paths(root)
    errors: list[str] = []
    raw = None
    version = None
    settings = None
    pack = None
    try:
        raw, version = project.read_settings_versioned(paths)  # paths absolute, where it is
        settings = project_schema.validate_settings(raw, str(paths.project_json)).model_dump(
            mode="json")
    except NoProjectError:
        raise
    except UserError as e:
        errors.append(str(e))
    pack_id = (settings or (raw if isinstance(raw, dict) else {}) or {}).get("pack")
    if isinstance(pack_id, str):
        try:
            pack = get_pack(pack_id).describe()
        except UserError:
            pack = None
    return ProjectView(root=str(paths.root), ok=not errors, settings=settings or raw,
                       version=version, pack=pack, errors=errors, status=status(paths.root))


def read_settings(root: PathLike) -> SettingsRead:
    """Validated settings (every key, defaults filled) and the version token.
    UserError when project.json is broken (the sentence says what to fix)."""
    from gguf_trainer import project, project_schema

    paths = _paths(root)
    raw, version = project.read_settings_versioned(paths)  # paths absolute, where it is
    values = project_schema.validate_settings(raw, str(paths.project_json)).model_dump(mode="json")
    return SettingsRead(values=values, version=version)


def update_settings(root: PathLike, changes: dict[str, Any],
                    expected: SettingsRead | dict | None) -> UpdateResult:
    """Compare-and-set of dotted-key `changes` (e.g. {"train.lr": 1e-4}).

    Under the project's settings lock (the pipeline's own writes take it too): re-read
    project.json; a changed field whose value on disk differs from `expected` (what the
    caller read: a SettingsRead, its as_dict() or its `values`) is a conflict, not written; a field
    whose change would invalidate a live run's outputs is refused with the reason; invalid
    values are reported per field and then nothing is written. The other fields are
    written atomically. `expected=None` skips the conflict check (the CLI's `set`).
    """
    from gguf_trainer import project

    paths = _paths(root)
    live = _live_run(paths)
    base = expected.values if isinstance(expected, SettingsRead) else expected
    if isinstance(base, dict) and isinstance(base.get("values"), dict) and "version" in base:
        base = base["values"]  # a SettingsRead that travelled as JSON (gradio_client)
    out = project.compare_and_set(paths, changes, base, live_run=live)
    return UpdateResult(**out)


def set_steps(root: PathLike, steps: Any, wait_s: float = 0.0) -> StepsResult:
    """Set `train.steps` (also while running: the trainer re-reads it every `log_every`
    steps). `steps` may be text ("12_000", "40k"). With wait_s > 0 and a live training
    stage, waits up to wait_s for the run to report the new count (`picked_up`)."""
    from gguf_trainer import project, project_schema

    paths = _paths(root)
    value = project_schema.parse_steps(steps)
    project.update_settings(paths.root, {"train.steps": value})
    info = status(paths.root)
    live = supervisor.is_active(info)
    picked = live and _wait_steps_seen(paths, value, wait_s)
    log_every = project.load_project(paths.root).settings.train.log_every
    if live and info.get("stage") not in stages_from(TRAINING)[1:]:  # not past training yet
        hint = (
            "the running pipeline picked it up"
            if picked
            else f"the running pipeline picks it up within {log_every} steps (log_every)"
        )
    elif live:
        hint = "training has already ended in this run; start again to train further"
    else:
        hint = f"`gguf-trainer start --project {paths.root}` continues from the last checkpoint"
    return StepsResult(
        steps=value, live=live, picked_up=picked, message=f"train.steps = {value}; {hint}"
    )


def field_metadata(pack_id: str | None = None) -> list[dict]:
    """Per-field GUI metadata for every setting, the pack's declarations over the schema's:
    [{"key": "train.lr", "section": "Training", "label": "Learning rate", "help": ...,
      "type": "float"|"int"|"bool"|"str"|"path"|"choice"|"list", "default": ...,
      "min": ..., "max": ..., "choices": [...], "live": bool (may change while running),
      "advanced": bool}], in display order. `pack_id` None: the schema's alone."""
    from gguf_trainer import project_schema

    return project_schema.field_metadata(pack_id)


def settings_table_markdown() -> str:
    """The README's table of every project.json key (generated from the schema)."""
    from gguf_trainer import project_schema

    return project_schema.settings_table_markdown()


# ---- materials, downloads, teacher code trust, the Hugging Face token -------------------
# The CLI and the GUI reach these through here only (the GUI never looks modules up by name).
def material_statuses(root: PathLike, online: bool = False) -> list[dict]:
    """Each material's status: [{id, title, state (missing|partial|downloading|ready|failed),
    bytes_done, bytes_total, rate_bps, eta_s, path, required, error, ...}]."""
    from gguf_trainer.runner import downloads

    return downloads.material_statuses(_root(root), online=online)


def start_download(root: PathLike, ids: list[str] | None = None) -> list[dict]:
    """Detached downloads of the missing materials (or of `ids`); one already downloading is
    reported, never started twice: [{id, action, pid, message}]."""
    from gguf_trainer.runner import downloads

    return downloads.start_download(_root(root), list(ids) if ids else None)


def link_material(root: PathLike, material_id: str, path: PathLike) -> dict:
    """Use a complete copy at `path` for a material (checked first; a GGUF for the student):
    the material's status row after."""
    from gguf_trainer.runner import downloads

    return downloads.link_material(_root(root), material_id, path)


def untrusted_code(root: PathLike) -> list[dict]:
    """The project's ready snapshots whose own Python code is not trusted (yet, or since it
    changed): trust_status of each with its material `title`."""
    from gguf_trainer.teachers import trust

    out = []
    for m in material_statuses(root):
        path = m.get("path")
        if (
            m.get("kind") == "hf_snapshot"
            and m.get("state") == "ready"
            and path
            and Path(path).is_dir()
        ):
            st = trust.trust_status(path)
            if not st["trusted"]:
                out.append({**st, "title": m.get("title") or m["id"]})
    return out


def trust_code(root: PathLike) -> list[str]:
    """The user trusts every untrusted snapshot's code of the project as it is now (the GUI's
    button); the folders trusted."""
    from gguf_trainer.teachers import trust

    return [trust.confirm_trust(it["path"])["path"] for it in untrusted_code(root)]


def token_status() -> str:
    """One line on the Hugging Face token (stored, HF_TOKEN, or none); never the token."""
    from gguf_trainer import hub

    return hub.token_status()


def store_token(token: str) -> str:
    """Store a Hugging Face token where huggingface_hub reads it (0600); the status line."""
    from gguf_trainer import hub

    return hub.store_token(token)


def confirm_trust(root: PathLike) -> str:
    """`--trust-remote-code` on run/start/download: confirm the project's teacher code as it
    is now and say what was trusted, in one line (torch-free: the CLI calls it)."""
    from gguf_trainer import materials, project

    proj = project.load_project(_paths(root).root)
    st = materials.confirm_project_trust(proj)
    if st is None:
        return (
            f"--trust-remote-code: nothing to trust ({proj.pack.title} runs no teacher code "
            "of its own here, or its teacher is not downloaded yet)"
        )
    return (
        f"trusted the teacher code in {st['path']} ({len(st['files'])} .py files, sha256 "
        f"{st['code_hash'][:12]}); a change to it will ask again"
    )


# ---- runs -----------------------------------------------------------------------------
def start(
    root: PathLike,
    only: list[str] | None = None,
    force: bool = False,
    steps: Any = None,
    launch=None,
) -> int:
    """Launch the pipeline detached; returns the pipeline's pid once it holds the lock.
    `steps` (optional) is stored first. Refused (UserError) while it runs, when
    project.json is broken, when another project in the same output folder has the same
    name, or when the materials are missing (with the path tried and the fix)."""
    paths = _paths(root)
    plan = preflight_run(paths.root, only, steps, launch)  # every check before any write
    steps, launch = plan.steps, plan.launch
    if not launch.is_main_machine:
        raise UserError(
            "start runs machine rank 0 (it holds the project); on the other "
            "machines use `gguf-trainer run` with the same flags."
        )
    if steps is not None:
        _set_steps_idle(paths, steps)
    # Several machines: rank 0 starts only once every machine has joined the rendezvous.
    wait = {"wait_s": JOIN_WAIT_S} if launch.several_machines else {}
    return supervisor.start(paths.root, only=only, force=force, launch=launch, **wait)


JOIN_WAIT_S = 600.0  # how long `start` on machine 0 waits for the other machines


def preflight_run(root: PathLike, only: list[str] | None = None, steps: Any = None,
                  launch=None) -> RunPlan:
    """The pre-flight sequence of every run — `run` (alone or launched), `start`, the GUI's
    Start — in one order: the steps parsed, the launch resolved (flags, processes, capacity),
    then on the machine that holds the project (machine rank 0) `preflight`'s project checks.
    Writes nothing but the material links and a stale stop request cleared; the caller then
    stores the steps and starts."""
    from gguf_trainer.project_schema import parse_steps

    steps = None if steps is None else parse_steps(steps)
    launch = resolve_launch(root, launch)
    linked = preflight(root, only=only) if launch.is_main_machine else []
    return RunPlan(steps=steps, launch=launch, linked=linked)


def resolve_launch(root: PathLike, launch=None):
    """The launch of a run (runner.launch.Launch): the flags given, the processes per
    machine from precompute.processes / train.processes when no flag says."""
    from gguf_trainer import project
    from gguf_trainer.runner.launch import Launch

    proj = project.load_project(_paths(root).root)
    launch = (launch or Launch()).resolved(proj.settings)
    launch.check()
    if launch.needed() and launch.config_file is None:  # a config file says it all itself
        mock = proj.settings.precompute.mock_teacher or env_wants_mock()
        flag = "precompute.processes / train.processes" if launch.per_stage else "--processes"
        capacity.check_processes(launch.processes or 1, capacity.read_capacity(proj, mock), flag)
    return launch


def export(root: PathLike, evaluate: bool = True) -> int:
    """Re-export (and re-evaluate) from best.pt in a detached pipeline: `start --only export
    eval --force`. Works after the teacher folder was deleted (fingerprints come from the
    recorded manifests). Returns the pid."""
    return start(root, only=[EXPORTING, EVALUATING] if evaluate else [EXPORTING], force=True)


def read_metrics(root: PathLike, offset: int = 0) -> tuple[list[dict], int]:
    """metrics.jsonl rows appended since byte `offset` and the next offset (see
    runner.state.read_metrics: a row whose step is <= one already held means a resume
    truncated the file; drop held rows from that step on)."""
    from gguf_trainer.runner.state import read_metrics as _read

    try:
        offset = max(0, int(offset))
    except (TypeError, ValueError):
        offset = 0
    return _read(_paths(root), offset)


def preflight(root: PathLike, only: list[str] | None = None) -> list[str]:
    """The checks `start` and `run` make before anything is written or launched: a valid
    project.json, the run not already live, no name clash in the output folder, the
    materials present (missing ones linked first to a copy discovery finds), and a stale stop
    request cleared. Raises UserError with the sentence; returns a line per material linked."""
    from gguf_trainer import project

    paths = _paths(root)
    proj = project.load_project(paths.root)
    holder = lock.probe(paths)
    if holder is not None:
        raise locks.LockHeld(holder)
    project.check_name_clash(proj)
    from gguf_trainer.runner import downloads

    linked = downloads.check_materials(proj, only)
    clear_stale_requests(paths.root)
    return linked


def clear_stale_requests(root: PathLike) -> list[str]:
    """Remove a stop request left by a `stop` that timed out or a `kill` (nobody holds the
    lock, so nobody will answer it): the next start must not stop at once. Returns what
    was removed. Never touches a live run's requests."""
    paths = _paths(root)
    if lock.probe(paths) is not None:
        return []
    removed = []
    for p in (paths.stop_request, paths.snapshot_request):
        try:
            p.unlink()
            removed.append(str(p))
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            raise UserError(f"{p} is a folder; remove it (the tool writes a file there).") from None
    return removed


def stop(root: PathLike, timeout_s: float = supervisor.STOP_TIMEOUT_S) -> str:
    """Graceful stop: "stopped" | "stopping" (timeout_s 0: do not wait) | "not running".
    Raises supervisor.StopTimeout when it is still finishing after timeout_s."""
    return supervisor.stop(_paths(root).root, timeout_s=timeout_s)


def kill(root: PathLike) -> str:
    """SIGKILL the verified pipeline and its children: "killed" | "not running"."""
    return supervisor.kill(_paths(root).root)


def status(root: PathLike) -> dict:
    """The `gguf-trainer status --json` dict (see runner.status.derive_status): status,
    message, pid, stage, stages, step, steps, val_cos, error, mock, settings_error (a broken
    project.json), jobs ({"snapshot": job state, ...}), results (where the GGUF, eval.json
    and ggk command are once exported), stopping (a stop was requested and the run is still
    alive: show "stopping…" until it has ended). Never raises for any content of the tool's
    files."""
    paths = _paths(root)
    info = status_mod.derive_status(paths)
    # stop.request outlives a run that was killed (clear_stale_requests removes it at the
    # next start), so it only means "stopping" while the run is alive.
    try:
        requested = paths.stop_request.is_file()
    except OSError:
        requested = False
    info["stopping"] = supervisor.is_active(info) and requested
    return info


def wait(root: PathLike, timeout_s: float | None = None) -> dict:
    """Block until the pipeline is not running/stalled (or timeout); the last status."""
    return supervisor.wait(_paths(root).root, timeout_s=timeout_s)


def results(root: PathLike) -> dict:
    """Where the outputs are: {"gguf": path or None (exists), "eval_json": path or None,
    "ggk": pasteable command or None, "notes": [sentences], "mock": bool}."""
    from gguf_trainer.results import describe_results

    return describe_results(_paths(root).root)


def results_text(root: PathLike) -> str:
    """`results()` as the lines `run`, `start`'s end and `demo` print."""
    r = results(root)
    lines = []
    if r.get("gguf"):
        lines.append(f"adapter:   {r['gguf']}")
    if r.get("eval_json"):
        lines.append(
            f"eval:      {r['eval_json']}" + (f"  ({r['eval_line']})" if r.get("eval_line") else "")
        )
    if r.get("ggk"):
        lines.append(f"ggk:       {r['ggk']}")
    lines += [f"note:      {n}" for n in r.get("notes") or []]
    return "\n".join(lines)


# ---- reset ----------------------------------------------------------------------------
def reset_plan(root: PathLike, target: str) -> ResetPlan:
    """Dry run of `reset`: exactly the paths it would delete, and those it would leave
    (with the reason). `blocked` says why reset is refused now (a live run or job)."""
    from gguf_trainer.runner import reset as reset_mod

    return ResetPlan(**reset_mod.plan(_paths(root), target))


def reset(root: PathLike, target: str) -> ResetResult:
    """Delete a stage's outputs and everything built on them (see runner.reset). Refused
    while the pipeline or a job runs. Deletes exactly `reset_plan(root, target).delete`."""
    from gguf_trainer.runner import reset as reset_mod

    return ResetResult(**reset_mod.reset(_paths(root), target))


# ---- outputs --------------------------------------------------------------------------
def list_exports(root: PathLike) -> list[dict]:
    """This project's exported GGUFs as recorded in exports.json: [{path, kind, time,
    size, exists}], newest first. Garbage in exports.json reads as no exports."""
    from gguf_trainer.runner import reset as reset_mod

    return reset_mod.recorded_exports(_paths(root))


def read_eval(root: PathLike) -> dict | None:
    """eval.json (the last evaluation), or None when there is none or it is unreadable.
    LeadsOutside (its sentence) when it leads outside the project (a symlink)."""
    paths = _paths(root)
    data = _read_json_quiet(paths.eval_json, paths.root)
    return data if isinstance(data, dict) else None


def list_snapshots(root: PathLike) -> list[dict]:
    """snapshots.json entries (step, planned_steps, checkpoint, val_cos, path, size, time,
    eval), by step; entries that are not objects are dropped."""
    paths = _paths(root)
    data = _read_json_quiet(paths.snapshots_json, paths.root)
    items = data.get("snapshots") if isinstance(data, dict) else None
    root = paths.root.resolve()  # recorded relative to the project's parent (places.py)
    return [
        {**e, "path": str(places.recorded_path(e["path"], root))}
        if isinstance(e.get("path"), str)
        else e
        for e in items or []
        if isinstance(e, dict)
    ]


def request_snapshot(
    root: PathLike,
    checkpoint: str = "last",
    evaluate: bool = False,
    fresh: bool = True,
    device: str | None = None,
) -> dict:
    """Start a snapshot export as a DETACHED job (the caller loads no torch) and return its
    job state ({"status": "running", "pid", ...}); follow it in status(root)["jobs"]
    ["snapshot"] or `snapshot_job(root)`. Arguments, the checkpoint's existence and a
    running snapshot job are checked before anything is written."""
    from gguf_trainer.runner import snapshot as snap

    return snap.start_job(_paths(root), checkpoint, evaluate, fresh, device)


def snapshot_job(root: PathLike) -> dict:
    """The snapshot job's state: {"status": idle|running|done|failed|interrupted, "pid",
    "started", "finished", "error", "result" (the snapshots.json entry when done), ...}."""
    from gguf_trainer.runner import jobs

    return jobs.job_status(_paths(root).root, "snapshot")


def start_verify(root: PathLike, repair: bool = False) -> dict:
    """Start `verify` (re-read every shard and checkpoint; `repair` recomputes the damaged
    shards) as a DETACHED job; its state as verify_job() gives it."""
    from gguf_trainer.runner import jobs

    paths = _paths(root)
    if not paths.exists():
        raise NoProjectError(
            f"{paths.root} is not a gguf-trainer project (no project.json); check the path."
        )
    return jobs.start_job(
        paths.root, "verify", "gguf_trainer.runner.verify:job_main", {"repair": bool(repair)}
    )


def verify_job(root: PathLike) -> dict:
    """The verify job's state; when done, "result" holds the report and its "lines"."""
    from gguf_trainer.runner import jobs

    return jobs.job_status(_paths(root).root, "verify")


def wait_snapshot(root: PathLike, timeout_s: float | None = None) -> dict:
    """Block until the snapshot job is not running; its last state."""
    from gguf_trainer.runner import jobs

    return jobs.wait(_paths(root).root, "snapshot", timeout_s)


def tail_log(
    root: PathLike, offset: int = 0, log: str = "pipeline", max_bytes: int = TAIL_MAX_BYTES
) -> tuple[str, int]:
    """New text of a log from byte `offset`: (text, new_offset). Reads at most max_bytes
    (from the end if more is new); a log that shrank (rotated, deleted) restarts at 0.
    `log`: pipeline | snapshot | download. Only whole lines are returned."""
    if log not in LOGS:
        raise UserError(f"unknown log {quote(log)}; choose one of {', '.join(LOGS)}.")
    paths = _paths(root)
    path = paths.pipeline_log if log == "pipeline" else paths.root / f"{log}.log"
    return read_tail(path, offset, max_bytes, inside=paths.root)


# ---- helpers (also used by the CLI) ----------------------------------------------------
def read_tail(
    path: Path, offset: int, max_bytes: int = TAIL_MAX_BYTES, inside: PathLike | None = None
) -> tuple[str, int]:
    """Incremental reader of any text log (see tail_log). With `inside` (the project) a log
    that leads outside it is UnsafeProjectFile, never read (project_file)."""
    try:
        offset = max(0, int(offset))
    except (TypeError, ValueError):
        offset = 0
    try:
        with open(path, "rb") if inside is None else project_file.open_file(inside, path) as f:
            size = os.fstat(f.fileno()).st_size
            if offset > size:
                offset = 0
            start_at = max(offset, size - max_bytes)
            f.seek(start_at)
            data = f.read(size - start_at)
    except (
        FileNotFoundError,
        IsADirectoryError,
        NotADirectoryError,
        PermissionError,
        project_file.NotAFile,
    ):  # a folder or FIFO in its place: nothing to show
        return "", 0 if offset == 0 else offset
    end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
    return data[:end].decode("utf-8", errors="replace"), start_at + end


def check_folder_arg(root: Any, what: str = "the project folder") -> Path:
    """A folder path as a client sent it (the GUI API takes any JSON): text or a path, not
    empty, no NUL byte; else one sentence, never a TypeError from deep inside."""
    if not isinstance(root, str | os.PathLike) or isinstance(root, bytes):
        raise UserError(f"{what} must be a path (text), not {type(root).__name__} {quote(root)}.")
    text = os.fspath(root)
    if not isinstance(text, str) or not text.strip():
        raise UserError(f"{what} is empty; give the folder's path.")
    if "\0" in text:
        raise UserError(f"{what} {quote(text)} holds a NUL byte, which no path can; fix it.")
    return Path(text).expanduser()


def _root(root: PathLike) -> Path:
    return check_folder_arg(root).resolve()


def _paths(root: PathLike) -> ProjectPaths:
    return supervisor.project_paths(check_folder_arg(root))


def _live_run(paths: ProjectPaths) -> dict | None:
    info = status_mod.derive_status(paths)
    return info if supervisor.is_active(info) else None


def _set_steps_idle(paths: ProjectPaths, steps: Any) -> int:
    from gguf_trainer import project

    return project.set_steps(paths.root, steps)


def _wait_steps_seen(paths: ProjectPaths, steps: int, wait_s: float) -> bool:
    import time

    deadline = time.monotonic() + max(0.0, wait_s)
    while True:
        st = status_mod.read_state(paths) or {}
        if st.get("steps") == steps:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def _read_json_quiet(path: Path, inside: Path) -> Any:
    """The file's JSON, or None when absent or unreadable; a file leading outside the
    project is not quiet: the caller asked to see it, so the sentence goes out."""
    try:
        return atomic.read_json(path, inside=inside)
    except project_file.LeadsOutside:
        raise
    except (ValueError, OSError):
        return None
