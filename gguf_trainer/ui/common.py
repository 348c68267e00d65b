"""Helpers every tab uses: errors as one sentence, number formatting.

Every action of the GUI goes through runner/control/ (the functions the CLI calls).
"""

from __future__ import annotations

import functools
import html
import math
import re
import time

import gradio as gr

from gguf_trainer.base.errors import UserError


def user_errors(fn):
    """UI handlers: a UserError becomes a gr.Error toast with its sentence (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            raise gr.Error(str(e), print_exception=False) from None

    return wrapper


def toast_html(text: str) -> str:
    """A toast's text as Gradio shows it: Gradio sets a toast's message as (sanitized) HTML,
    so a `<placeholder>` or a path with `<` would vanish and line breaks would run into one
    paragraph. Escaped, each line of `text` on its own line."""
    return "<br>".join(html.escape(line, quote=False) for line in str(text).splitlines())


def info(text: str, title: str | None = None) -> None:
    """An information toast (Gradio shows the newest of a kind: see app.CSS). No Gradio
    timer (duration None): app.TOAST_JS closes the box 10 s after its newest toast."""
    gr.Info(toast_html(text), duration=None, **({"title": title} if title else {}))


def warn(text: str, title: str | None = None) -> None:
    """A warning toast: what was not done and why (closed as info's)."""
    gr.Warning(toast_html(text), duration=None, **({"title": title} if title else {}))


def shown_errors(fn):
    """Page event handlers: a UserError becomes one warning toast with its sentence in GUI
    words, and the event's outputs stay as they were (gr.skip()). Raising gr.Error instead
    would leave a red "Error" badge on every output until its next update. (API endpoints
    use user_errors: a client gets the sentence as an error.)"""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            warn(gui_words(str(e)), title="Not done")
            return gr.skip()

    return wrapper


# The CLI's instructions, as the GUI says them (control's sentences name commands).
_GUI_WORDS = (
    (re.compile(r"check the --project path"), "choose the project folder again"),
    (re.compile(r"`?gguf-trainer start --project \S+?`? continues"), "Start (Resume) continues"),
    (re.compile(r"\(?gguf-trainer download --project \S+ --id \S+, or Download under Setup → "
                r"Materials\)?"), "(Download under Setup → Materials)"),
    (re.compile(r"\(?`?gguf-trainer link --project .+? (\w+) PATH`?\)?( or `gguf-trainer set "
                r"--project \S+ materials\.\S+\.path=PATH`)?"),
     r"(Setup → Materials: Replace, or the \1 path field)"),
    (re.compile(r"`?gguf-trainer stop --project \S+?`?(?=[ ;,.)]|$)"), "Stop on the Train tab"),
    (re.compile(r" \(killed on request with gguf-trainer kill\)"), " (killed with Kill)"),
    (re.compile(r"--project DIR"), "the project folder"),
    # render.py's sentences: the GUI has its own field for each of the CLI's options
    (re.compile(r"with `gguf-trainer render --(?:file \"<[^<>]*>=PATH\"|ggk PATH|models DIR)` "
                r"\(remembered\) or in "), "in "),
)


def gui_words(text: str) -> str:
    """`text` with the CLI's commands replaced by where the same thing is done in the GUI."""
    for pattern, words in _GUI_WORDS:
        text = pattern.sub(words, text)
    return text


def need_project(project: str | None) -> str:
    if not project:
        raise UserError("open or create a project first (Setup tab)")
    return project


def fmt(v, digits: int = 4) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "—"
        return (
            f"{v:.{digits}g}"
            if abs(v) < 1e-3 or abs(v) >= 1e5
            else f"{v:.{digits}f}".rstrip("0").rstrip(".")
        )
    return str(v)


def fmt_size(n: float | None) -> str:
    if n is None:
        return "—"
    # decimal units, as the CLI and the packs' sizes (9.5 GB is 9.5e9 bytes, not 8.8 GiB)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def fmt_time(t: float | None) -> str:
    if not t:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def md_table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table; cells are escaped for pipes."""

    def cell(v):
        return str(v).replace("|", "\\|").replace("\n", " ")

    if not rows:
        return ""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(out)
