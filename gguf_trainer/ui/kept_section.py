"""Output tab › Kept steps (train.history, data/kept_steps.py): the table of kept steps (step,
validation figures, size, when and why kept) with the total on disk, and a row per step with
its Export and Delete (rendered from the list of steps: a tick that changes it redraws them);
plus the quantized export's comparison with f16 (eval.json "quantized") and, for the Setup
tab, what the saved schedule will make before the run.

Everything goes through the control API (exporting a kept step is a snapshot job, deleting
one follows the ownership rule there); nothing here loads torch.

    parts = build(); render(project) -> updates for outputs(parts); wire(parts, project)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import gradio as gr

from gguf_trainer.base.errors import UserError
from gguf_trainer.runner import control
from gguf_trainer.ui import common

NO_KEPT = ("No kept steps. Turn on **Keep steps for later export** (Setup › Training, "
           "`train.history`) before a run to keep chosen steps and export any of them later.")


@dataclass
class KeptParts:
    table: gr.Markdown
    rows: gr.Column  # one row per kept step, its Export and Delete (rendered in wire)
    steps: gr.State  # the kept steps shown, newest first: the rows are rendered from it


def build() -> KeptParts:
    table = gr.Markdown("", elem_id="out-kept")
    rows = gr.Column(elem_id="kept-rows")
    steps = gr.State([])
    return KeptParts(table, rows, steps)


def outputs(p: KeptParts) -> list:
    return [p.table, p.steps]


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
            f"{common.fmt_size(kept['total'])} on disk.** Each step's **Export** writes its "
            "snapshot GGUF (exactly as a snapshot taken at that step), **Delete** removes it.")


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
        return ["", []]
    kept = control.list_kept_steps(project)
    return [kept_md(kept), [int(it["step"]) for it in reversed(kept["items"])]]


def plan_md(project: str | None) -> str:
    """Setup tab: how many files the saved schedule makes and their size, before the run."""
    if not project:
        return ""
    try:
        plan = control.kept_plan(project)
    except UserError as e:  # a project.json that does not read: its own sentence shows elsewhere
        return f"Kept steps: {e}"
    return f"**Kept steps:** {plan['text']}."


@common.shown_errors
def export_step(step: int, proj):
    """Export kept step `step` as a snapshot job (the row's Export)."""
    job = control.request_snapshot(common.need_project(proj), f"step{int(step)}")
    common.info(f"exporting kept step {step} (pid {job.get('pid')}); it shows under "
                "Snapshots when written")


@common.shown_errors
def delete_step(step: int, proj):
    """Delete kept step `step` (the row's Delete); the table and rows again."""
    control.delete_kept_step(common.need_project(proj), int(step))
    common.info(f"kept step {step} deleted")
    return render(proj)


def wire(p: KeptParts, project: gr.State) -> None:
    with p.rows:
        # the table changes whenever the steps do: its change redraws the rows
        @gr.render(inputs=[p.steps], triggers=[p.table.change])
        def rows(steps):
            for step in steps or []:
                with gr.Row(equal_height=True):
                    gr.Markdown(f"**step {step}**")
                    export = gr.Button("Export", size="sm", scale=0, min_width=90,
                                       elem_id=f"btn-kept-export-{step}")
                    delete = gr.Button("Delete", size="sm", scale=0, min_width=90,
                                       variant="stop", elem_id=f"btn-kept-delete-{step}")
                export.click(partial(export_step, step), [project], None,
                             api_visibility="private")
                delete.click(partial(delete_step, step), [project], outputs(p),
                             api_visibility="private")
