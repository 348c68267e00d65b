"""The control API (runner.control) and the hostile-input classes it closes.

Class 1 (schema half): settings have physical bounds; a bad value is one sentence naming the
field, the value, the allowed range and the fix, and nothing is written or invalidated.
Class 2: delete only what the tool wrote (recorded exports: regular file, recorded size and
hash; owned folders: inside the project, never through a symlink).
Class 3: observing never crashes, whatever the tool's own files hold.
Class 9: integers parse as integers.
Class 10 (argument half): arguments are checked before any file is written; two projects
with the same name in one output folder are refused at start.
Each case asserts the exit code, one sentence without a traceback and byte-identical data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gguf_trainer import cli
from gguf_trainer.base import atomic, safe_delete
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.exit_codes import EXIT_NO_PROJECT, EXIT_OK, EXIT_USER
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import control, jobs, state
from gguf_trainer.store.project import update_settings
from gguf_trainer.store.schema_fields import settings_table_markdown

PACK = "t5xxl_pixart"


@pytest.fixture
def proj(tmp_path):
    root = tmp_path / "proj"
    control.new_project(root, PACK, overrides={"export.output_dir": str(tmp_path / "out")})
    return root


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under root with its bytes (None for folders): 'byte-identical' compares these."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if rel.endswith(".lock"):  # lock files are created empty by probes; not data
            continue
        out[rel] = None if p.is_dir() and not p.is_symlink() else (
            os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
    return out


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_sentence(err: str) -> None:
    assert "Traceback" not in err and err.strip(), err
    assert len(err.strip().splitlines()) == 1, err


# ---- projects and settings ----------------------------------------------------------------
def test_new_project_and_open(tmp_path, capsys):
    code, out, err = run_cli(
        capsys, "new", "--pack", "llada_image", tmp_path / "p", "--name", "mine"
    )
    assert code == EXIT_OK, err
    assert "pig_mine" in out and "gguf-trainer run --project" in out
    view = control.open_project(tmp_path / "p")
    assert view.ok and view.settings["name"] == "pig_mine" and view.pack["id"] == "llada_image"
    assert view.status["status"] == "idle"


@pytest.mark.parametrize(
    "argv",
    [
        ["new", "--pack", "nope", "{d}"],
        ["new", "--pack", PACK, "{d}", "--name", "../evil"],
        ["new", "--pack", PACK, "{f}/sub"],  # a file where a folder should be
        ["new", "--pack", PACK, "{f}"],
    ],
)
def test_new_refuses_before_writing(tmp_path, capsys, argv):
    f = tmp_path / "afile"
    f.write_text("x")
    before = tree(tmp_path)
    code, _, err = run_cli(capsys, *[a.format(d=tmp_path / "p", f=f) for a in argv])
    assert code == EXIT_USER
    one_sentence(err.splitlines()[0] + "\n")
    assert tree(tmp_path) == before


def test_broken_project_json_is_reported_not_idle(proj, capsys):
    (proj / "project.json").write_text('{"pack": "t5xxl_pixart", "train": {"lr": "fast"}}')
    code, out, _ = run_cli(capsys, "status", "--project", proj)
    assert code == EXIT_USER and "project.json is broken" in out and "train.lr" in out
    view = control.open_project(proj)
    assert not view.ok and "train.lr" in view.errors[0]
    info = json.loads(run_cli(capsys, "status", "--project", proj, "--json")[1])
    assert "train.lr" in info["settings_error"]


def test_compare_and_set_keeps_fields_changed_on_disk(proj):
    seen = control.read_settings(proj)
    control.set_steps(proj, "12k")  # e.g. `gguf-trainer set --steps` from another terminal
    res = control.update_settings(proj, {"train.steps": 5000, "train.lr": 1e-3}, seen)
    assert res.applied == {"train.lr": 1e-3}
    assert res.conflicts == {"train.steps": {"read": 20000, "disk": 12000, "yours": 5000}}
    now = control.read_settings(proj).values["train"]
    assert now["steps"] == 12000 and now["lr"] == 1e-3
    assert res.version == control.read_settings(proj).version != seen.version


def test_update_settings_reports_each_bad_field_and_writes_nothing(proj):
    before = (proj / "project.json").read_bytes()
    res = control.update_settings(
        proj,
        {"train.lr": float("inf"), "train.width": 100, "train.depth": 4, "train.wdith": 3},
        control.read_settings(proj),
    )
    assert (
        set(res.errors) == {"train.wdith"}
        and "did you mean train.width" in res.errors["train.wdith"]
    )
    res = control.update_settings(
        proj,
        {"train.lr": float("inf"), "train.width": 100, "train.depth": 4},
        control.read_settings(proj),
    )
    assert set(res.errors) == {"train.lr", "train.width"} and not res.applied
    assert "finite number greater than 0 and at most 1" in res.errors["train.lr"]
    assert (proj / "project.json").read_bytes() == before


def test_a_live_run_refuses_changes_that_would_invalidate_it(proj, monkeypatch):
    monkeypatch.setattr(
        control.projects, "_live_run", lambda paths: {"pid": 4242, "status": "running"}
    )
    res = control.update_settings(
        proj, {"train.lr": 1e-3, "train.steps": 900, "export.copy_to": "/tmp/x"}, None
    )
    assert set(res.applied) == {"train.steps", "export.copy_to"}
    assert "pid 4242" in res.refused["train.lr"] and "stop the run first" in res.refused["train.lr"]


def test_update_message_names_each_field_once(proj, monkeypatch):
    """One line per problem, each naming its field once ("train.width: train.width: ..." was
    what the CLI printed)."""
    res = control.update_settings(proj, {"train.width": 100, "train.lr": -1}, None)
    monkeypatch.setattr(
        control.projects, "_live_run", lambda paths: {"pid": 4242, "status": "running"}
    )
    refused = control.update_settings(proj, {"train.lr": 1e-3}, None)
    seen = control.read_settings(proj)
    control.set_steps(proj, "12k")
    conflict = control.update_settings(proj, {"train.steps": 5000}, seen)
    for r, keys in (
        (res, ("train.width", "train.lr")),
        (refused, ("train.lr",)),
        (conflict, ("train.steps",)),
    ):
        lines = r.message().splitlines()
        assert len(lines) == len(keys), r.message()
        for key, line in zip(sorted(keys), sorted(lines)):
            assert line.startswith(f"{key}: ") and line.count(key) == 1, line


def test_status_says_stopping_while_a_stopped_run_is_alive(proj):
    from gguf_trainer.runner import lock

    paths = ProjectPaths(proj)
    st = state.empty_state()
    st.update(status="running", stage="train", pid=os.getpid(), heartbeat=time.time())
    atomic.write_json(paths.state_json, st)
    assert control.status(proj)["stopping"] is False  # nothing holds the lock: not alive
    with lock.hold(paths):  # this process is the "pipeline"
        assert control.status(proj)["status"] == "running"
        assert control.status(proj)["stopping"] is False
        assert control.stop(proj, timeout_s=0) == "stopping"
        assert control.status(proj)["stopping"] is True
    # the run ended without removing the request (killed): not "stopping" any more
    assert paths.stop_request.exists() and control.status(proj)["stopping"] is False


def test_set_steps_while_idle(proj):
    r = control.set_steps(proj, "40k")
    assert (r.steps, r.live, r.picked_up) == (40000, False, False)
    assert "continues from the last checkpoint" in r.message


def test_field_metadata_covers_every_setting():
    keys = {f["key"] for f in control.field_metadata(None)}
    from gguf_trainer.store.project_schema import ProjectSettings

    for name, info in ProjectSettings.model_fields.items():
        sub = info.annotation
        if hasattr(sub, "model_fields"):
            assert {f"{name}.{k}" for k in sub.model_fields} <= keys
        elif name != "materials":
            assert name in keys
    for pack in control.list_packs():
        meta = control.field_metadata(pack["id"])
        assert all(f["label"] and f["section"] for f in meta)
        mats = [f for f in meta if f["key"].startswith("materials.")]
        assert {f["material"] for f in mats} == {m["id"] for m in pack["materials"]}
    lr = next(f for f in control.field_metadata(PACK) if f["key"] == "train.lr")
    assert (lr["min"], lr["max"], lr["min_exclusive"], lr["type"], lr["live"]) == (
        0,
        1.0,
        True,
        "float",
        False,
    )


def test_readme_settings_table_is_generated_from_the_schema():
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    begin, end = "<!-- settings-table:begin -->", "<!-- settings-table:end -->"
    assert begin in readme and end in readme
    table = readme.split(begin, 1)[1].split(end, 1)[0].strip()
    assert table == settings_table_markdown(), (
        "README's settings table is stale; regenerate it with: python -c \"import pathlib; "
        "from gguf_trainer.store.schema_fields import settings_table_markdown as t; p = "
        "pathlib.Path('README.md'); "
        "s = p.read_text(); a, b = '<!-- settings-table:begin -->', '<!-- settings-table:end -->'; "
        'p.write_text(s.split(a)[0] + a + chr(10) + t() + chr(10) + b + s.split(b)[1])"'
    )


# ---- class 1: physical bounds, validated before anything is invalidated -------------------
@pytest.mark.parametrize(
    "section,key,value,words",
    [
        ("train", "lr", "Infinity", ["train.lr", "finite", "at most 1"]),
        ("train", "lr", "NaN", ["train.lr", "finite"]),
        ("train", "width", 1 << 30, ["train.width", "16384", "fits no card"]),
        ("train", "depth", 0, ["train.depth", "from 1 to 64"]),
        ("train", "batch_size", -3, ["train.batch_size", "from 1 to 65536"]),
        ("train", "threads", 10**6, ["train.threads", "4096"]),
        ("train", "steps", "123456789012345678901", ["steps", "100,000,000"]),
        ("train", "weight_decay", True, ["train.weight_decay", "true", "finite number"]),
        ("corpus", "n_train", 10**12, ["corpus.n_train", "10_000_000"]),
        ("precompute", "gpu_mem_gib", 1e9, ["precompute.gpu_mem_gib", "4096"]),
    ],
)
def test_out_of_range_settings_are_one_sentence_and_nothing_moves(
    proj, capsys, section, key, value, words
):
    paths = ProjectPaths(proj)
    (paths.checkpoints).mkdir()
    (paths.checkpoints / "last.pt").write_bytes(b"weights")  # a finished run's checkpoint
    raw = json.loads(paths.project_json.read_text())
    raw[section][key] = value
    text = json.dumps(raw).replace('"Infinity"', "Infinity").replace('"NaN"', "NaN")
    paths.project_json.write_text(text)
    before = tree(proj)
    code, _, err = run_cli(capsys, "start", "--project", proj)
    assert code == EXIT_USER and "Traceback" not in err
    bad = [ln for ln in err.splitlines() if ln.strip().startswith(f"{section}.{key}")]
    assert len(bad) == 1, err
    for w in words:
        assert w in bad[0], (w, bad[0])
    assert tree(proj) == before  # nothing moved aside, nothing written


# ---- class 9: numbers stay numbers ---------------------------------------------------------
@pytest.mark.parametrize(
    "text,stored",
    [("99999999", 99999999), ("12_345", 12345), ("1.5k", 1500), ("100000000", 100000000)],
)
def test_steps_are_stored_exactly(proj, capsys, text, stored):
    code, _, err = run_cli(capsys, "set", "--project", proj, "--steps", text)
    assert code == EXIT_OK, err
    assert json.loads((proj / "project.json").read_text())["train"]["steps"] == stored
    assert f'"steps": {stored}' in (proj / "project.json").read_text()  # an int, not 1e8


@pytest.mark.parametrize(
    "text", ["123456789012345678901", "1e30", "0", "-5", "2.5", "nan", "inf", "12 000", "0x10", ""]
)
def test_bad_steps_are_refused_without_writing(proj, capsys, text):
    before = tree(proj)
    code, _, err = run_cli(capsys, "set", "--project", proj, "--steps", text)
    assert code == EXIT_USER
    one_sentence(err)
    assert "steps" in err and tree(proj) == before


# ---- class 2: delete only what you wrote ---------------------------------------------------
def _export(proj: Path, path: Path, data: bytes = b"GGUF...adapter", kind: str = "final") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    paths = ProjectPaths(proj)
    man = atomic.read_json(paths.exports_json, {"files": {}})
    man["files"][str(path)] = {"kind": kind, "time": time.time(), **safe_delete.file_record(path)}
    atomic.write_json(paths.exports_json, man)


def test_reset_output_deletes_recorded_files_and_the_plan_is_exact(proj, tmp_path):
    a, b = (
        tmp_path / "out" / "pig_t5_adapter-f16.gguf",
        tmp_path / "copy" / "pig_t5_adapter-f16.gguf",
    )
    update_settings(proj, {"export.copy_to": str(tmp_path / "copy")})
    _export(proj, a)
    _export(proj, b, kind="copy")
    plan = control.reset_plan(proj, "output")
    assert sorted(plan.delete) == sorted([str(a), str(b), str(ProjectPaths(proj).exports_json)])
    assert plan.keep == [] and plan.blocked is None
    done = control.reset(proj, "output")
    assert sorted(done.deleted) == sorted(plan.delete) and not a.exists() and not b.exists()


@pytest.mark.parametrize("case", ["folder", "symlink", "changed", "resized", "no_record"])
def test_reset_output_leaves_what_it_did_not_write(proj, tmp_path, capsys, case):
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "thesis.txt").write_text("years of work")
    target = tmp_path / "out" / "pig_t5_adapter-f16.gguf"
    _export(proj, target)
    paths = ProjectPaths(proj)
    man = atomic.read_json(paths.exports_json)
    rec = man["files"].pop(str(target))
    if case == "folder":  # a hand-edited exports.json naming someone's folder
        man["files"][str(victim)] = rec
    elif case == "symlink":
        target.unlink()
        target.symlink_to(victim / "thesis.txt")
        man["files"][str(target)] = rec
    elif case == "changed":
        target.write_bytes(b"GGUF...adaptes")  # same size, other bytes
        man["files"][str(target)] = rec
    elif case == "resized":
        target.write_bytes(b"somebody else's file")
        man["files"][str(target)] = rec
    else:
        man["files"][str(target)] = {"kind": "final"}  # an old record without size/hash
    atomic.write_json(paths.exports_json, man)
    before = tree(tmp_path / "precious"), tree(tmp_path / "out")
    plan = control.reset_plan(proj, "output")
    code, out, err = run_cli(capsys, "reset", "--project", proj, "output")
    assert code == EXIT_OK and "Traceback" not in err
    assert (tree(tmp_path / "precious"), tree(tmp_path / "out")) == before
    kept = [k["path"] for k in plan.keep]
    assert len(kept) == 1 and "left alone" in plan.keep[0]["reason"] and "kept" in out
    assert kept[0] not in plan.delete


def test_reset_never_follows_a_symlinked_project_folder(proj, tmp_path):
    outside = tmp_path / "elsewhere"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "data.bin").write_bytes(b"x" * 10)
    ProjectPaths(proj).shards.symlink_to(outside)
    ProjectPaths(proj).checkpoints.mkdir()
    (ProjectPaths(proj).checkpoints / "last.pt").write_bytes(b"ck")
    plan = control.reset_plan(proj, "shards")
    assert [k["path"] for k in plan.keep] == [str(ProjectPaths(proj).shards)]
    done = control.reset(proj, "shards")
    assert done.deleted == plan.delete and str(ProjectPaths(proj).checkpoints) in done.deleted
    assert (outside / "keep" / "data.bin").read_bytes() == b"x" * 10


@pytest.mark.parametrize("target", ["train", "shards", "corpus"])
def test_reset_clears_the_rank_files_of_a_launched_run_and_lists_them(proj, target):
    paths = ProjectPaths(proj)
    paths.ranks.mkdir()
    for r in (1, 2):
        atomic.write_json(paths.rank_file(r), {"rank": r, "status": "done"})
        paths.rank_log(r).write_text("rank log\n")
    st = state.empty_state()
    st.update(status="done", ranks=[{"rank": 1, "status": "done"}])
    atomic.write_json(paths.state_json, st)
    plan = control.reset_plan(proj, target)
    assert str(paths.ranks) in plan.delete and plan.keep == []
    done = control.reset(proj, target)
    assert done.deleted == plan.delete and not paths.ranks.exists()
    assert "ranks" not in atomic.read_json(paths.state_json)
    assert str(paths.ranks) not in control.reset_plan(proj, target).delete


def test_reset_output_leaves_the_rank_files(proj):
    paths = ProjectPaths(proj)
    paths.ranks.mkdir()
    atomic.write_json(paths.rank_file(1), {"rank": 1})
    assert str(paths.ranks) not in control.reset_plan(proj, "output").delete
    control.reset(proj, "output")
    assert paths.rank_file(1).is_file()


def test_after_reset_the_cleared_stages_are_not_done(proj, capsys):
    paths = ProjectPaths(proj)
    st = state.empty_state()
    st.update(
        status="done",
        pid=1,
        pid_start_time=1.0,
        stages={s: {"status": "done", "started": 1.0, "finished": 2.0} for s in state.STAGES},
    )
    atomic.write_json(paths.state_json, st)
    paths.checkpoints.mkdir()
    control.reset(proj, "train")
    info = control.status(proj)
    assert info["stages"]["train"]["status"] == "pending"
    assert info["stages"]["eval"]["status"] == "pending"
    assert info["stages"]["precompute_train"]["status"] == "done"
    assert info["status"] != "done" and "reset" in info["message"]
    out = run_cli(capsys, "status", "--project", proj)[1]
    assert "train             pending" in out


# ---- class 3: observing never crashes ------------------------------------------------------
GARBAGE = {
    "empty": b"",
    "not_json": b"{\x00\xff garbage",
    "wrong_types": json.dumps(
        {
            "status": 7,
            "pid": "me",
            "pid_start_time": [1],
            "stages": 5,
            "heartbeat": "soon",
            "exits": {"a": 1},
            "files": [1, 2],
            "snapshots": "many",
            "stage": {"x": 1},
            "error": 3,
        }
    ).encode(),
    "list": b"[1, 2, 3]",
    "stages_garbage": json.dumps(
        {
            "status": "running",
            "pid": 1,
            "stages": {"train": {"status": "flying", "done": "x", "total": None}, "eval": 3},
        }
    ).encode(),
    "deep": b"[" * 5000 + b"]" * 5000,
    "folder": None,
}
TOOL_FILES = [
    "state.json",
    "exit.json",
    "killed.json",
    "exports.json",
    "snapshots.json",
    "eval.json",
    "snapshot-job.json",
    "pipeline.lock",
    "snapshot.lock",
    "metrics.jsonl",
    "hashes.json",
    "stop.request",
    "pipeline.log",
]


def _plant(path: Path, content: bytes | None) -> None:
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)


@pytest.mark.parametrize("name", TOOL_FILES)
@pytest.mark.parametrize("content", list(GARBAGE))
def test_status_and_the_control_api_answer_for_any_file_content(
    proj, capsys, monkeypatch, name, content
):
    from gguf_trainer.runner import supervisor

    _plant(proj / name, GARBAGE[content])
    supervisor.remember_project(proj)
    launched = []
    monkeypatch.setattr(supervisor, "start", lambda root, **kw: launched.append(root) or 4242)
    before = tree(proj)
    assert supervisor.auto_resume().startswith("auto-resume: ")  # answers; maybe relaunches
    for argv in (["status"], ["status", "--json"], ["stop", "--timeout", "0"], ["kill"]):
        code, out, err = run_cli(capsys, *argv, "--project", proj)
        assert code == EXIT_OK, (argv, err)
        assert "Traceback" not in err and out.strip()
    info = control.status(proj)
    assert info["status"] in ("idle", "stopped", "failed", "done", "interrupted", "running")
    assert isinstance(control.list_exports(proj), list)
    assert isinstance(control.list_snapshots(proj), list)
    assert control.read_eval(proj) is None or isinstance(control.read_eval(proj), dict)
    assert isinstance(control.tail_log(proj, 0)[0], str)
    assert control.snapshot_job(proj)["status"] in (
        "idle",
        "done",
        "failed",
        "stopped",
        "interrupted",
    )
    assert isinstance(control.reset_plan(proj, "output").delete, list)
    assert tree(proj) == before


@pytest.mark.parametrize("content", ["empty", "not_json", "wrong_types", "list", "folder"])
def test_auto_resume_answers_for_a_garbage_user_settings_file(proj, content):
    from gguf_trainer.runner import supervisor

    home = supervisor.home_dir()
    home.mkdir(parents=True, exist_ok=True)
    target = home / "settings.json"
    if target.is_dir():
        target.rmdir()
    target.unlink(missing_ok=True)
    _plant(target, GARBAGE[content])
    try:
        assert supervisor.auto_resume().startswith("auto-resume: ")
    finally:
        target.rmdir() if target.is_dir() else target.unlink()


# ---- class 10 (argument half) --------------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["snapshot", "--project", "{p}", "--eval", "--device", "bogus"],
        ["snapshot", "--project", "{p}", "--checkpoint", "best"],  # no checkpoint yet
        ["start", "--project", "{p}", "--steps", "abc"],
        ["run", "--project", "{p}", "--steps", "0"],
        ["set", "--project", "{p}", "--steps", "1e999"],
        ["reset", "--project", "{p}", "everything"],
    ],
)
def test_arguments_are_checked_before_any_file_is_written(proj, capsys, argv):
    before = tree(proj)
    code, _, err = run_cli(capsys, *[a.format(p=proj) for a in argv])
    assert code == EXIT_USER, err
    assert "Traceback" not in err
    assert tree(proj) == before


def test_no_project_is_exit_2(tmp_path, capsys):
    code, _, err = run_cli(capsys, "status", "--project", tmp_path / "nothing")
    assert code == EXIT_NO_PROJECT and "no project.json" in err


def test_two_projects_with_one_name_in_one_output_folder_are_refused(tmp_path, capsys):
    for d in ("a", "b"):
        control.new_project(tmp_path / d, PACK, name="same")
    before = tree(tmp_path)
    code, _, err = run_cli(capsys, "start", "--project", tmp_path / "b")
    assert code == EXIT_USER and "another project named 'pig_same'" in err
    one_sentence(err)
    assert tree(tmp_path) == before


def test_a_final_gguf_this_project_did_not_write_is_refused(proj, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "pig_t5_adapter-f16.gguf").write_bytes(b"someone else's")
    with pytest.raises(UserError, match="did not write it"):
        control.preflight(proj)


# ---- results, logs, jobs -------------------------------------------------------------------
def test_results_name_real_paths_and_no_placeholders(proj, tmp_path):
    from gguf_trainer.store.project import load_project

    project = load_project(proj)
    project.final_gguf.parent.mkdir(parents=True, exist_ok=True)
    project.final_gguf.write_bytes(b"GGUF")
    atomic.write_json(
        project.paths.eval_json,
        {"headline": "cos", "val_cos": 0.8, "baseline": {"baseline_cos": 0.5}},
    )
    res = control.results(proj)
    assert (
        res["gguf"] == str(project.final_gguf)
        and "cos 0.8000 vs mean baseline 0.5000" in res["eval_line"]
    )
    assert "<" not in res["ggk"] and ">" not in res["ggk"]
    assert any(
        f"gguf-trainer link --project {proj} student PATH" in n for n in res["notes"]
    )  # no student set: said so, with the command that fixes it
    text = control.results_text(proj)
    assert "adapter:" in text and "ggk:" in text


def test_results_print_the_users_files_else_a_quoted_placeholder(tmp_path, monkeypatch):
    """Issue 31 item 9: Z-Image's command names two files ggk has no name for. `run`/`status`
    print the file the user set (`render --file`) in its place and the other as one quoted
    word (bash reads a bare `<` as a redirect), with a line saying what to put there."""
    import shlex

    from gguf_trainer.runner import render_job
    from gguf_trainer.store.project import load_project

    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "home"))
    root = tmp_path / "z"
    control.new_project(root, "qwen3_zimage")
    project = load_project(root)
    project.final_gguf.parent.mkdir(parents=True, exist_ok=True)
    project.final_gguf.write_bytes(b"GGUF")
    render_job.save_render_settings(files={"<z-image-turbo DiT .gguf>": "/m/z image.gguf"})
    res = control.results(root)
    words = shlex.split(res["ggk"])
    assert words[words.index("--diffusion-model") + 1] == "/m/z image.gguf"
    assert words[words.index("--vae") + 1] == "<flux ae .gguf>"  # one word, quoted
    assert "'<flux ae .gguf>'" in res["ggk"]
    said = [n for n in res["notes"] if n.startswith("'<flux ae .gguf>': put the path")]
    assert len(said) == 1 and not any("z-image-turbo DiT" in n for n in res["notes"])


def test_tail_log_reads_only_new_whole_lines(proj):
    log = ProjectPaths(proj).pipeline_log
    log.write_text("one\ntwo\nthr")
    text, off = control.tail_log(proj, 0)
    assert text == "one\ntwo\n" and off == 8
    with open(log, "a") as f:
        f.write("ee\n")
    assert control.tail_log(proj, off) == ("three\n", 14)
    log.write_text("new\n")  # rotated: shorter than the offset
    assert control.tail_log(proj, 14) == ("new\n", 4)
    with pytest.raises(UserError):
        control.tail_log(proj, 0, log="../../etc/passwd")


JOB_MODULE = """
import time
from gguf_trainer.base.errors import UserError

def work(folder, job, n=3, fail=False, crash=False):
    for i in range(n):
        job.update(done=i + 1, total=n)
        time.sleep(0.1)
    if fail:
        raise UserError("the input is wrong; fix it.")
    if crash:
        raise KeyError("bug")
    return {"made": n}

def slow(folder, job):
    while True:
        job.update(tick=time.time())
        time.sleep(0.05)
"""


@pytest.fixture
def job_module(tmp_path, monkeypatch):
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "jobmod_for_tests.py").write_text(JOB_MODULE)
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join([str(tmp_path / "mod"), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    return "jobmod_for_tests"


def test_jobs_run_detached_and_record_their_end(tmp_path, job_module):
    folder = tmp_path / "f"
    folder.mkdir()
    st = jobs.start_job(folder, "demo", f"{job_module}:work", {"n": 3})
    assert st["status"] in ("running", "done")
    end = jobs.wait(folder, "demo", timeout_s=300)
    assert end["status"] == "done" and end["result"] == {"made": 3}
    assert end["progress"] == {"done": 3, "total": 3}
    jobs.start_job(folder, "demo", f"{job_module}:work", {"n": 1, "fail": True})
    end = jobs.wait(folder, "demo", timeout_s=300)
    assert end["status"] == "failed" and end["error"] == "the input is wrong; fix it."
    jobs.start_job(folder, "demo", f"{job_module}:work", {"n": 1, "crash": True})
    end = jobs.wait(folder, "demo", timeout_s=300)
    assert end["status"] == "failed" and "internal error" in end["error"]
    assert "KeyError" in jobs.log_path(folder, "demo").read_text()


def test_one_job_per_name_stop_and_kill_reads_interrupted(tmp_path, job_module):
    import signal

    folder = tmp_path / "f"
    folder.mkdir()
    st = jobs.start_job(folder, "snapshot", f"{job_module}:slow", {})
    assert st["status"] == "running"
    with pytest.raises(UserError, match="a snapshot job is already running"):
        jobs.start_job(folder, "snapshot", f"{job_module}:slow", {})
    assert jobs.stop_job(folder, "snapshot") == "stopped"
    assert jobs.job_status(folder, "snapshot")["status"] == "stopped"
    st = jobs.start_job(folder, "snapshot", f"{job_module}:slow", {})
    os.kill(st["pid"], signal.SIGKILL)
    end = jobs.wait(folder, "snapshot", timeout_s=300)
    assert end["status"] == "interrupted" and "without recording a result" in end["error"]


def test_a_running_snapshot_job_shows_in_status_json_and_blocks_reset(proj, capsys, job_module):
    jobs.start_job(proj, "snapshot", f"{job_module}:slow", {})
    try:
        info = json.loads(run_cli(capsys, "status", "--project", proj, "--json")[1])
        assert info["jobs"]["snapshot"]["status"] == "running"
        assert "snapshot" in control.reset_plan(proj, "train").blocked
        code, _, err = run_cli(capsys, "reset", "--project", proj, "train")
        assert code == EXIT_USER and "snapshot export is running" in err
    finally:
        jobs.stop_job(proj, "snapshot")


def test_a_running_publish_blocks_reset(proj, capsys, job_module):
    jobs.start_job(proj, "publish", f"{job_module}:slow", {})
    try:
        assert "publish" in control.reset_plan(proj, "output").blocked
        code, _, err = run_cli(capsys, "reset", "--project", proj, "output")
        assert code == EXIT_USER and "a publish is uploading" in err
    finally:
        jobs.stop_job(proj, "publish")


def test_control_imports_no_torch():
    code = (
        "import sys, gguf_trainer.runner.control as c, gguf_trainer.runner.jobs, "
        "gguf_trainer.base.safe_delete\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'transformers', 'gguf', 'numpy')))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_read_metrics_follows_new_rows(proj):
    path = ProjectPaths(proj).metrics_jsonl
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3')
    rows, off = control.read_metrics(proj, 0)
    assert [r["step"] for r in rows] == [1, 2]
    with open(path, "a") as f:
        f.write(', "loss": 1.0}\n')
    rows, off2 = control.read_metrics(proj, off)
    assert [r["step"] for r in rows] == [3] and off2 > off
    assert control.read_metrics(proj, "garbage")[0][0]["step"] == 1


def test_a_companion_that_was_not_exported_is_left_out_with_a_note(tmp_path):
    from gguf_trainer.store.project import load_project

    control.new_project(
        tmp_path / "l", "llada_image", overrides={"export.output_dir": str(tmp_path / "out")}
    )
    project = load_project(tmp_path / "l")
    project.final_gguf.parent.mkdir(parents=True)
    project.final_gguf.write_bytes(b"GGUF")
    res = control.results(tmp_path / "l")
    assert "--llm_vision" not in res["ggk"] and "<" not in res["ggk"]
    assert any("pig_llada_sigvq-f16.gguf was not exported" in n for n in res["notes"])
    project.companion_gguf("sigvq").write_bytes(b"GGUF")
    res = control.results(tmp_path / "l")
    assert f"--llm_vision {project.companion_gguf('sigvq')}" in res["ggk"]
    assert not any("was not exported" in n for n in res["notes"])


@pytest.mark.parametrize(
    "case",
    ["project_json_folder", "project_is_a_file", "empty_json", "not_an_object", "non_utf8", "deep"],
)
def test_status_of_a_broken_project_is_one_sentence(tmp_path, capsys, case):
    root = tmp_path / "p"
    if case == "project_is_a_file":
        root.write_text("x")
    else:
        root.mkdir()
        pj = root / "project.json"
        if case == "project_json_folder":
            pj.mkdir()
        else:
            pj.write_bytes(
                {
                    "empty_json": b"",
                    "not_an_object": b"[1]",
                    "non_utf8": b"\xff\xfe{",
                    "deep": b"[" * 100000,
                }[case]
            )
    before = tree(tmp_path)
    code, out, err = run_cli(capsys, "status", "--project", root)
    # a file is no project at all: exit 2 like any other non-project (one code per cause)
    assert code == (EXIT_NO_PROJECT if case == "project_is_a_file" else EXIT_USER)
    assert "Traceback" not in out + err
    assert "project.json" in out + err or "not a project folder" in err
    assert tree(tmp_path) == before


def test_compare_and_set_accepts_a_read_that_travelled_as_json(proj):
    seen = json.loads(json.dumps(control.read_settings(proj).as_dict()))
    control.set_steps(proj, 777)
    res = control.update_settings(proj, {"train.steps": 5}, seen)
    assert "train.steps" in res.conflicts and not res.applied


def test_start_names_a_missing_student_before_launching(proj, capsys, tiny_materials, monkeypatch):
    before = tree(proj)
    code, _, err = run_cli(capsys, "start", "--project", proj)
    assert code == EXIT_USER and "materials.student.path is not set" in err
    # the sentence names the commands that fix it, for this project
    assert f"`gguf-trainer link --project {proj.resolve()} student PATH`" in err
    assert f"`gguf-trainer set --project {proj.resolve()} materials.student.path=PATH`" in err
    one_sentence(err)
    assert tree(proj) == before
    # ... and the named command does fix it
    assert (
        run_cli(capsys, "link", "--project", proj, "student", tiny_materials["student"])[0]
        == EXIT_OK
    )
    control.update_settings(
        proj, {"materials.student_tokenizer.path": str(tiny_materials["tokenizer"])}, None
    )
    code, _, err = run_cli(capsys, "start", "--project", proj)
    assert code == EXIT_USER and "gguf-trainer download --project" in err  # the teacher
    monkeypatch.setenv("GGUF_TRAINER_MOCK_TEACHER", "1")
    control.preflight(proj)  # the mock teacher needs no teacher files


def test_set_any_setting_from_the_cli(proj, capsys, tiny_materials):
    code, out, err = run_cli(
        capsys,
        "set",
        "--project",
        proj,
        "train.lr=1e-4",
        f"materials.student.path={tiny_materials['student']}",
        "corpus.n_train=123456",
        "--steps",
        "30k",
    )
    assert code == EXIT_OK, err
    values = control.read_settings(proj).values
    assert values["train"]["lr"] == 1e-4 and values["corpus"]["n_train"] == 123456
    assert values["materials"]["student"]["path"] == str(tiny_materials["student"])
    assert values["train"]["steps"] == 30000 and "train.lr = 0.0001" in out


@pytest.mark.parametrize(
    "argv,words",
    [
        (["train.lr=Infinity"], ["train.lr", "finite"]),
        (["train.width=100"], ["train.width", "multiple of 64"]),
        (["train.wdith=128"], ["did you mean train.width"]),
        (["corpus.n_train=123456789012345678901"], ["corpus.n_train", "10_000_000"]),
        (["lr"], ["KEY=VALUE"]),
        (["train.depth=4", "train.batch_size=true"], ["train.batch_size"]),
    ],
)
def test_set_refuses_bad_settings_without_writing(proj, capsys, argv, words):
    before = tree(proj)
    code, _, err = run_cli(capsys, "set", "--project", proj, *argv)
    assert code == EXIT_USER
    one_sentence(err)
    assert all(w in err for w in words), err
    assert tree(proj) == before


def test_every_run_path_makes_one_preflight(proj, tmp_path, capsys, monkeypatch):
    """`run`, a launched `run`, `start` and the GUI's start all go through
    control.preflight_run (one sequence): its refusal is theirs, before anything is written."""
    from gguf_trainer.ui import api

    calls = []

    def refuse(root, only=None, steps=None, launch=None):
        calls.append((Path(root).resolve(), steps))
        raise UserError("refused by the one pre-flight.")

    monkeypatch.setattr(control, "preflight_run", refuse)  # the CLI's `run` calls it
    monkeypatch.setattr(control.runs, "preflight_run", refuse)  # control.start calls it
    before = tree(proj)
    for argv in (["run"], ["run", "--processes", "2", "--steps", "7"], ["start"]):
        code, _, err = run_cli(capsys, *argv, "--project", proj)
        assert code == EXIT_USER and "refused by the one pre-flight" in err, (argv, err)
    with pytest.raises(UserError, match="one pre-flight"):
        api.start(str(proj))
    assert calls == [
        (proj.resolve(), None),
        (proj.resolve(), "7"),
        (proj.resolve(), None),
        (proj.resolve(), None),
    ]
    assert tree(proj) == before


def test_preflight_run_checks_the_project_on_machine_rank_0_only(proj):
    from gguf_trainer.runner.launch import Launch

    with pytest.raises(UserError, match="materials.student.path is not set"):
        control.preflight_run(proj, steps="12")
    other = Launch(processes=1, num_machines=2, machine_rank=1, main_process_ip="127.0.0.1")
    plan = control.preflight_run(proj, steps="12", launch=other)  # the project is machine 0's
    assert plan.steps == 12 and not plan.launch.is_main_machine and plan.linked == []
