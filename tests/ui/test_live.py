"""What a tick reads: only new metrics rows, at most MAX_POINTS per series, a restart when
a resume truncated the history, and the log's new bytes."""

from __future__ import annotations

import json

from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.ui import live


def write_rows(path, rows, mode="a"):
    with open(path, mode, encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_series_thins_to_max_points_and_keeps_the_first():
    s = live.Series()
    for i in range(10 * live.MAX_POINTS + 7):
        s.add(i, float(i))
    assert live.MAX_POINTS // 2 < len(s.xs) <= live.MAX_POINTS and s.xs[0] == 0 and s.stride == 16
    assert all(b - a == s.stride for a, b in zip(s.xs, s.xs[1:]))  # evenly spaced


def test_metrics_are_read_incrementally_and_restart_after_truncation(tmp_path):
    paths = ProjectPaths(tmp_path)
    (tmp_path / "project.json").write_text("{}")
    write_rows(
        paths.metrics_jsonl, [{"step": s, "loss": 1.0 / s, "cos": 0.1 * s} for s in (1, 2, 3)]
    )
    cur = live.Cursor(project=str(tmp_path))
    assert live.read_new_metrics(cur, paths) is True
    offset = cur.metrics_offset
    # nothing new
    assert live.read_new_metrics(cur, paths) is False and cur.metrics_offset == offset
    with open(paths.metrics_jsonl, "a") as f:
        f.write('{"step": 4, "loss": 0.2')  # a line being written is left for later
    assert live.read_new_metrics(cur, paths) is False and cur.metrics_offset == offset
    with open(paths.metrics_jsonl, "a") as f:
        f.write(', "val_cos": 0.5}\n')
    assert live.read_new_metrics(cur, paths) is True
    assert cur.series["val_cos"].xs == [4] and cur.latest["loss"] == 0.2
    # a resume truncated the history back to step 2 and continued differently
    write_rows(paths.metrics_jsonl, [{"step": 1, "loss": 9.0}, {"step": 2, "loss": 8.0}], mode="w")
    write_rows(
        paths.metrics_jsonl,
        [
            {"step": 3, "loss": 7.0},
            {"step": 4, "loss": 6.0},
            {"step": 5, "loss": 5.0},
            {"step": 6, "loss": 4.0},
        ],
    )
    live.read_new_metrics(cur, paths)
    assert cur.series["loss"].xs == [1, 2, 3, 4, 5, 6] and cur.series["loss"].ys[0] == 9.0
    rows = live.chart_rows(cur, live.LOSS_SERIES, log10=True)
    assert rows["series"] == ["loss"] * 6 and abs(rows["value"][0] - 0.9542) < 1e-3


def test_log_follows_new_bytes_only(tmp_path):
    paths = ProjectPaths(tmp_path)
    (tmp_path / "project.json").write_text('{"pack": "t5xxl_pixart", "name": "pig_x"}')
    paths.pipeline_log.write_text("one\ntwo\n")
    cur = live.Cursor(project=str(tmp_path))
    assert live.read_new_log(cur, paths, "pipeline") and cur.log_text == "one\ntwo\n"
    assert not live.read_new_log(cur, paths, "pipeline")
    with open(paths.pipeline_log, "a") as f:
        f.write("three\n")
    assert live.read_new_log(cur, paths, "pipeline") and cur.log_text.endswith("two\nthree\n")
    paths.pipeline_log.write_text("new\n")  # rotated / shorter: start over
    assert live.read_new_log(cur, paths, "pipeline") and cur.log_text == "new\n"


def test_a_series_without_points_is_registered_but_not_drawn():
    cur = live.Cursor()
    cur.series["cos"] = live.Series(xs=[5, 10], ys=[0.3, 0.4], seen=2)
    rows = live.chart_rows(cur, live.COS_SERIES)
    assert rows["series"] == ["train cos", "train cos", "val centred cos", "val cos"]
    assert rows["step"][2] == 5 and rows["value"][2] != rows["value"][2]  # NaN: no line
    assert rows["value"][3] != rows["value"][3]
    assert live.chart_rows(live.Cursor(), live.COS_SERIES)["step"] == []  # nothing yet: no rows


def test_the_training_progress_view_is_a_line_per_metrics_row(tmp_path):
    """Logs → Training progress: the pipeline log has no line per step; this view shows one
    per metrics row, reads only new rows, and restarts when a resume rewrote the file."""
    import json

    from gguf_trainer.base.paths import ProjectPaths
    from gguf_trainer.ui import live, logs_tab

    paths = ProjectPaths(tmp_path)
    rows = [{"step": s, "time": 1.7e9, "loss": 0.5 / s, "cos": 0.1 * s} for s in (5, 10)]
    paths.metrics_jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cur = live.Cursor()
    assert live.read_new_progress(cur, paths, logs_tab.progress_line)
    lines = cur.log_text.splitlines()
    assert len(lines) == 2 and "step 10: loss 0.05 · train cos 1" in lines[1]
    assert not live.read_new_progress(cur, paths, logs_tab.progress_line)  # nothing new
    paths.metrics_jsonl.write_text(json.dumps({"step": 5, "time": 1.7e9, "loss": 0.2}) + "\n")
    assert live.read_new_progress(cur, paths, logs_tab.progress_line)  # rewritten by a resume
    assert cur.log_text.count("\n") == 1 and "step 5: loss 0.2" in cur.log_text
