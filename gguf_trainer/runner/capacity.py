"""How many ranks this machine can run: one per device, and no more than its memory holds.

`run --processes 1000` on a 2-core machine without GPUs would start 1000 ranks, each loading
the student and the teacher, until the machine stalls. So before anything is launched the
count is checked against:

* the devices: one rank per visible GPU (NVML, or the /dev/nvidiaN nodes, narrowed by
  CUDA_VISIBLE_DEVICES); on the CPU backend (no GPU, or both stages set to cpu) one rank per
  CPU core this process may use;
* the memory, on the CPU backend: every rank holds its own student and teacher in RAM, at
  least their bytes on disk (fp32 on a CPU makes them larger; the pipeline's own pre-flight
  then checks the exact figure), so N ranks need N times that within the available RAM.

Torch-free (the CLI and control call it); reads the machine, never launches anything.

    check_processes(8, read_capacity(project))   # UserError with the numbers, or None
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path

import psutil

from gguf_trainer.base.errors import UserError

GIB = 1024**3
WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")


@dataclass(frozen=True)
class Capacity:
    """backend "gpu" or "cpu"; devices: GPUs or CPU cores; ram_gib available; per_rank_gib:
    the least RAM one rank takes on the CPU backend (None: not known, or not the limit)."""

    backend: str
    devices: int
    ram_gib: float
    per_rank_gib: float | None = None

    @property
    def max_by_memory(self) -> int | None:
        if self.per_rank_gib is None or self.per_rank_gib <= 0:
            return None
        return int(self.ram_gib // self.per_rank_gib)


def visible_gpus() -> int:
    """NVIDIA GPUs this process may use, without torch."""
    count = _nvml_count()
    if count is None:
        count = sum(1 for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # "" or "-1" hides every card; "0,2" shows two
        ids = [v for v in visible.split(",") if v.strip()]
        ids = ids[:next((i for i, v in enumerate(ids) if v.strip().startswith("-")), len(ids))]
        count = min(count, len(ids))
    return count


def _nvml_count() -> int | None:
    try:
        import pynvml
    except ImportError:  # nvidia-ml-py is a dependency, but a stripped install may lack it
        return None
    try:
        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:  # no driver: no NVIDIA GPU here
        return 0


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _bytes_on_disk(path: Path | None) -> int:
    if path is None or not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for g in WEIGHT_GLOBS for p in path.rglob(g) if p.is_file())


def rank_ram_gib(project, mock_teacher: bool) -> float:
    """The least RAM one CPU rank takes: the student GGUF and (unless mocked) the teacher's
    weight files, as they are on disk."""
    total = _bytes_on_disk(project.material_path("student"))
    if not mock_teacher:
        total += sum(_bytes_on_disk(project.material_path(m.id))
                     for m in project.pack.teacher_materials)
    return total / GIB


def read_capacity(project, mock_teacher: bool = False) -> Capacity:
    """This machine's capacity for ranks of `project`."""
    gpus = visible_gpus()
    devices = {project.settings.precompute.device, project.settings.train.device}
    ram_gib = psutil.virtual_memory().available / GIB
    if gpus == 0 or devices == {"cpu"}:
        return Capacity("cpu", cpu_cores(), ram_gib, rank_ram_gib(project, mock_teacher))
    return Capacity("gpu", gpus, ram_gib)


def check_processes(n: int, cap: Capacity, flag: str = "--processes") -> None:
    """UserError, with the numbers and the largest count that fits, when `n` ranks per
    machine exceed the devices or (CPU backend) the memory. `flag`: where `n` was given."""
    if n <= 1:
        return
    what = "GPU" if cap.backend == "gpu" else "CPU core"
    if n > cap.devices:
        raise UserError(f"{flag} {n} is more than this machine's {cap.devices} {what}"
                        f"{'s' if cap.devices != 1 else ''} (one rank each); use {flag} "
                        f"{max(cap.devices, 1)} or fewer.")
    fit = cap.max_by_memory
    if fit is not None and n > fit:
        raise UserError(f"{flag} {n}: each rank holds the student and the teacher in RAM "
                        f"(at least {cap.per_rank_gib:.1f} GiB), so {n} ranks need "
                        f"{n * cap.per_rank_gib:.1f} GiB but {cap.ram_gib:.1f} GiB is available; "
                        f"use {flag} {max(fit, 1)} or fewer.")
