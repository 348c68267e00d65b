"""Output tab › Kept steps (train.history, data/kept_steps.py): the table of kept steps (step,
validation figures, size, when and why kept) with the total on disk, and Export / Delete of the
step chosen in the row picker; plus the quantized export's comparison with f16 (eval.json
"quantized") and, for the Setup tab, what the saved schedule will make before the run.

Everything goes through the control API (exporting a kept step is a snapshot job, deleting
one follows the ownership rule there); nothing here loads torch.

    parts = build(); render(project) -> updates for outputs(parts); wire(parts, project)
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from gguf_trainer.base.errors import UserError
from gguf_trainer.runner import control
from gguf_trainer.ui import common

NO_KEPT = ("No kept steps. Turn on **Keep steps for later export** (Setup › Training, "
           "`train.history`) before a run to keep chosen steps and export any of them later.")


@dataclass
class KeptParts:
    table: gr.Markdown
    pick: gr.Dropdown
    export: gr.Button
    delete: gr.Button


def build() -> KeptParts:
    table = gr.Markdown("", elem_id="out-kept")
    with gr.Row():
        pick = gr.Dropdown([], label="Kept step", value=None, scale=2, elem_id="kept-pick")
        export = gr.Button("Export this step", scale=1, elem_id="btn-kept-export")
        delete = gr.Button("Delete this step", scale=1, variant="stop", elem_id="btn-kept-delete")
    return KeptParts(table, pick, export, delete)


def outputs(p: KeptParts) -> list:
    return [p.table, p.pick]


def kept_md(kept: dict) -> str:
    """The table: one row per kept step, newest first, and the total on disk."""
    items = list(reversed(kept["items"]))
    if not items:
        return "### Kept steps\n" + NO_KEPT + f"\n\n_{kept['schedule']}_"
    rows = [[it["step"], common.fmt((it.get("val") or {}).get("val_cc_tokens")),
             common.fmt(it.get("val_cos")), common.fmt(it.get("best_val_cos")),
             common.fmt_size(it.get("size")), common.fmt_time(it.get("time")),
             it.get("reason") or "—"] for it in items]
    table = common.md_table(["step", "val cc (tokens)", "val cos", "best then", "size", "kept",
                             "why"], rows)
    return (f"### Kept steps\n{table}\n\n**{len(items)} kept step(s), "
            f"{common.fmt_size(kept['total'])} on disk.** Pick one to export it (a snapshot "
            "GGUF, exactly as a snapshot taken at that step) or delete it.")


def quant_md(ev: dict | None) -> str:
    """eval.json's quantized comparison in one line; "" for an f16 export."""
    q = (ev or {}).get("quantized")
    if not isinstance(q, dict) or not isinstance(q.get("cos_centered_drop"), int | float):
        return ""
    return (f"**{q['dtype']} against f16** (the same checkpoint, the val shards): centred cosine "
            f"{q['cos_centered']:.4f} vs {q['cos_centered_f16']:.4f} (drop "
            f"{q['cos_centered_drop']:.2e}), the rows' cosine to f16 {q['cos_to_f16']:.6f}; "
            f"{common.fmt_size(q['bytes'])} vs {common.fmt_size(q['f16_bytes'])}.")


def render(project: str | None) -> list:
    if not project:
        return ["", gr.update(choices=[], value=None)]
    kept = control.list_kept_steps(project)
    choices = [str(it["step"]) for it in reversed(kept["items"])]
    return [kept_md(kept), gr.update(choices=choices, value=choices[0] if choices else None)]


def plan_md(project: str | None) -> str:
    """Setup tab: how many files the saved schedule makes and their size, before the run."""
    if not project:
        return ""
    try:
        plan = control.kept_plan(project)
    except UserError as e:  # a project.json that does not read: its own sentence shows elsewhere
        return f"Kept steps: {e}"
    return f"**Kept steps:** {plan['text']}."


def _step(choice) -> int:
    try:
        return int(choice)
    except (TypeError, ValueError):
        raise UserError("pick a kept step first (the list under Kept steps)") from None


def wire(p: KeptParts, project: gr.State) -> None:
    @common.shown_errors
    def do_export(proj, choice):
        step = _step(choice)
        job = control.request_snapshot(common.need_project(proj), f"step{step}")
        common.info(f"exporting kept step {step} (pid {job.get('pid')}); it shows under "
                    "Snapshots when written")

    @common.shown_errors
    def do_delete(proj, choice):
        step = _step(choice)
        control.delete_kept_step(common.need_project(proj), step)
        common.info(f"kept step {step} deleted")
        return render(proj)

    p.export.click(do_export, [project, p.pick], None, api_visibility="private")
    p.delete.click(do_delete, [project, p.pick], outputs(p), api_visibility="private")
