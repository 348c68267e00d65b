"""Train tab › what a tick shows: the banner, the stage strip, the progress line, the
metrics table, the two charts and the live hardware readings, as updates.

Pure views of `control.status()` and the metrics read by live.py: nothing here writes,
starts or waits on anything, so a run started from the CLI, another browser or before a
GUI restart shows up on the next tick. train_tab.py builds the components and wires them.

    ups = render(cur, info, plot_changed, log10)  # in train_tab.tick_outputs() order
"""

from __future__ import annotations

import gradio as gr
import pandas as pd

from gguf_trainer.base.errors import UserError
from gguf_trainer.runner import control
from gguf_trainer.runner.ranks import format_ranks  # torch-free: the status lines per rank
from gguf_trainer.runner.status import format_eta
from gguf_trainer.stages.stage_list import STAGES, stage_title
from gguf_trainer.ui import common, hardware, live

ACTIVE = ("running", "stalled")
STAGE_CLASSES = ("stage", "stage-box")
# No data is None, never an empty DataFrame: a LinePlot that starts from an empty frame draws
# no lines for the data that arrives later (Gradio 6.31).
EMPTY_CHART = None
CHART_PX = 340
# steps/s is not among them: the one rate shown is the training stage's (step_rate).
METRIC_LABELS = {
    # the centred cosine of the val rows the DiT reads first (data/dit_rows.py)
    "val_cc_tokens": "val centred cos, tokens (last check)",
    "val_cc_pads": "val centred cos, pads (last check)",
    "loss": "loss",
    "cos": "train cos",
    "val_cos": "val cos (last check)",
    "best_val_cos": "best val cos (best.pt)",
    "lr": "learning rate",
    "mse": "mse",
    "rel_mse": "rel mse",
    "val_rel_mse": "val rel mse",
}


# ---- charts ---------------------------------------------------------------------------
def series_chart(title: str, elem_id: str, what: str, colors: dict[str, str]):
    """A line chart of `series` over `step` whose legend names every series in `colors`."""
    return gr.LinePlot(
        EMPTY_CHART,
        x="step",
        y="value",
        color="series",
        height=CHART_PX,
        title=title,
        elem_id=elem_id,
        label=what,
        x_title="step",
        y_title=what,
        color_title="",
        color_map=colors,
        colors_in_legend=list(colors),
    )


def chart(cur: live.Cursor, names: dict, log10: bool = False, planned: int | None = None):
    """The series as a LinePlot update whose step axis runs to the planned steps (it moves
    when they change), so the line's length says how far the run is."""
    df = pd.DataFrame(live.chart_rows(cur, names, log10))
    return gr.update(value=df if len(df) else EMPTY_CHART, x_lim=[0, planned] if planned else None)


# ---- texts ------------------------------------------------------------------------
def run_label(info: dict) -> str:
    return {"idle": "Start", "interrupted": "Resume", "stopped": "Resume"}.get(
        info.get("status"), "Start / Resume"
    )


def is_stopping(info: dict) -> bool:
    """control.status's flag: a stop was requested and the run is still alive."""
    return bool(info.get("stopping")) and info.get("status") in ACTIVE


def step_counts(info: dict, planned: int | None = None) -> tuple:
    """(done, planned) training steps: the one pair the banner, the stage box, the metrics
    table and the Planned steps box all show. done is the training stage's own count (the
    run's state), planned is project.json's train.steps (what Start saved or Apply set; a
    running trainer picks it up within log_every steps), else what the run recorded."""
    train = (info.get("stages") or {}).get("train") or {}
    done = train.get("done") if train.get("done") is not None else info.get("step")
    total = planned if planned is not None else (train.get("total") or info.get("steps"))
    return done, total


def step_rate(info: dict) -> tuple:
    """(steps/s, eta_s) of a live training stage: the stage's recent throughput, the one
    smoothed rate shown (its ETA is remaining / rate); (None, None) when nothing trains."""
    train = (info.get("stages") or {}).get("train") or {}
    if info.get("status") not in ACTIVE or train.get("status") != "running":
        return None, None
    return train.get("rate"), train.get("eta_s")


def _counts_text(info: dict, planned: int | None) -> str:
    done, total = step_counts(info, planned)
    if done is None:
        return ""
    return f"step {common.fmt(done)} / {common.fmt(total)}"


def short_of_plan(info: dict, planned: int | None) -> str:
    """For a run that ended "done" with training short of the planned steps (an export from
    best.pt after a stop, or Apply of more steps after the end): what was done and what is
    left, else ""."""
    done, total = step_counts(info, planned)
    if info.get("status") != "done" or done is None or not total or done >= total:
        return ""
    ran = set(info.get("stages") or {})
    how = "exported and evaluated from best.pt; " if ran and "train" not in ran else ""
    return f"{how}training stopped short of the planned steps"


def banner_text(info: dict, planned: int | None = None) -> str:
    """The run's state in words, with the step counts; never the ETA (shown once, in the
    progress line) and never a raw dict."""
    status = info.get("status") or "idle"
    counts = _counts_text(info, planned)
    message = common.gui_words(str(info.get("message") or ""))
    if message == status:  # "DONE · done": the word once
        message = ""
    short = short_of_plan(info, planned)
    if short:
        message = short
    if status in ACTIVE and status != "stalled":  # its message repeats the counts and the ETA
        stage = info.get("stage")
        message = f"pid {info.get('pid')}" + (
            f" · {stage_title(stage)}" if stage else " · starting"
        )
    text = f"**{status.upper()}**" + "".join(f" · {part}" for part in (message, counts) if part)
    if is_stopping(info):
        text = f"**STOPPING…** · finishing the current step, then saving · {message}" + (
            f" · {counts}" if counts else ""
        )
    if status == "stalled":
        text += " — **Kill** it, then **Resume** from the last checkpoint."
    if status == "interrupted":
        text += " — press **Resume** to continue from the last checkpoint."
    if short:
        text += " — press **Start / Resume** to train the rest."
    if info.get("mock"):
        text = (
            "**MOCK teacher run** (synthetic targets: a smoke test, not a usable adapter) · " + text
        )
    job = (info.get("jobs") or {}).get("snapshot") or {}
    if job.get("status") == "running":
        phase = (
            (job.get("progress") or {}).get("phase")
            if isinstance(job.get("progress"), dict)
            else None
        )
        text += f"\n\nSnapshot export running (pid {job.get('pid')})" + (
            f": {phase}" if phase else ""
        )
    elif job.get("status") == "failed":
        text += f"\n\nLast snapshot export failed: {job.get('error')}"
    if info.get("settings_error"):
        text += f"\n\n⚠ project.json: {info['settings_error']}"
    return text


def stage_text(name: str, st: dict | None, counts: tuple | None = None,
               in_run: bool = True) -> tuple[str, str]:
    """(button label, status class) of one stage box; `counts` (step_counts) for training.
    `in_run` False: the last run did not include the stage (an export-only run), so it is
    not "pending" but as an earlier run left it. No ETA here: it is shown once, in the
    progress line."""
    st = st or {}
    status = st.get("status") or "pending"
    word = status
    if st.get("skipped"):
        status, word = "done", "done earlier"
    elif not st and not in_run:
        status, word = "pending", "not in the last run"
    lines = [stage_title(name), word]
    done, total = counts if counts and counts[0] is not None else (st.get("done"), st.get("total"))
    if total is not None and done is not None:
        lines.append(f"{common.fmt(done)}/{common.fmt(total)} {st.get('unit') or 'steps'}".strip())
    if name == "train" and st.get("best_val_cos") is not None:
        lines.append(f"best val cos {common.fmt(st['best_val_cos'])}")
    if st.get("detail"):
        lines.append(str(st["detail"])[:60])
    return "\n".join(lines), f"stage-{status}"


def ranks_md(info: dict) -> str:
    """A launched run's other ranks, one line each, as `status` prints them (empty when the
    run runs alone or is not running)."""
    lines = format_ranks(info)
    if not lines:
        return ""
    return "\n\nOther ranks (rank 0 is the run above):\n" + "\n".join(
        f"* {line.strip()}" for line in lines
    )


def progress_text(info: dict, counts: tuple) -> str:
    """The progress line: the stage now running with its count, rate and ETA (the one place
    the ETA is shown; `counts` (step_counts) for training), the other ranks, the last error."""
    status = info.get("status")
    stage = (info.get("stages") or {}).get(info.get("stage") or "") or {}
    prog = ""
    if status in ACTIVE and info.get("stage"):
        prog = f"Now: **{stage_title(info['stage'])}**"
        done, total = (
            counts if info["stage"] == "train" else (stage.get("done"), stage.get("total"))
        )
        if total:
            unit = stage.get("unit") or ""
            prog += f" — {common.fmt(done)}/{common.fmt(total)} {unit}".rstrip()
            if stage.get("rate"):
                prog += f" · {common.fmt(stage['rate'], 3)} {unit or 'units'}/s"
            prog += f" · ETA {format_eta(stage.get('eta_s')) if status == 'running' else '—'}"
    prog += ranks_md(info)
    if info.get("error"):
        prog += f"\n\nLast error: {info['error']}"
    return prog


def metrics_md(info: dict, cur: live.Cursor, planned: int | None = None) -> str:
    done, total = step_counts(info, planned)
    rate, _eta = step_rate(info)
    rows = [
        ["step", f"{common.fmt(done)} / {common.fmt(total)}"],
        ["steps/s", common.fmt(rate, 3)],
    ]  # "—" when nothing trains
    values = {key: info.get(key) if info.get(key) is not None else cur.latest.get(key)
              for key in METRIC_LABELS}
    for key, label in METRIC_LABELS.items():
        if values[key] is not None:
            rows.append([label, common.fmt(values[key])])
    val, best = values["val_cos"], values["best_val_cos"]
    if val is not None and best is not None and val > best:  # one reading of both rows
        why = "the last check was a snapshot's: best.pt is picked at scheduled checks only"
        rows.append(["note", why])
    return "#### Current metrics\n" + common.md_table(["metric", "value"], rows)


def hardware_md(info: dict) -> str:
    m = hardware.machine()
    lines = [
        "#### Live hardware",
        (
            f"* CPU {m['cpu_percent']:.0f}% of {m['cpu_count']} threads · "
            f"RAM {m['ram_used_gib']:.1f} / {m['ram_total_gib']:.1f} GiB"
        ),
    ]
    if m["gpus"] is None:
        lines.append(f"* GPU: {hardware.NO_NVIDIA}")
    for g in m["gpus"] or []:
        lines.append(
            f"* GPU {g['index']} {g['name']}: {g['vram_used_gib']:.1f} / "
            f"{g['vram_total_gib']:.1f} GiB, {common.fmt(g.get('util_percent'))}% util"
        )
    proc = hardware.pipeline_process(info.get("pid")) if info.get("status") in ACTIVE else None
    if proc is None:
        lines.append("* Pipeline process: not running")
    else:
        gpu = "no NVIDIA driver" if proc["gpu_mib"] is None else f"{proc['gpu_mib']:.0f} MiB"
        lines.append(
            f"* Pipeline (pid {proc['pid']}): CPU {proc['cpu_percent']:.0f}% · RSS "
            f"{proc['rss_gib']:.2f} GiB incl. {proc['children']} child process(es) · GPU {gpu}"
        )
    return "\n".join(lines)


# ---- the tick -------------------------------------------------------------------------
def steps_value(project: str | None) -> str:
    """project.json's train.steps as the Planned steps box shows it ("" when unreadable)."""
    if not project:
        return ""
    try:
        return str(control.read_settings(project).values["train"]["steps"])
    except UserError:  # broken project.json or no project: the banner says so
        return ""


def planned_steps(project: str | None) -> int | None:
    """project.json's train.steps, or None (no project, or a broken file the banner names)."""
    value = steps_value(project)
    return int(value) if value.isdigit() else None


def render(cur: live.Cursor, info: dict, plot_changed: bool, log10: bool) -> list:
    """Updates for train_tab.tick_outputs(), in its order; gr.skip() for whatever this tab
    already shows."""

    def put(key, value):
        return value if cur.changed(key, repr(value)) else gr.skip()

    status = info.get("status")
    active = status in ACTIVE
    stopping = is_stopping(info)
    planned = planned_steps(info.get("project"))
    counts = step_counts(info, planned)
    out = [
        put("banner", banner_text(info, planned)),
        put(
            "start",
            gr.update(
                value=run_label(info), interactive=not active and not info.get("settings_error")
            ),
        ),
        put(
            "stop",
            gr.update(
                value="Stopping…" if stopping else "Stop", interactive=active and not stopping
            ),
        ),
        put(
            "kill",
            gr.update(interactive=active, variant="stop" if status == "stalled" else "secondary"),
        ),
    ]
    ran = info.get("stages") or {}
    for name in STAGES:
        label, cls = stage_text(
            name, ran.get(name), counts if name == "train" else None, in_run=not ran or name in ran
        )
        clickable = name in ("export", "eval") and not active
        out.append(
            put(
                f"stage-{name}",
                gr.update(value=label, elem_classes=[*STAGE_CLASSES, cls], interactive=clickable),
            )
        )
    out.append(put("progress", progress_text(info, counts)))
    out.append(put("metrics", metrics_md(info, cur, planned)))
    if plot_changed or cur.changed("log10", log10) or cur.changed("planned_axis", planned):
        out += [
            chart(cur, live.LOSS_SERIES, log10, planned),
            chart(cur, live.COS_SERIES, False, planned),
        ]
    else:
        out += [gr.skip(), gr.skip()]
    # the box follows project.json (Start saved it, Apply, the CLI) only when that changed,
    # so what the user is typing is not overwritten by every tick
    out.append(put("planned", str(planned)) if planned is not None else gr.skip())
    return out
