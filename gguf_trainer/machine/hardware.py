"""The machine: device resolution, dtype policy, batch budgets, thread pinning, optimizer and
determinism choices per device, and the teacher placement planner with its memory pre-flight.

Owns every decision that depends on the hardware, so stages ask here instead of probing
torch themselves. The planner (`plan_teacher`) and the pre-flight (`preflight`) are pure
functions of a `Hardware` reading and plain numbers: tests drive them with fake machines.
Must not: know projects or packs beyond the numbers passed in, or load any model.

    hw = read_hardware(device)
    plan = plan_teacher(teacher_gib=12.0, settings=pc, hw=hw, offload=pack.teacher_offload)
    for line in plan.info: log.info(line)
    for line in preflight(12.0, plan, hw): log.warning(line)   # raises UserError if it cannot fit
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from gguf_trainer.base.errors import UserError

log = logging.getLogger(__name__)

GIB = 1024**3

# ---------------------------------------------------------------- devices and dtypes


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(
            f"device {name!r} was chosen but no CUDA device is available; choose cpu or auto."
        )
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"device {name!r} is not a device; choose auto, cpu or cuda[:N].") from None
    if (
        device.type == "cuda"
        and device.index is not None
        and device.index >= torch.cuda.device_count()
    ):
        raise UserError(
            f"device {name!r} was chosen but this machine has {torch.cuda.device_count()} CUDA "
            f"device(s) (cuda:0..); choose one of them or auto."
        )
    return device


def student_dtype(name: str, device: torch.device) -> torch.dtype:
    """ "auto" = fp32 everywhere: the engine multiplies pig_clip's f16 weights with f32
    activations, the 0.6B student is cheap next to any teacher, and bf16 matmul on CPUs is
    hundreds of times slower. bf16/f16 are there for small cards."""
    return {
        "auto": torch.float32,
        "f32": torch.float32,
        "f16": torch.float16,
        "bf16": torch.bfloat16,
    }[name]


def autocast(device: torch.device):
    """bf16 autocast for the adapter's forward on CUDA; full fp32 elsewhere (bf16 CPU matmul is
    slow)."""
    import contextlib

    return (
        torch.autocast("cuda", torch.bfloat16)
        if device.type == "cuda"
        else contextlib.nullcontext()
    )


# ---------------------------------------------------------------- training-step choices


def pin_threads(threads: int) -> None:
    """The same thread count on every start: CPU reductions split work by thread, so a resumed
    run is bit-identical to an uninterrupted one only at the count the run began with."""
    torch.set_num_threads(max(1, int(threads)))


def deterministic_algorithms(device: torch.device) -> bool:
    """Whether to turn on torch's deterministic mode for this device. Off on both:
    * CPU: the kernels the adapter uses (matmul, SDPA, layer norm, embedding backward) are
      deterministic at a fixed thread count (the kill -9 resume tests prove bit identity),
      and the mode costs ~1.9 s at every start (it imports the compiler stack) plus ~2 % per
      step filling every new tensor;
    * CUDA: runs are not promised bit-identical there (bf16 autocast, cuBLAS split-K), and
      the mode would slow the fused kernels for no promise kept."""
    return False


def apply_determinism(device: torch.device) -> None:
    if deterministic_algorithms(device):  # pragma: no cover - off on every device today
        torch.use_deterministic_algorithms(True, warn_only=True)


def adamw_options(device: torch.device) -> dict:
    """fused=True where torch has a fused AdamW for the device (CUDA, and CPU since 2.4):
    one kernel over all parameters instead of a per-tensor loop (~24 % of a CPU step)."""
    fused_devices = ("cuda", "cpu") if _torch_at_least(2, 4) else ("cuda",)
    return {"fused": True} if device.type in fused_devices else {}


TRAIN_BYTES_PER_PARAM = 16  # fp32 weight + gradient + AdamW's two moments


def training_state_gib(n_params: int) -> float:
    """Memory the adapter's training state takes (activations come on top)."""
    return n_params * TRAIN_BYTES_PER_PARAM / GIB


def check_training_fits(n_params: int, device: torch.device, hw: Hardware, what: str) -> None:
    """Refuse settings whose adapter cannot even hold its training state on the device (an
    absurd width or depth), before anything is invalidated; both numbers in the sentence."""
    need = training_state_gib(n_params)
    have = hw.gpu_total_gib if device.type == "cuda" else hw.cpu_total_gib
    if need > have:
        where = "GPU memory" if device.type == "cuda" else "RAM"
        raise UserError(
            f"an adapter with {what} has {n_params / 1e6:.0f}M parameters whose training "
            f"state needs {need:.1f} GiB of {where}, but the machine has {have:.1f} GiB; "
            "lower train.width or train.depth."
        )


def use_grad_checkpointing(setting: str, device: torch.device) -> bool:
    """auto: on for cards under 12 GB (activations dominate there), off elsewhere."""
    if setting == "auto":
        return (
            device.type == "cuda" and torch.cuda.get_device_properties(device).total_memory < 12e9
        )
    return setting == "on"


def _torch_at_least(major: int, minor: int) -> bool:
    parts = torch.__version__.split("+")[0].split(".")
    return (int(parts[0]), int(parts[1])) >= (major, minor)


# ---------------------------------------------------------------- batch budgets


@dataclass(frozen=True)
class Budgets:
    teacher_batch: int
    tok_budget: int
    student_batch: int
    student_tok_budget: int


BIG_CARD_BUDGETS = (256, 65536, 256, 131072)
SMALL_CARD_BUDGETS = (64, 12288, 64, 24576)
OFFLOAD_BUDGETS = (32, 8192, 64, 24576)  # weights stream in per layer: fewer, fuller batches
CPU_BUDGETS = (16, 4096, 32, 8192)
BIG_CARD_SPARE_GIB = 16.0  # memory left beside the teacher's weights that counts as a big card


def choose_budgets(
    pc, device: torch.device, spare_gib: float | None = None, mode: str = ""
) -> Budgets:
    """Settings at 0 are chosen for the device: a card with lots of memory beside the teacher
    gets bigger batches. `spare_gib` = GPU memory left once the teacher is placed (default:
    the card's total)."""
    if device.type == "cuda" and mode != "cpu":
        if spare_gib is None:
            spare_gib = torch.cuda.get_device_properties(device).total_memory / GIB
        auto = (
            OFFLOAD_BUDGETS
            if mode == "offload"
            else (BIG_CARD_BUDGETS if spare_gib > BIG_CARD_SPARE_GIB else SMALL_CARD_BUDGETS)
        )
    else:
        auto = CPU_BUDGETS
    given = (pc.teacher_batch, pc.tok_budget, pc.student_batch, pc.student_tok_budget)
    return Budgets(*(g or a for g, a in zip(given, auto)))


MIN_BATCH_EFFICIENCY = 0.9  # real ÷ processed tokens each batch keeps...
PAD_SLACK_TOKENS = 32  # ...unless it pads fewer tokens than this (tiny prompts: fewer calls)


def budget_batches(lengths: Sequence[int], max_batch: int, max_tokens: int) -> list[list[int]]:
    """Indices grouped into batches, sorted by length ascending. A batch costs count × its
    longest member (that is what padding processes): it is kept ≤ max_tokens, and closed
    before a longer member would push its real ÷ processed tokens under 0.9 (big budgets
    would otherwise pad hundreds of short prompts to a long one). ≥ 1 item per batch."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches, cur, real = [], [], 0
    for i in order:
        n, length = len(cur) + 1, lengths[i]
        padding = n * length - real - length
        if cur and (
            n > max_batch
            or n * length > max_tokens
            or (padding > PAD_SLACK_TOKENS and real + length < MIN_BATCH_EFFICIENCY * n * length)
        ):
            batches.append(cur)
            cur, real = [], 0
        cur.append(i)
        real += lengths[i]
    if cur:
        batches.append(cur)
    return batches


# ---------------------------------------------------------------- teacher placement


@dataclass(frozen=True)
class Hardware:
    """What the machine offers now. GiB figures; gpu_* are 0 without CUDA."""

    has_cuda: bool
    gpu_total_gib: float = 0.0
    gpu_free_gib: float = 0.0
    cpu_total_gib: float = 0.0
    cpu_available_gib: float = 0.0


def read_hardware(device: torch.device) -> Hardware:
    """A reading of `device` (its free memory) and of the host's RAM."""
    import psutil

    vm = psutil.virtual_memory()
    cpu = {"cpu_total_gib": vm.total / GIB, "cpu_available_gib": vm.available / GIB}
    if device.type != "cuda":
        return Hardware(has_cuda=False, **cpu)
    free, total = torch.cuda.mem_get_info(device)
    return Hardware(has_cuda=True, gpu_total_gib=total / GIB, gpu_free_gib=free / GIB, **cpu)


TEACHER_MODES = ("auto", "gpu", "offload", "cpu")
ACTIVATION_HEADROOM = 0.25  # GPU memory beside a resident teacher, as a share of its weights...
MIN_HEADROOM_GIB = 1.0  # ...and at least this much (activations of one budget batch)
CLOSE_MARGIN = 0.10  # a fit within 10 % of the limit is warned about
# How a pack's offload mode holds the weights: "stream" keeps them all in RAM and streams one
# block at a time through the card (T5, Qwen3-VL, the Qwen tap teacher: teachers/offload.py);
# "split" places them once with a device map, the card filled up to its budget and the rest in
# RAM (LLaDA); "disk" reads each layer from the snapshot's files just before it runs, in
# offload and cpu alike, so RAM holds the resident parts and one layer (Ming-Image:
# teachers/ming_stream.py).
OFFLOAD_KINDS = ("stream", "split", "disk")


@dataclass(frozen=True)
class Plan:
    """Where the teacher goes and how big its batches are.

    mode       gpu (resident on the card), offload (weights in RAM, streamed layer by layer
               to the card), cpu (everything on the CPU), or mock (no weights).
    gpu_gib    the GPU memory the teacher may take (a device_map max_memory), 0 = none
    cpu_gib    the RAM it may take
    placement  sequential (fill one card, then the next) or balanced (spread over cards)
    offload    how offload holds the weights (OFFLOAD_KINDS): stream (all in RAM), split
               (the card's budget less headroom, then RAM) or disk (one layer at a time)
    notes      warnings (an automatic fallback and why); info: plain facts for the log
    """

    mode: str
    budgets: Budgets
    gpu_gib: float = 0.0
    cpu_gib: float = 0.0
    placement: str = "sequential"
    offload: str = "stream"
    notes: tuple[str, ...] = field(default_factory=tuple)
    info: tuple[str, ...] = field(default_factory=tuple)


def _gpu_limit(settings, hw: Hardware) -> float:
    return min(hw.gpu_free_gib, settings.gpu_mem_gib or math.inf)


def _cpu_limit(settings, hw: Hardware) -> float:
    return min(hw.cpu_available_gib, settings.cpu_mem_gib or math.inf)


def gpu_need_gib(teacher_gib: float) -> float:
    return teacher_gib + max(MIN_HEADROOM_GIB, ACTIVATION_HEADROOM * teacher_gib)


def plan_teacher(
    teacher_gib: float, settings, hw: Hardware, is_mock: bool = False, offload: str = "stream"
) -> Plan:
    """Pick the teacher mode and batch budgets.

    `teacher_gib`: the pack's memory need (weights); `settings`: the precompute settings
    (teacher_mode, placement, gpu_mem_gib, cpu_mem_gib, batch/token budgets; 0 = auto);
    `hw`: a Hardware reading. auto = resident on the card when weights + headroom fit under
    the GPU limit, else offload when a card exists, else cpu. Checking that the chosen mode
    fits is `preflight`'s job. `offload`: the pack's OFFLOAD_KINDS entry (its teacher_offload)."""
    if offload not in OFFLOAD_KINDS:
        raise ValueError(f"offload {offload!r} is not one of {OFFLOAD_KINDS}")
    device = torch.device("cuda" if hw.has_cuda else "cpu")
    if is_mock:
        mode = "mock"
    elif settings.teacher_mode != "auto":
        mode = settings.teacher_mode
    elif hw.has_cuda and gpu_need_gib(teacher_gib) <= _gpu_limit(settings, hw):
        mode = "gpu"
    elif hw.has_cuda:
        mode = "offload"
    else:
        mode = "cpu"
    gpu_limit = _gpu_limit(settings, hw) if hw.has_cuda else 0.0
    spare = gpu_limit - (teacher_gib if mode == "gpu" else 0.0)
    budgets = choose_budgets(settings, device, spare_gib=spare, mode=mode)
    notes, info = (), ()
    if mode == "cpu" and not hw.has_cuda:  # no card to compare with: a fact, not a fallback
        info = ("no GPU: the teacher runs on the CPU in fp32",)
    elif settings.teacher_mode == "auto" and mode in ("offload", "cpu") and not is_mock:
        need = gpu_need_gib(teacher_gib)
        how = {
            "stream": "its weights stay in RAM and stream through the card",
            "split": "it is split between the card and RAM",
            "disk": "its layers are read from the snapshot's files as they run",
        }[offload]
        note = (
            f"teacher mode {mode}: the teacher needs {need:.1f} GiB on a card and "
            f"{gpu_limit:.1f} GiB is available there" + (f"; {how}" if mode == "offload" else "")
        )
        notes = (note,)
    return Plan(
        mode=mode,
        budgets=budgets,
        gpu_gib=gpu_limit if mode in ("gpu", "offload") else 0.0,
        cpu_gib=_cpu_limit(settings, hw),
        placement=settings.placement,
        offload=offload,
        notes=notes,
        info=info,
    )


def preflight(teacher_gib: float, plan: Plan, hw: Hardware,
              streamed_gib: float | None = None) -> list[str]:
    """Before any weights load: refuse a plan that cannot fit (UserError naming both numbers
    and the setting to change), or return warnings when it fits with under 10 % to spare.
    `streamed_gib`: what a "disk" teacher holds in RAM in offload / cpu (resident parts + the
    largest layer; None = its whole weights)."""
    if plan.mode == "mock":
        return []
    if plan.mode in ("gpu", "offload") and not hw.has_cuda:
        raise UserError(
            f"precompute.teacher_mode is {plan.mode} but there is no CUDA device; "
            "set it to cpu or auto."
        )
    if plan.mode == "gpu":
        need, have, where = gpu_need_gib(teacher_gib), plan.gpu_gib, "GPU memory"
        fix = ("set precompute.teacher_mode to offload (or auto), raise "
               "precompute.gpu_mem_gib, or free the card")
    elif plan.mode == "offload" and plan.offload == "split":
        # the device map fills the card up to its budget less headroom
        # (teachers/llada.plan_budgets), then RAM: the two together must hold the weights
        need, where = teacher_gib, "GPU memory + RAM"
        have = max(0.0, plan.gpu_gib - MIN_HEADROOM_GIB) + plan.cpu_gib
        fix = (
            "raise precompute.gpu_mem_gib or precompute.cpu_mem_gib, close other programs, "
            "or use a machine with more memory"
        )
    else:  # streamed offload and cpu hold all the weights in RAM, a "disk" teacher one layer
        held = streamed_gib if plan.offload == "disk" and streamed_gib is not None else None
        need, have, where = held if held is not None else teacher_gib, plan.cpu_gib, "RAM"
        fix = (
            "raise precompute.cpu_mem_gib, close other programs, or use a machine with more memory"
        )
    if need > have:
        raise UserError(
            f"the teacher needs {need:.1f} GiB of {where} but only {have:.1f} GiB is available "
            f"(teacher mode {plan.mode}); {fix}."
        )
    warnings = list(plan.notes)
    if need > (1 - CLOSE_MARGIN) * have:
        warnings.append(
            f"the teacher needs {need:.1f} GiB of {where} and {have:.1f} GiB is available "
            f"(teacher mode {plan.mode}): little room to spare, other programs may push it out"
        )
    return warnings
