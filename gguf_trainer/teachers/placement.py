"""Where a big teacher's layers go: an accelerate device map computed on the meta device.

Owns: turning memory budgets into a device map for a model built from its config without
weights (accelerate `infer_auto_device_map`, `get_balanced_memory`), so the plan is known and
checked before any weight loads, and can be tested with fake budgets on a machine without a
GPU. Must not: read hardware or settings (hardware.py decides the budgets).

    budgets = [(0, 24 * GIB), (1, 10 * GIB), ("cpu", 64 * GIB)]   # chosen GPU first
    device_map = plan_device_map(meta_model, budgets, "sequential")
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from gguf_trainer.base.errors import UserError

log = logging.getLogger(__name__)
GIB = 1024**3
PLACEMENTS = ("sequential", "balanced")


def plan_device_map(model: torch.nn.Module, budgets: Sequence[tuple[int | str, int]],
                    placement: str = "sequential", dtype: torch.dtype = torch.bfloat16) -> dict:
    """A {module name: device} map for `model` (on the meta device).

    `budgets` lists (device, bytes) in fill order: the chosen GPU, the other GPUs, then "cpu".
    sequential fills each device up to its budget before the next; balanced caps every GPU at
    an even share of the model (accelerate's balanced memory) and puts the rest on the CPU.
    accelerate always fills GPUs in index order, so the GPUs are renumbered 0.. in our order
    for the computation and mapped back. UserError when the budgets cannot hold the model."""
    from accelerate.utils import get_balanced_memory, infer_auto_device_map

    if placement not in PLACEMENTS:
        raise UserError(f"precompute.placement is {placement!r}; choose sequential or balanced.")
    gpus = [dev for dev, _ in budgets if isinstance(dev, int)]
    fake = {
        i: int(b) for i, (dev, b) in enumerate((d, b) for d, b in budgets if isinstance(d, int))
    }
    fake.update({dev: int(b) for dev, b in budgets if not isinstance(dev, int)})
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    logger = logging.getLogger("accelerate.utils.modeling")
    level = logger.level
    logger.setLevel(logging.ERROR)  # it warns about every fake GPU index it cannot see
    try:
        if placement == "balanced" and len(gpus) > 0:
            fake = get_balanced_memory(
                model, max_memory=fake, no_split_module_classes=no_split, dtype=dtype
            )
        dmap = infer_auto_device_map(
            model, max_memory=fake, no_split_module_classes=no_split, dtype=dtype
        )
    finally:
        logger.setLevel(level)
    if any(dev == "disk" for dev in dmap.values()) or not dmap:
        raise UserError(
            "the teacher does not fit in the memory budgets given "
            f"({', '.join(f'{d}: {b / GIB:.1f} GiB' for d, b in budgets)}); raise "
            "precompute.cpu_mem_gib or precompute.gpu_mem_gib."
        )
    return {name: (gpus[dev] if isinstance(dev, int) else dev) for name, dev in dmap.items()}


def model_bytes(model: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of the model's parameters and buffers at `dtype` (meta models work)."""
    size = torch.tensor([], dtype=dtype).element_size()
    return sum(t.numel() for t in list(model.parameters()) + list(model.buffers())) * size


def devices_used(device_map: dict) -> list:
    """The distinct devices of a map, in first-use order."""
    seen = []
    for dev in device_map.values():
        if dev not in seen:
            seen.append(dev)
    return seen
