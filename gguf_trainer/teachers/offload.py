"""How a teacher honours the planner's mode (hardware.plan_teacher): the device it computes on,
the dtype its weights load in, and the streamed offload. One place for the three teachers whose
offload streams every weight through the card (T5, Qwen3-VL, the Qwen tap teacher; LLaDA splits
the model with a device map instead: placement.py).

    gpu      every weight resident on the card, bf16 (what the snapshots store);
    offload  the weights in RAM (bf16), each module's copied to the card just for its forward
             (accelerate cpu_offload hooks): the card holds one module's weights at a time;
    cpu      everything on the CPU in fp32 (bf16 matmul on CPUs is hundreds of times slower).

Must not: read hardware or settings, or know a model family (the caller names what to keep).

    device = teacher_device(plan.mode, device)          # UserError: a card mode without a card
    model = Cls.from_pretrained(root, dtype=weights_dtype(plan.mode, device))
    stream_offload(text, device, keep=("embed_tokens",))  # offload only
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gguf_trainer.base.errors import UserError

if TYPE_CHECKING:  # pragma: no cover
    import torch

TEACHER_MODES = ("gpu", "offload", "cpu")


def teacher_device(mode: str, device) -> torch.device:
    """Where a teacher in `mode` computes: `device` (a card) for gpu and offload, the CPU for
    cpu. ValueError for a mode that is not one (a caller's bug), UserError for a card mode on a
    machine without one."""
    import torch

    if mode not in TEACHER_MODES:
        raise ValueError(f"teacher mode {mode!r} is not one of {TEACHER_MODES}")
    if mode == "cpu":
        return torch.device("cpu")
    device = torch.device(device)
    if device.type != "cuda":
        raise UserError(
            f"teacher mode {mode} needs a CUDA device; set precompute.teacher_mode to cpu or auto."
        )
    return device


def weights_dtype(mode: str, device) -> torch.dtype:
    """bf16 for a teacher computing on a card (gpu, offload), fp32 on the CPU."""
    import torch

    if mode != "cpu" and torch.device(device).type == "cuda":
        return torch.bfloat16
    return torch.float32


def stream_offload(module, device, keep: Sequence[str] = ()) -> None:
    """The offload mode: `module`'s weights stay in RAM and each submodule's are copied to
    `device` just for its forward (accelerate cpu_offload). The children named in `keep` stay
    plain RAM modules outside the hooks: a Qwen embedding table is indexed on the CPU and only
    the rows go to the card, instead of the whole table (~0.8 GiB) copied at every forward.
    Forward (pre-)hooks registered on the modules later still run: accelerate wraps `forward`,
    torch calls the hooks around that wrapper."""
    from accelerate import cpu_offload

    kept = {name: getattr(module, name) for name in keep}
    for name in kept:
        setattr(module, name, None)
    try:
        cpu_offload(module, execution_device=device)
    finally:
        for name, child in kept.items():
            setattr(module, name, child)
