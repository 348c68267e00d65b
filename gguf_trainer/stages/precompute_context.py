"""The student and the teacher of precompute, loaded once per pipeline process: where the
teacher goes (a memory pre-flight on headers only, then the placement plan) and the loaded
pair shared by the val and train precompute stages (precompute.py keeps it in the run's
cache and closes it when no stage needs it any more).

    planned = plan_teacher(project, device)   # the GUI's pre-flight asks this same function
    ctx = Context(project)                    # loads the student, the teacher, the vision_proj
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass

import torch

from gguf_trainer.machine import distributed, hardware
from gguf_trainer.materials.materials import student_paths, teacher_paths
from gguf_trainer.model import vision

log = logging.getLogger(__name__)


@dataclass
class TeacherPlan:
    """Where the teacher goes and why: what precompute decides before any weights load, and
    what the GUI's pre-flight shows (ui/preflight.py asks this same function)."""

    hw: object  # hardware.Hardware of the device
    folders: dict  # the teacher's material folders by id ({} with the mock teacher)
    need_gib: float  # the teacher's weights once loaded
    plan: object  # hardware.Plan: mode, memory caps, budgets
    warnings: list[str]  # the memory pre-flight's warnings (a refusal raises UserError)


def plan_teacher(project, device) -> TeacherPlan:
    """The memory pre-flight and the teacher's placement on `device`; UserError when it
    cannot fit. Reads headers only: no weights load."""
    pc, pack = project.settings.precompute, project.pack
    hw = hardware.read_hardware(device)
    folders = {} if pc.mock_teacher else teacher_paths(project)
    need_gib = pack.teacher_gib(folders, device) if folders else pack.teacher_memory_gib
    plan = hardware.plan_teacher(need_gib, pc, hw, is_mock=pc.mock_teacher,
                                 offload=pack.teacher_offload)
    streamed = pack.teacher_streamed_gib(folders) if folders else None
    warnings = hardware.preflight(need_gib, plan, hw, streamed_gib=streamed)
    return TeacherPlan(hw, folders, need_gib, plan, list(warnings))


class Context:
    """Student and teacher, loaded once per pipeline process and shared by val and train.
    The teacher is placed by `hardware.plan_teacher` after a memory pre-flight that refuses
    before any weights load."""

    def __init__(self, project):
        from gguf_trainer.model.student import load_student

        pc, pack = project.settings.precompute, project.pack
        self.device = distributed.rank_device(hardware.resolve_device(pc.device))
        self.pack = pack
        planned = plan_teacher(project, self.device)
        folders, self.plan = planned.folders, planned.plan
        for line in self.plan.info:
            log.info("%s", line)
        for line in planned.warnings:
            log.warning("%s", line)
        gguf, tok = student_paths(project)
        self.student = load_student(gguf, tok, device=self.device,
                                    dtype=hardware.student_dtype(pc.student_dtype, self.device))
        self.teacher = (pack.build_mock_teacher(project) if pc.mock_teacher
                        else pack.load_teacher(folders, self.plan, self.device))
        self.budgets = self.plan.budgets
        # The project's frozen map (fitted when the fingerprint was taken): image rows reach
        # the student through it, exactly as the engine splices them.
        self.vision_proj = (
            vision.load_vision_proj(project.paths.vision_proj) if pack.vis_dim else None
        )
        log.info(
            "precompute: teacher mode %s on %s, budgets %s",
            self.plan.mode,
            self.device,
            self.budgets,
        )

    def close(self) -> None:
        """Free the teacher's and the student's memory (the stage that opened them calls this)."""
        close = getattr(self.teacher, "close", None)
        if close is not None:
            close()
        self.teacher = self.student = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
