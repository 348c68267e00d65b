"""Logs tab: the pipeline log, following, the snapshot and download job logs, and the
training progress (one line per metrics.jsonl row: the pipeline log has no line per step).

Each tick reads only the bytes appended since this tab's last read (control.tail_log, or the
metrics byte offset); the view keeps the last live.LOG_KEEP_CHARS characters. "Clear view"
clears the view only.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from gguf_trainer.runner import control
from gguf_trainer.ui import common, live

PROGRESS = "progress"  # not a log file: metrics.jsonl rows as lines (live.read_new_progress)
LOG_CHOICES = [
    ("Pipeline", "pipeline"),
    ("Training progress", PROGRESS),
    ("Snapshot job", "snapshot"),
    ("Download job", "download"),
]


@dataclass
class LogsParts:
    which: gr.Radio
    follow: gr.Checkbox
    clear: gr.Button
    text: gr.Textbox


def build() -> LogsParts:
    with gr.Row():
        which = gr.Radio(
            [c for c in LOG_CHOICES if c[1] in (*control.LOGS, PROGRESS)],
            value="pipeline",
            label="Log",
            elem_id="log-which",
        )
        follow = gr.Checkbox(True, label="Follow", elem_id="log-follow")
        clear = gr.Button("Clear view", scale=0)
    text = gr.Textbox(
        "",
        lines=28,
        max_lines=28,
        label="Log",
        autoscroll=True,
        interactive=False,
        elem_id="log-text",
        buttons=["copy"],
    )
    return LogsParts(which, follow, clear, text)


def render(cur: live.Cursor, paths, which: str, follow: bool):
    """The log text update for a tick: new text appended, or gr.skip()."""
    if not follow and which == cur.log_name:
        return gr.skip()
    if which == PROGRESS:
        changed = live.read_new_progress(cur, paths, progress_line)
    else:
        changed = live.read_new_log(cur, paths, which)
    if not changed and not cur.changed("log-which", which):
        return gr.skip()
    return cur.log_text or f"({which} log is empty or not written yet)"


PROGRESS_KEYS = (("loss", "loss"), ("cos", "train cos"), ("val_cc_tokens", "val centred cos"),
                 ("val_cc_pads", "pads"), ("val_cos", "val cos"), ("lr", "lr"))


def progress_line(row: dict) -> str:
    """One metrics row as a log line: time, step and the figures the charts show."""
    bits = [f"{label} {common.fmt(row[key])}" for key, label in PROGRESS_KEYS if key in row]
    return f"{common.fmt_time(row.get('time'))} step {common.fmt(row.get('step'))}: " + " · ".join(
        bits
    )


SCROLL_TO_END = (
    "() => { const t = document.querySelector('#log-text textarea'); "
    "if (t) { t.scrollTop = t.scrollHeight; } }"
)


def wire(p: LogsParts, cursor: gr.State, tab: gr.Tab) -> None:
    def clear(cur: live.Cursor):
        cur.log_text = ""
        return ""

    p.clear.click(clear, [cursor], [p.text])
    # Text that arrived while the tab was hidden did not scroll it: following means the end.
    tab.select(None, None, None, js=SCROLL_TO_END)
