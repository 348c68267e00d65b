"""The timer tick in process: nothing is sent when nothing changed, new rows are sent, and a
project that disappears is one sentence in the header."""

from __future__ import annotations

import json
import shutil

import pytest

from gguf_trainer.base import atomic
from gguf_trainer.runner.state import empty_state
from gguf_trainer.store.project import create_project
from gguf_trainer.ui import live
from gguf_trainer.ui.app import build_app


@pytest.fixture(scope="module")
def tick():
    app = build_app()
    return next(f.fn for f in app.fns.values() if getattr(f.fn, "__name__", "") == "tick")


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "gt_home"))


def is_skip(v) -> bool:
    return isinstance(v, dict) and v == {"__type__": "update"}


def test_nothing_changed_sends_nothing_and_new_rows_are_sent(tick, tmp_path):
    root = tmp_path / "p"
    create_project(root, "t5xxl_pixart", overrides={"train.steps": 100})
    st = empty_state()
    st.update(status="done", stage="train", step=10, steps=100, mock=True)
    atomic.write_json(root / "state.json", st)
    (root / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / s, "cos": 0.1})
                                                + "\n" for s in range(1, 11)))
    cur = live.Cursor()
    first = tick(str(root), cur, "pipeline", True, False)
    assert "MOCK" in first[0] and not any(is_skip(v) for v in first[:3])
    again = tick(str(root), cur, "pipeline", True, False)
    assert all(is_skip(v) for v in again), [v for v in again if not is_skip(v)]
    with open(root / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 11, "loss": 0.05, "cos": 0.2}) + "\n")
    third = tick(str(root), cur, "pipeline", True, False)
    frames = [
        v["value"] for v in third if isinstance(v, dict) and hasattr(v.get("value"), "columns")
    ]
    assert frames and frames[0]["step"].max() == 11  # the new point reached the chart
    charts = [v for v in third if isinstance(v, dict) and "x_lim" in v]
    # the axis runs to the planned steps
    assert charts and all(c["x_lim"] == [0, 100] for c in charts)


def test_every_view_shows_the_same_step_counts(tick, tmp_path):
    """Issue 24: "5680 / 8000" in the metrics table beside "8000/8000" in the stage box. The
    banner, the stage box, the metrics table and the Planned steps box show one pair: the
    training stage's count and project.json's train.steps, also after Apply while stopped;
    steps/s and ETA are one rate, "—" when stopped, and the ETA is shown once."""
    from gguf_trainer.store.project import update_settings
    from gguf_trainer.ui import train_view

    root = tmp_path / "p"
    create_project(root, "t5xxl_pixart", overrides={"train.steps": 8000})
    st = empty_state()
    st.update(
        status="done",
        stage="train",
        step=5680,
        steps=8000,
        stages={
            "train": {"status": "done", "done": 8000, "total": 8000, "unit": "steps", "rate": 3.0}
        },
    )
    atomic.write_json(root / "state.json", st)
    cur = live.Cursor()
    out = tick(str(root), cur, "pipeline", True, False)
    n = len(train_view.STAGES)
    banner, box = out[1], out[5 + list(train_view.STAGES).index("train")]["value"]
    metrics, planned_box = out[6 + n], out[9 + n]
    assert "step 8000 / 8000" in banner and "8000/8000 steps" in box
    assert "| step | 8000 / 8000 |" in metrics and "| steps/s | — |" in metrics
    assert planned_box == "8000"
    update_settings(root, {"train.steps": 9000})  # Apply (or the CLI) while nothing runs
    out = tick(str(root), cur, "pipeline", True, False)
    assert (
        "step 8000 / 9000" in out[1]
        and "8000/9000 steps" in out[5 + list(train_view.STAGES).index("train")]["value"]
    )
    assert "| step | 8000 / 9000 |" in out[6 + n] and out[9 + n] == "9000"

    running = {
        "status": "running",
        "pid": 7,
        "stage": "train",
        "project": str(root),
        "stages": {
            "train": {
                "status": "running",
                "done": 120,
                "total": 9000,
                "unit": "steps",
                "rate": 0.5,
                "eta_s": 17760.0,
            }
        },
        "message": "running (pid 7): train 120/9000 steps, ETA 4h 56m",
    }
    ups = train_view.render(live.Cursor(), running, False, False)
    text = " ".join(str(u.get("value", "")) if isinstance(u, dict) else str(u) for u in ups)
    assert text.count("ETA") == 1 and "120/9000 steps · 0.5 steps/s · ETA" in ups[4 + n]
    assert "| steps/s | 0.5 |" in ups[5 + n] and "step 120 / 9000" in ups[0]


def test_a_vanished_project_is_one_sentence(tick, tmp_path):
    root = tmp_path / "gone"
    create_project(root, "t5xxl_pixart")
    cur = live.Cursor()
    tick(str(root), cur, "pipeline", True, False)
    shutil.rmtree(root)
    out = tick(str(root), cur, "pipeline", True, False)
    assert "not a gguf-trainer project" in out[0] and all(is_skip(v) for v in out[1:])


@pytest.mark.parametrize(
    "status, label, says",
    [
        ("interrupted", "Resume", "press **Resume**"),
        ("stalled", "Start / Resume", "**Kill** it"),
        ("stopped", "Resume", "STOPPED"),
        ("idle", "Start", "IDLE"),
        ("done", "Start / Resume", "DONE"),
    ],
)
def test_run_states_read_as_such(tmp_path, status, label, says):
    from gguf_trainer.ui import train_view

    (tmp_path / "project.json").write_text("{}")
    info = {"status": status, "message": f"{status}: something", "mock": False, "stages": {}}
    assert train_view.run_label(info) == label
    assert says in train_view.banner_text(info)
    ups = train_view.render(live.Cursor(), info, False, False)
    start, stop, kill = ups[1], ups[2], ups[3]
    active = status == "stalled"
    assert (
        start["interactive"] is not active
        and stop["interactive"] is active
        and kill["interactive"] is active
    )


def test_stopping_comes_from_status_not_from_the_request_file(tick, tmp_path):
    """control.status's `stopping` flag drives "Stopping…"; a request file left by a run
    that has ended is not "stopping" (the run is not alive)."""
    from gguf_trainer.base.paths import ProjectPaths
    from gguf_trainer.ui import train_view

    info = {
        "status": "running",
        "message": "training",
        "mock": False,
        "stages": {},
        "stopping": True,
    }
    ups = train_view.render(live.Cursor(), info, False, False)
    assert (
        "STOPPING" in ups[0] and ups[2]["value"] == "Stopping…" and ups[2]["interactive"] is False
    )
    ups = train_view.render(live.Cursor(), {**info, "stopping": False}, False, False)
    assert "STOPPING" not in ups[0] and ups[2]["value"] == "Stop" and ups[2]["interactive"] is True
    root = tmp_path / "p"
    create_project(root, "t5xxl_pixart")
    st = empty_state()
    st.update(status="stopped", stage="train", step=5, steps=100)
    atomic.write_json(root / "state.json", st)
    ProjectPaths(root).stop_request.write_text("{}")  # left behind; nothing runs
    out = tick(str(root), live.Cursor(), "pipeline", True, False)
    assert "STOPPING" not in out[1] and "STOPPED" in out[1]


def test_a_launched_run_shows_a_line_per_rank_under_the_run():
    from gguf_trainer.ui import train_view

    ranks = [
        {
            "rank": 1,
            "host": "gpu-a",
            "pid": 4101,
            "status": "running",
            "stage": "train",
            "done": 30,
            "total": 100,
            "unit": "steps",
            "rate": 1.5,
            "error": None,
        },
        {
            "rank": 2,
            "host": "gpu-b",
            "pid": 4202,
            "status": "waiting",
            "stage": None,
            "done": None,
            "total": None,
            "unit": None,
            "rate": None,
            "error": None,
        },
    ]
    info = {
        "status": "running",
        "message": "training",
        "mock": False,
        "stage": "train",
        "stages": {"train": {"status": "running", "done": 30, "total": 100, "unit": "steps"}},
        "ranks": ranks,
    }
    prog = train_view.render(live.Cursor(), info, False, False)[4 + len(train_view.STAGES)]
    assert "rank 1 (pid 4101 on gpu-a): running train 30/100 steps, 1.50/s" in prog
    assert "rank 2 (pid 4202 on gpu-b): waiting" in prog
    assert prog.index("Now: **") < prog.index("rank 1") < prog.index("rank 2")
    ended = train_view.render(live.Cursor(), {**info, "status": "done"}, False, False)
    ended = ended[4 + len(train_view.STAGES)]
    assert isinstance(ended, str) and "rank 1" not in ended  # ranks show while the run runs


def test_kill_is_neutral_until_the_run_is_stalled():
    from gguf_trainer.ui import train_view

    base = {"message": "m", "mock": False, "stages": {}}
    running = train_view.render(live.Cursor(), {**base, "status": "running"}, False, False)[3]
    stalled = train_view.render(live.Cursor(), {**base, "status": "stalled"}, False, False)[3]
    assert running["variant"] == "secondary" and running["interactive"] is True
    assert stalled["variant"] == "stop"


def test_a_new_project_starts_on_the_reference_pack():
    """The picker is sorted by family (Boogu Image comes first), yet a newcomer's default is
    the first registered pack, PixArt, the one the demo and the README start with."""
    from gguf_trainer.packs import pack_ids

    app = build_app()
    picker = next(b for b in app.blocks.values() if getattr(b, "elem_id", None) == "new-pack")
    assert picker.value == pack_ids()[0] == "t5xxl_pixart"
    assert picker.choices[0][1] != "t5xxl_pixart"  # the sort alone would have picked another
    # issue 31 item 6: the description under it described Boogu (the first by family)
    info = next(b for b in app.blocks.values() if getattr(b, "elem_id", None) == "pack-info")
    assert info.value.startswith("**PixArt") and "Boogu" not in info.value
    # item 7: a label names its family once
    assert all(label.count("Boogu Image") == 1 for label, pid in picker.choices
               if pid == "qwen3vl_boogu")


def test_the_output_tab_follows_a_verify_job_by_itself(tick, tmp_path):
    """Issue 31 item 3: the verify job ended in ~5 s, but the Output tab said "Re-reading every
    shard…" until Refresh (only a state.json change re-read it). A job's own state file
    changing is seen by the next tick."""
    from gguf_trainer.runner import jobs

    root = tmp_path / "p"
    create_project(root, "t5xxl_pixart")
    st = empty_state()
    st.update(status="done", stage="train", step=10, steps=10)
    atomic.write_json(root / "state.json", st)
    cur = live.Cursor()
    tick(str(root), cur, "pipeline", True, False)
    record = {"schema": 1, "name": "verify", "job_id": "j1", "status": "done", "pid": None,
              "started": 1.0, "finished": 2.0, "error": None, "progress": {},
              "result": {"lines": ["shards: 2 of 2 whole", "checkpoints: 1 of 1 whole"]}}
    atomic.write_json(jobs.state_path(root, "verify"), record)
    out = tick(str(root), cur, "pipeline", True, False)  # state.json did not change
    assert "shards: 2 of 2 whole" in out[-1], out[-1]
    assert all(is_skip(v) for v in tick(str(root), cur, "pipeline", True, False))


def test_a_never_run_project_shows_applied_steps_at_once(tick, tmp_path):
    """Issue 31 item 4: with no state.json the signature was None, so project.json's change
    (Apply, or `set`) was never seen until a reload."""
    from gguf_trainer.store.project import update_settings
    from gguf_trainer.ui import train_view

    root = tmp_path / "p"
    create_project(root, "t5xxl_pixart", overrides={"train.steps": 800})
    n = len(train_view.STAGES)
    cur = live.Cursor()
    assert tick(str(root), cur, "pipeline", True, False)[9 + n] == "800"
    update_settings(root, {"train.steps": 1200})
    assert tick(str(root), cur, "pipeline", True, False)[9 + n] == "1200"


def test_a_done_run_short_of_the_plan_says_so_once():
    """Issue 31 item 4: "DONE · done · step 680 / 1500" with the precompute stages "pending"
    after Export from best.pt on a stopped run; "DONE · done · step 40 / 200" after Apply 200
    on a finished 40-step run; val cos above best val cos with nothing saying why."""
    from gguf_trainer.ui import train_view

    export_only = {"status": "done", "message": "done", "step": 680, "steps": 1500,
                   "stages": {"export": {"status": "done"}, "eval": {"status": "done"}}}
    text = train_view.banner_text(export_only, 1500)
    assert "done ·" not in text.lower().replace("**done**", "")
    assert "exported and evaluated from best.pt" in text and "step 680 / 1500" in text
    assert "Resume" in text
    label, _ = train_view.stage_text("precompute", None, in_run=False)
    assert "pending" not in label and "not in the last run" in label
    label, _ = train_view.stage_text("corpus", {"status": "done", "skipped": True})
    assert "already done" not in label and "done earlier" in label
    finished = {"status": "done", "message": "done",
                "stages": {"train": {"status": "done", "done": 40, "total": 40}}}
    text = train_view.banner_text(finished, 200)
    assert "stopped short" in text and "step 40 / 200" in text and "exported" not in text
    assert train_view.banner_text(finished, 40) == "**DONE** · step 40 / 40"
    metrics = train_view.metrics_md({"val_cos": 0.7929, "best_val_cos": 0.7777}, live.Cursor())
    assert "val cos (last check) | 0.7929" in metrics
    assert "best val cos (best.pt) | 0.7777" in metrics
    assert "snapshot" in metrics
