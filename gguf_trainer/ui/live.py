"""What a timer tick reads: only new bytes, at most MAX_POINTS per series, nothing when idle.

The pipeline writes state.json (atomically replaced) and appends metrics.jsonl and logs.
A `Cursor` (one per browser tab, kept in `gr.State`) remembers how far this tab has read:
the state file's (mtime, size), the metrics byte offset, the thinned series and the log
offset. It is display bookkeeping only; what runs is always re-read from the project, so a
reload, a second browser or a restarted GUI start from a fresh cursor and see the same run.

Thinning keeps every `stride`-th row of a series; when a series passes MAX_POINTS the kept
points are halved and the stride doubled, so a tick costs O(new rows), and the plot is
re-sent only when a kept point was added: a 20k-step history costs a tick what a 100-step
one does (benchmarks/bench_gui_tick.py).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.jsonvals import finite_number
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.base.project_file import UnsafeProjectFile
from gguf_trainer.runner.state import read_metrics

MAX_POINTS = 2000
LOG_KEEP_CHARS = 200_000
# metrics.jsonl keys -> chart series
LOSS_SERIES = {"loss": "loss"}
# The centred cosine of the val token rows the DiT reads leads (data/dit_rows.py: a plain cosine
# of a pre-norm tap stays high for almost any prediction); the plain cosines stay beside it.
COS_SERIES = {"val_cc_tokens": "val centred cos", "cos": "train cos", "val_cos": "val cos"}


@dataclass
class Series:
    """One thinned series: every `stride`-th row offered is kept, at most MAX_POINTS."""

    stride: int = 1
    seen: int = 0
    xs: list = field(default_factory=list)
    ys: list = field(default_factory=list)

    def add(self, x: float, y: float) -> bool:
        kept = self.seen % self.stride == 0
        self.seen += 1
        if kept:
            self.xs.append(x)
            self.ys.append(y)
            if len(self.xs) > MAX_POINTS:
                self.xs, self.ys = self.xs[::2], self.ys[::2]
                self.stride *= 2
        return kept


@dataclass
class Cursor:
    project: str | None = None
    state_sig: tuple | None = None
    metrics_offset: int = 0
    last_step: float = -math.inf
    series: dict = field(default_factory=dict)  # name -> Series
    latest: dict = field(default_factory=dict)  # newest value of every metrics key
    log_name: str = "pipeline"
    log_offset: int = 0
    log_text: str = ""
    shown: dict = field(default_factory=dict)  # component key -> hash of what it shows
    outputs_sig: tuple | None = None  # outputs_signature when the Output tab was last read
    outputs_busy: bool = False  # a job the Output tab follows was running then: read again

    def reset_for(self, project: str | None) -> None:
        self.__init__(project=project, log_name=self.log_name)  # type: ignore[misc]

    def changed(self, key: str, value) -> bool:
        """True (and remembered) when `value` differs from what this tab shows for `key`."""
        h = hash(repr(value))
        if self.shown.get(key) == h:
            return False
        self.shown[key] = h
        return True


def _file_sig(path) -> tuple | None:
    """(mtime_ns, size, inode) of a file: a changed signature means a new file; None when
    it is absent or unreadable."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def state_signature(paths: ProjectPaths) -> tuple:
    """state.json's file signature (None before the first run); whether a stop was requested
    (status's `stopping` changes without a state write); and project.json's (the planned
    steps every view shows come from it: Apply is seen, also on a project never run)."""
    return (_file_sig(paths.state_json), paths.stop_request.exists(),
            _file_sig(paths.project_json))


def outputs_signature(paths: ProjectPaths) -> tuple:
    """What the Output tab shows besides the run: exports.json, eval.json, snapshots.json
    and the state file of each job in the project folder (verify, snapshot). A job that ends
    changes it, so the tab follows the job by itself, with no Refresh."""
    jobs = sorted(paths.root.glob("*-job.json")) if paths.root.is_dir() else []
    return tuple(_file_sig(p) for p in
                 (paths.exports_json, paths.eval_json, paths.snapshots_json, *jobs))


def _num(v) -> float | None:
    v = finite_number(v)
    return None if v is None else float(v)


def read_new_metrics(cur: Cursor, paths: ProjectPaths) -> bool:
    """Append the rows written since the last call; True when a plotted point was added.
    A step going back (a resume truncated metrics.jsonl) restarts from scratch."""
    rows, offset = read_metrics(paths, cur.metrics_offset)
    if offset < cur.metrics_offset or (rows and _num(rows[0].get("step")) is not None
                                       and rows[0]["step"] < cur.last_step
                                       and cur.metrics_offset > 0):
        cur.series, cur.latest, cur.last_step = {}, {}, -math.inf
        rows, offset = read_metrics(paths, 0)
    cur.metrics_offset = offset
    added = False
    for row in rows:
        step = _num(row.get("step"))
        if step is None:
            continue
        cur.last_step = max(cur.last_step, step)
        for key, value in row.items():
            if key in ("step", "time"):
                continue
            y = _num(value)
            if y is None:
                continue
            cur.latest[key] = y
            if key in LOSS_SERIES or key in COS_SERIES:
                added |= cur.series.setdefault(key, Series()).add(step, y)
    return added


def chart_rows(cur: Cursor, names: dict[str, str], log10: bool = False) -> dict:
    """Long-format columns for a LinePlot: {"step": [...], "value": [...], "series": [...]}."""
    steps, values, labels = [], [], []
    for key, label in names.items():
        s = cur.series.get(key)
        if s is None:
            continue
        for x, y in zip(s.xs, s.ys):
            if log10:
                if y <= 0:
                    continue
                y = math.log10(y)
            steps.append(x)
            values.append(y)
            labels.append(label)
    if steps:
        # Gradio's LinePlot fixes its colour domain from the first data it draws: a series
        # that appears later (val cos after the first validation) would get no colour. One
        # NaN row per series still without points registers it and draws nothing.
        for key, label in names.items():
            if label not in labels:
                steps.append(steps[0])
                values.append(math.nan)
                labels.append(label)
    return {"step": steps, "value": values, "series": labels}


def read_new_progress(cur: Cursor, paths: ProjectPaths, line_of) -> bool:
    """The Logs tab's "Training progress" view: metrics.jsonl rows written since the last
    call, each through `line_of(row)`, appended to the tab's buffer; True if any. A resume
    that truncated the file restarts the view."""
    if cur.log_name != "progress":
        cur.log_name, cur.log_offset, cur.log_text = "progress", 0, ""
    rows, offset = read_metrics(paths, cur.log_offset)
    first = _num(rows[0].get("step")) if rows else None
    last = cur.shown.get("progress-step")
    # read_metrics itself restarts at 0 when the file was rewritten: a step going back says so
    restarted = offset < cur.log_offset or (
        first is not None and last is not None and first <= last)
    if restarted:
        cur.log_text = ""
    cur.log_offset = offset
    steps = [s for s in (_num(r.get("step")) for r in rows) if s is not None]
    if steps:
        cur.shown["progress-step"] = steps[-1]
    if not rows:
        return restarted
    cur.log_text = (cur.log_text + "".join(line_of(r) + "\n" for r in rows))[-LOG_KEEP_CHARS:]
    return True


def read_new_log(cur: Cursor, paths: ProjectPaths, name: str) -> bool:
    """Append the log's new text to the tab's buffer (last LOG_KEEP_CHARS); True if any."""
    from gguf_trainer.runner import control

    if name != cur.log_name:
        cur.log_name, cur.log_offset, cur.log_text = name, 0, ""
    try:
        text, offset = control.tail_log(paths.root, cur.log_offset, name)
    except UnsafeProjectFile as e:  # a link out of the project: say so, show nothing of it
        changed = cur.log_text != str(e)
        cur.log_offset, cur.log_text = 0, str(e)
        return changed
    except UserError:  # a log this version does not know, or the project went away
        return False
    restarted = offset < cur.log_offset
    cur.log_offset = offset
    if restarted:
        cur.log_text = ""
    if not text:
        return restarted
    cur.log_text = (cur.log_text + text)[-LOG_KEEP_CHARS:]
    return True
