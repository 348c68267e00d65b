"""The GUI's memory pre-flight asks the planner precompute uses (precompute_context.plan_teacher):
the same mode and budgets, and the same refusal sentence."""

from __future__ import annotations

from gguf_trainer.machine import hardware
from gguf_trainer.stages.precompute_context import plan_teacher
from gguf_trainer.store.project import create_project, load_project
from gguf_trainer.ui import preflight


def test_the_probe_reports_the_plan_precompute_makes(tmp_path):
    root = tmp_path / "p"
    create_project(root, "t5xxl_pixart", overrides={"precompute.mock_teacher": True,
                                                    "precompute.device": "cpu"})
    got = preflight._probe(str(root))
    planned = plan_teacher(load_project(root), hardware.resolve_device("cpu"))
    b = planned.plan.budgets
    assert got["ok"] and got["mode"] == planned.plan.mode and got["device"] == "cpu"
    assert got["teacher_gib"] == planned.need_gib and got["warnings"] == planned.warnings
    assert got["budgets"] == {"teacher_batch": b.teacher_batch, "tok_budget": b.tok_budget,
                              "student_batch": b.student_batch,
                              "student_tok_budget": b.student_tok_budget}


def test_a_missing_teacher_is_the_planners_sentence(tmp_path):
    root = tmp_path / "p"
    missing = {"teacher": {"path": str(tmp_path / "nope")}}
    create_project(root, "t5xxl_pixart", overrides={"precompute.device": "cpu",
                                                    "materials": missing})
    got = preflight._probe(str(root))
    assert not got["ok"] and str(tmp_path / "nope") in got["error"]
    assert "Pre-flight: refused." in preflight.to_markdown(got)
