"""Render jobs: the teacher and the adapter run side by side in the user's ggk.

A render is a detached `runner.jobs` job named "render" in the project folder (one per
project; Stop ends it and the ggk process it runs). Each render gets its own folder
`renders/<UTC time>-s<seed>/` holding the images, the SD_DUMP_COND dumps, the ggk output
(`<half>.log`) and `render.json` (prompt, seed, every command line, the figures), so a result
stays readable after the job and the GUI are gone. The plan (commands, model files, figures)
is gguf_trainer.render's; this module only runs it.

    start_render(root, "a red fox", seed=42) -> job state       (raises UserError / LockHeld)
    render_settings() / save_render_settings(ggk=..., models=..., files=...)   user settings
    parse_files(['<z-image-turbo DiT .gguf>=/m/z.gguf']) -> {placeholder: path}
    render_status(root) -> {job, missing, no_teacher, text_only, placeholders, latest}
                                                                what the Output tab shows
    list_renders(root) -> [render.json dicts], newest first
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from gguf_trainer import render
from gguf_trainer.base import atomic, project_file
from gguf_trainer.base.errors import UserError, quote
from gguf_trainer.base.paths import RENDER_JSON, RENDERS_DIR
from gguf_trainer.check import run_check
from gguf_trainer.runner import jobs, supervisor

JOB_NAME = "render"
JOB_TARGET = "gguf_trainer.runner.render_job:render_main"
# in ~/.gguf-trainer/settings.json: {"ggk": path, "models": folder, "files": {placeholder: path}}
SETTINGS_KEY = "render"
POLL_S = 0.2


def render_settings() -> dict:
    """{"ggk": configured ggk path or "", "models": ggk's model folder or "", "files": the
    file set for each placeholder of a pack's ggk command}."""
    got = supervisor.read_settings().get(SETTINGS_KEY)
    got = got if isinstance(got, dict) else {}
    out = {k: got.get(k) if isinstance(got.get(k), str) else "" for k in ("ggk", "models")}
    files = got.get("files") if isinstance(got.get("files"), dict) else {}
    out["files"] = {
        render.placeholder_key(k): v for k, v in files.items() if isinstance(v, str) and v
    }
    return out


def parse_files(items) -> dict[str, str]:
    """`<placeholder>=PATH` items (the CLI's --file, the GUI's lines) as {placeholder: path};
    an empty PATH unsets it. A malformed item is a sentence."""
    out = {}
    for item in items or ():
        if not item.strip():
            continue
        name, eq, path = item.partition("=")
        if not eq or not name.strip() or not name.strip().strip("<>").strip():
            raise UserError(
                f"{item.strip()!r} is not a placeholder's file: write it as "
                '"<placeholder>=PATH", e.g. "<z-image-turbo DiT .gguf>=/models/z-image.gguf"'
            )
        out[render.placeholder_key(name)] = path.strip()
    return out


def files_text(files: dict[str, str]) -> str:
    """The placeholder files as the GUI's lines (parse_files reads them back)."""
    return "\n".join(f"{k}={v}" for k, v in sorted(files.items()))


def save_render_settings(ggk: str | None = None, models: str | None = None,
                         files: dict[str, str] | None = None, replace_files: bool = False) -> dict:
    """Remember where ggk and its model files are (user settings: they serve every project).
    `files` adds or (empty path) unsets placeholder files; replace_files: they are all of them
    (the GUI's box holds the whole list)."""
    settings = supervisor.read_settings()
    cur = render_settings()
    if ggk is not None:
        cur["ggk"] = str(Path(ggk).expanduser()) if ggk.strip() else ""
    if models is not None:
        cur["models"] = str(Path(models).expanduser()) if models.strip() else ""
    if files is not None:
        merged = {} if replace_files else dict(cur["files"])
        for k, v in files.items():
            if v:
                merged[render.placeholder_key(k)] = str(Path(v).expanduser())
            else:
                merged.pop(render.placeholder_key(k), None)
        cur["files"] = merged
    settings[SETTINGS_KEY] = cur
    atomic.write_json(supervisor.settings_path(), settings)
    return cur


MAX_SEED = 2**63 - 1  # ggk parses -s into an int64_t


def plan_for(root, prompt: str = "a red fox", seed: int = 42) -> render.RenderPlan:
    from gguf_trainer.store.project import load_project

    conf = render_settings()
    models = Path(conf["models"]).expanduser() if conf["models"] else None
    return render.render_plan(
        load_project(root), prompt, seed, render.find_ggk(conf["ggk"] or None), models,
        conf["files"],
    )


def start_render(root, prompt: str, seed: int = 42) -> dict:
    """Start the render job (detached); a UserError naming everything missing, or LockHeld
    when a render of this project already runs."""
    from gguf_trainer.store.project import load_project

    prompt = (prompt or "").strip()
    if not prompt:
        raise UserError("type a prompt to render")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise UserError(f"the seed must be a whole number from 0 to {MAX_SEED} (ggk's -s is a "
                        f"64-bit integer), not {quote(seed)}.")
    project = load_project(root)
    plan = plan_for(project.dir, prompt, seed)
    if plan.missing:
        raise UserError("cannot render yet; missing: " + "; ".join(plan.missing) + ".")
    return jobs.start_job(project.dir, JOB_NAME, JOB_TARGET, {"prompt": prompt, "seed": seed})


def stop_render(root) -> str:
    from gguf_trainer.store.project import load_project

    return jobs.stop_job(load_project(root).dir, JOB_NAME)


def list_renders(root) -> list[dict]:
    """Every finished or partial render's render.json, newest first."""
    folder = Path(root) / RENDERS_DIR
    out = []
    for f in sorted(folder.glob(f"*/{RENDER_JSON}"), reverse=True) if folder.is_dir() else []:
        try:
            data = atomic.read_json(f, inside=Path(root))
        except (ValueError, OSError):  # a torn or foreign file: not a render
            continue
        if isinstance(data, dict):
            out.append({**data, "folder": str(f.parent)})
    return out


def render_status(root) -> dict:
    """What the Output tab shows: the job's status, what is missing, the newest render."""
    renders = list_renders(root)
    plan = plan_for(root)
    return {
        "job": jobs.job_status(Path(root), JOB_NAME),
        "missing": plan.missing,
        "no_teacher": plan.no_teacher,
        "text_only": plan.text_only,
        "placeholders": plan.placeholders,
        "latest": renders[0] if renders else None,
    }


def half_image(result: dict, half: str) -> Path | None:
    """Where a listed render's image of `half` is now: the recorded file's name in the
    render's own folder. render.json records the path at render time, so a moved or copied
    project would name its old place, and a planted record could name any file; only the name
    is taken (readers still open it through project_file)."""
    h = (result.get("halves") or {}).get(half)
    image = h.get("image") if isinstance(h, dict) else None
    name = Path(image).name if isinstance(image, str) else ""
    return Path(result["folder"]) / name if name not in ("", ".", "..") else None


def describe(result: dict | None) -> list[str]:
    """A finished render as lines: its folder, each image, the figures."""
    if not result:
        return []
    folder = Path(result["folder"])
    record = atomic.read_json(folder / RENDER_JSON, {}) or {}
    lines = [f"render:    {folder}"]
    for half in record.get("halves") or {}:
        lines.append(f"{half + ':':<10} {half_image({**record, 'folder': folder}, half)}")
    if record.get("no_teacher"):
        lines.append(f"teacher:   {record['no_teacher']}")
    if record.get("text_only"):
        lines.append(f"note:      {record['text_only']}")
    fig = record.get("figures")
    if fig:
        lines.append(f"cosine:    {render.figures_line(fig)} — {record.get('figures_note')}")
    elif record.get("figures_note"):
        lines.append(f"cosine:    {record['figures_note']}")
    return lines


# ---- the job ----------------------------------------------------------------------------
def render_main(folder: Path, job, *, prompt: str, seed: int) -> dict:
    """The job body: each half's image pass and conditioning pass, then the figures."""
    from gguf_trainer.store.project import load_project

    project = load_project(folder)
    plan = plan_for(folder, prompt, seed)
    if plan.missing:
        raise UserError("cannot render; missing: " + "; ".join(plan.missing) + ".")
    out = (
        project.paths.root
        / RENDERS_DIR
        / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-s{seed}"
    )
    out = project_file.make_dir(project.paths.root, out)  # renders -> ~/Pictures: refused
    record = {
        "prompt": prompt,
        "seed": seed,
        "pack": project.pack.id,
        "started": time.time(),
        "no_teacher": plan.no_teacher,
        "text_only": plan.text_only,
        "models": plan.models,
        "halves": {},
    }
    for run in plan.runs:
        record["halves"][run.half] = half = {"command": shlex.join(run.argv), "image": None}
        atomic.write_json(out / RENDER_JSON, record)
        project_file.make_dir(project.paths.root, out / run.dump)
        job.update(phase=f"{run.half}: rendering", folder=str(out))
        dump_env = None if run.cond_argv else out / run.dump
        cwd = plan.models or str(out)  # no model folder: every file the command names is a path
        _run_ggk(job, run.argv, cwd, out, f"{run.half}.log", dump_env, out / run.image,
                 run.out_at)
        half["image"] = str(out / run.image)
        if run.cond_argv:
            half["cond_command"] = shlex.join(run.cond_argv)
            job.update(phase=f"{run.half}: conditioning pass (CFG 1)")
            _run_ggk(
                job, run.cond_argv, cwd, out, f"{run.half}-cond.log", out / run.dump, None,
                run.out_at,
            )
        half["dump"] = str(out / run.dump)
    job.update(phase="comparing the conditioning")
    record["figures"], record["figures_note"] = _figures(project, prompt, out, plan)
    record["finished"] = time.time()
    atomic.write_json(out / RENDER_JSON, record)
    return {"folder": str(out), "figures": record["figures"]}


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """`sig` to the process group ggk leads (start_new_session: its pgid is its pid)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:  # the whole group has ended already
        pass
    except PermissionError:  # the group id was reused by another user's process: not ours
        pass


def _run_ggk(
    job, argv: list[str], cwd: str, out: Path, log_name: str, dump: Path | None,
    image: Path | None, out_at: tuple[int, ...] = (),
) -> None:
    """One ggk process in the model folder, its output in the render folder; Stop (SIGTERM
    to the job) terminates its whole process group (a `ggk` wrapper script runs the engine
    as its child). A failure is a UserError naming the log. `out_at`: where `-o` stands
    (render.Run.out_at; found by position, never by value: a prompt `-o` is a prompt)."""
    env = dict(os.environ)
    env.pop("SD_DUMP_COND", None)
    if dump is not None:
        env["SD_DUMP_COND"] = str(dump)  # must exist: the engine does not create it
    # -o names a file in the render folder; ggk runs where its model files are.
    argv = [out / a if i - 1 in out_at else a for i, a in enumerate(argv)]
    with project_file.open_append(out, out / log_name) as log:
        log.write(f"$ {shlex.join(map(str, argv))}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            [str(a) for a in argv],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            while proc.poll() is None:
                job.check()
                time.sleep(POLL_S)
        except jobs.JobStopped:
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:  # a ggk that ignores SIGTERM
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
            _signal_group(proc, signal.SIGKILL)  # the wrapper's engine, if it outlived it
            raise
    if proc.returncode != 0:
        raise UserError(f"ggk exited with code {proc.returncode}; see {out / log_name}")
    if image is not None and not image.is_file():
        raise UserError(f"ggk wrote no image {image.name}; see {out / log_name}")


def _sets_of(project):
    """ids -> the row sets the lead figures read (check.lead_rows), through the project's
    student tokenizer; None when it has none linked (the figures then lead with all rows)."""
    from gguf_trainer.check import lead_rows
    from gguf_trainer.engine.qwen_bpe import engine_bpe
    from gguf_trainer.materials.materials import student_path
    from gguf_trainer.model.student import load_tokenizer

    try:
        encode = engine_bpe(load_tokenizer(student_path(project, "student_tokenizer",
                                                        "--tokenizer DIR"))).encode
    except (UserError, OSError, ValueError):
        return None
    return lambda ids: lead_rows(project.pack, ids, encode)


def _figures(project, prompt: str, out: Path, plan: render.RenderPlan) -> tuple[dict | None, str]:
    """The conditioning cosine: for the slot kinds, `check` of the teacher half's dump (the
    rows the adapter learns, under the full teacher's own names: the adapter's quality);
    else teacher dump vs adapter dump when ggk wrote both; else `check` (the adapter in
    PyTorch vs the engine's adapter dump: a port check) for the fixed-shape packs."""
    halves = {r.half: r for r in plan.runs}
    why = ""
    if "teacher" in halves and render.teacher_dump_checked(project.pack):
        try:  # the slot kinds' full teacher: its own dump files, read by `check`
            got = run_check(None, None, out / halves["teacher"].dump, prompt, project=project)
        except UserError as e:
            why = f"the teacher's dump was not read ({str(e).rstrip('.')}); "
        else:
            return got, (f"quality: the adapter in PyTorch vs the engine's full teacher "
                         f"({Path(got['dump']).name} of the teacher's SD_DUMP_COND dump)")
    elif "teacher" in halves:
        try:  # bounded by the pack's row width: a dump larger than that is said, not read
            got = render.dump_cosine(out / halves["teacher"].dump, out / halves["adapter"].dump,
                                     max_dim=project.pack.out_dim, sets_of=_sets_of(project),
                                     taps=project.pack.taps)
        except UserError as e:
            return None, f"no cosine: {e}"
        if got is not None:
            return got, "adapter vs teacher, from the two SD_DUMP_COND dumps"
    try:
        # the project's export, student and tokenizer (check.check_inputs, as `check
        # --project`), and its linked teacher's tokenizer: t5_ids.txt vs this prompt's ids
        got = run_check(None, None, out / halves["adapter"].dump, prompt, project=project)
    except UserError as e:  # a token-aligned adapter, another engine's dump: say why
        return None, f"no cosine: {e}"
    return (
        got,
        why + (
            "check: the adapter in PyTorch vs the engine's adapter dump (a port check)"
            if why else
            "check: the adapter in PyTorch vs the engine's adapter dump "
            "(ggk writes no teacher dump here)"
        ),
    )
