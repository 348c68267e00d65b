"""The Precompute section's memory pre-flight verdict, asked in a one-shot subprocess.

The GUI process never imports torch, so the verdict comes from
`python -m gguf_trainer.ui.preflight PROJECT`, which calls the planner precompute itself
calls before any weights load (precompute_context.plan_teacher) and prints one JSON line: {"ok",
"mode", "budgets", "warnings", "error", "device"}. No decision is taken here.

    verdict(project_dir) -> dict          # in the GUI process (spawns the probe)
"""

from __future__ import annotations

import json
import subprocess
import sys

PROBE_TIMEOUT_S = 180.0


def verdict(project: str) -> dict:
    """Run the probe; {"ok": False, "error": sentence} when it could not answer."""
    try:
        res = subprocess.run([sys.executable, "-m", "gguf_trainer.ui.preflight", str(project)],
                             capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return {
            "ok": False,
            "error": f"the pre-flight check took over {PROBE_TIMEOUT_S:.0f}s; try again",
        }
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (res.stderr.strip().splitlines() or ["no answer"])[-1]
        return {"ok": False, "error": f"the pre-flight check failed: {tail}"}
    return json.loads(lines[-1])


def _probe(project_dir: str) -> dict:
    from gguf_trainer.base.errors import UserError
    from gguf_trainer.machine import hardware
    from gguf_trainer.stages.precompute_context import plan_teacher
    from gguf_trainer.store.project import load_project

    try:
        project = load_project(project_dir)
        device = hardware.resolve_device(project.settings.precompute.device)
        planned = plan_teacher(project, device)
    except UserError as e:
        return {"ok": False, "error": str(e)}
    plan, b = planned.plan, planned.plan.budgets
    return {
        "ok": True,
        "device": str(device),
        "mode": plan.mode,
        "teacher_gib": planned.need_gib,
        "gpu_gib": plan.gpu_gib,
        "cpu_gib": plan.cpu_gib,
        "warnings": planned.warnings,
        "budgets": {
            "teacher_batch": b.teacher_batch,
            "tok_budget": b.tok_budget,
            "student_batch": b.student_batch,
            "student_tok_budget": b.student_tok_budget,
        },
    }


def to_markdown(v: dict) -> str:
    if not v.get("ok"):
        return f"**Pre-flight: refused.** {v.get('error')}"
    b = v["budgets"]
    text = (
        f"**Pre-flight: fits.** Teacher mode **{v['mode']}** on `{v['device']}` "
        f"(teacher ≈ {v['teacher_gib']:.1f} GiB; GPU limit {v['gpu_gib']:.1f} GiB, RAM limit "
        f"{v['cpu_gib']:.1f} GiB). Budgets: teacher batch {b['teacher_batch']}, "
        f"{b['tok_budget']} tokens; student batch {b['student_batch']}, {b['student_tok_budget']} "
        "tokens."
    )
    for w in v.get("warnings") or []:
        text += f"\n\n⚠ {w}"
    return text


if __name__ == "__main__":
    print(json.dumps(_probe(sys.argv[1])), flush=True)
