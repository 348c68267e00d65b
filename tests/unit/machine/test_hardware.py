"""hardware.plan_teacher and hardware.preflight as pure functions over fake machines (no GPU
needed), and the per-device training-step choices."""

from __future__ import annotations

import pytest
import torch

from gguf_trainer.base.errors import UserError
from gguf_trainer.machine import hardware
from gguf_trainer.machine.hardware import Hardware, plan_teacher, preflight
from gguf_trainer.packs import get_pack
from gguf_trainer.store.project_schema import PrecomputeSettings

TEACHER_GIB = 12.0  # the PixArt pack's T5-XXL need
BIG_CARD = Hardware(
    has_cuda=True, gpu_total_gib=80, gpu_free_gib=78, cpu_total_gib=128, cpu_available_gib=100
)
SMALL_CARD = Hardware(
    has_cuda=True, gpu_total_gib=8, gpu_free_gib=7.5, cpu_total_gib=32, cpu_available_gib=24
)
LAPTOP = Hardware(has_cuda=False, cpu_total_gib=16, cpu_available_gib=10)


def settings(**kw):
    return PrecomputeSettings(**kw)


@pytest.mark.parametrize("hw,mode", [(BIG_CARD, "gpu"), (SMALL_CARD, "offload"), (LAPTOP, "cpu")])
def test_auto_mode_follows_the_hardware(hw, mode):
    plan = plan_teacher(TEACHER_GIB, settings(), hw)
    assert plan.mode == mode
    if mode == "gpu":
        assert plan.gpu_gib == pytest.approx(78) and plan.notes == ()
    elif mode == "offload":  # an automatic fallback says why, with both numbers
        assert (
            "GiB" in plan.notes[0] and f"{hardware.gpu_need_gib(TEACHER_GIB):.1f}" in plan.notes[0]
        )
        assert "weights stay in RAM" in plan.notes[0]
    else:  # no card at all: nothing to compare with, a plain fact for the log, no warning
        assert plan.notes == () and plan.info == ("no GPU: the teacher runs on the CPU in fp32",)
        roomy = Hardware(has_cuda=False, cpu_total_gib=64, cpu_available_gib=60)
        assert preflight(TEACHER_GIB, plan_teacher(TEACHER_GIB, settings(), roomy), roomy) == []


def test_a_user_gpu_budget_caps_what_the_planner_may_use():
    plan = plan_teacher(TEACHER_GIB, settings(gpu_mem_gib=10), BIG_CARD)
    assert plan.mode == "offload" and plan.gpu_gib == 10  # 12 GiB + headroom does not fit in 10
    assert plan_teacher(TEACHER_GIB, settings(gpu_mem_gib=40), BIG_CARD).mode == "gpu"
    # the smaller wins
    assert plan_teacher(TEACHER_GIB, settings(cpu_mem_gib=20), LAPTOP).cpu_gib == 10


def test_explicit_mode_and_placement_are_kept():
    plan = plan_teacher(TEACHER_GIB, settings(teacher_mode="cpu", placement="balanced"), BIG_CARD)
    assert (plan.mode, plan.placement, plan.gpu_gib) == ("cpu", "balanced", 0.0)
    assert plan.budgets == hardware.Budgets(*hardware.CPU_BUDGETS)


def test_budgets_grow_with_the_memory_left_beside_the_teacher():
    big = plan_teacher(TEACHER_GIB, settings(), BIG_CARD).budgets
    tight = plan_teacher(TEACHER_GIB, settings(), Hardware(True, 24, 23, 64, 60)).budgets
    assert big.tok_budget > tight.tok_budget > 0
    given = plan_teacher(TEACHER_GIB, settings(teacher_batch=3, tok_budget=999), BIG_CARD).budgets
    assert (given.teacher_batch, given.tok_budget) == (3, 999)  # user budgets win over auto


def test_mock_needs_no_memory():
    plan = plan_teacher(TEACHER_GIB, settings(teacher_mode="gpu"), LAPTOP, is_mock=True)
    assert plan.mode == "mock" and preflight(TEACHER_GIB, plan, LAPTOP) == []


@pytest.mark.parametrize(
    "mode,hw,where,have",
    [
        ("gpu", SMALL_CARD, "GPU memory", 7.5),
        ("cpu", LAPTOP, "RAM", 10.0),
        ("offload", Hardware(True, 8, 7.5, 16, 9), "RAM", 9.0),
    ],
)
def test_preflight_refuses_with_both_numbers(mode, hw, where, have):
    plan = plan_teacher(TEACHER_GIB, settings(teacher_mode=mode), hw)
    with pytest.raises(UserError) as err:
        preflight(TEACHER_GIB, plan, hw)
    msg = str(err.value)
    need = hardware.gpu_need_gib(TEACHER_GIB) if mode == "gpu" else TEACHER_GIB
    assert f"needs {need:.1f} GiB of {where}" in msg and f"only {have:.1f} GiB" in msg
    assert "precompute." in msg and "\n" not in msg  # names the setting to change


LLADA = get_pack("llada_image")
CARD_32_RAM_32 = Hardware(
    has_cuda=True, gpu_total_gib=32, gpu_free_gib=31.0, cpu_total_gib=32, cpu_available_gib=29.0
)


def test_a_split_teacher_fits_card_plus_ram():
    """LLaDA (34 GiB, placed by a device map) on a 32 GiB card with 32 GiB of RAM: neither holds
    it alone, the two together do (the card less its activation headroom, then RAM)."""
    assert LLADA.teacher_offload == "split" and LLADA.teacher_memory_gib == 34.0
    need = LLADA.teacher_memory_gib
    plan = plan_teacher(need, settings(), CARD_32_RAM_32, offload=LLADA.teacher_offload)
    assert plan.mode == "offload" and plan.offload == "split"
    assert "split between the card and RAM" in plan.notes[0]
    assert preflight(need, plan, CARD_32_RAM_32) == list(plan.notes)  # fits, 60 GiB for 34
    # the same numbers with streamed offload (weights all in RAM) are refused: RAM alone is 29
    streamed = plan_teacher(need, settings(), CARD_32_RAM_32)
    with pytest.raises(UserError, match=r"needs 34\.0 GiB of RAM but only 29\.0 GiB"):
        preflight(need, streamed, CARD_32_RAM_32)


def test_a_split_teacher_too_big_for_both_is_refused_with_the_sum():
    hw = Hardware(
        has_cuda=True, gpu_total_gib=8, gpu_free_gib=7.5, cpu_total_gib=32, cpu_available_gib=20
    )
    plan = plan_teacher(34.0, settings(), hw, offload="split")
    with pytest.raises(UserError) as err:
        preflight(34.0, plan, hw)
    msg = str(err.value)  # 7.5 - 1.0 headroom + 20
    assert "needs 34.0 GiB of GPU memory + RAM but only 26.5 GiB" in msg and "gpu_mem_gib" in msg
    # a user cap on RAM counts too
    capped = plan_teacher(34.0, settings(cpu_mem_gib=10), CARD_32_RAM_32, offload="split")
    with pytest.raises(UserError, match=r"only 40\.0 GiB"):
        preflight(45.0, capped, CARD_32_RAM_32)


@pytest.mark.parametrize("pack_id", ["t5xxl_pixart", "qwen3vl_mageflow"])
def test_streamed_packs_keep_ram_alone(pack_id):
    """T5 and Qwen3-VL stream their blocks through the card: their weights live in RAM."""
    pack = get_pack(pack_id)
    assert pack.teacher_offload == "stream"
    hw = Hardware(
        has_cuda=True,
        gpu_total_gib=8,
        gpu_free_gib=7.5,
        cpu_total_gib=16,
        cpu_available_gib=pack.teacher_memory_gib - 1,
    )
    plan = plan_teacher(
        pack.teacher_memory_gib, settings(teacher_mode="offload"), hw, offload=pack.teacher_offload
    )
    with pytest.raises(UserError, match="GiB of RAM but only"):
        preflight(pack.teacher_memory_gib, plan, hw)


@pytest.mark.parametrize("hw", [LAPTOP, SMALL_CARD])
def test_a_disk_teacher_needs_ram_for_one_layer_not_its_weights(hw):
    """Ming-Image's release reads each layer from its shards as it runs (offload and cpu): a
    32 GiB thinker fits beside 10-24 GiB of RAM when its resident parts + one layer do, and is
    refused, with that figure, when they do not."""
    ming = get_pack("ming_image")
    assert ming.teacher_offload == "disk"
    plan = plan_teacher(32.0, settings(), hw, offload="disk")
    assert plan.mode in ("offload", "cpu")
    with pytest.raises(UserError, match=r"needs 32\.0 GiB of RAM"):
        preflight(32.0, plan, hw)  # no streamed figure: the whole weights, as before
    assert preflight(32.0, plan, hw, streamed_gib=2.3) == list(plan.notes)
    with pytest.raises(UserError, match=r"needs 40\.0 GiB of RAM"):
        preflight(32.0, plan, hw, streamed_gib=40.0)
    # a streamed figure means nothing to a teacher that holds its weights in RAM
    whole = plan_teacher(32.0, settings(), hw)
    with pytest.raises(UserError, match=r"needs 32\.0 GiB"):
        preflight(32.0, whole, hw, streamed_gib=2.3)


def test_preflight_refuses_a_card_mode_without_a_card():
    plan = plan_teacher(TEACHER_GIB, settings(teacher_mode="gpu"), LAPTOP)
    with pytest.raises(UserError, match="no CUDA device"):
        preflight(TEACHER_GIB, plan, LAPTOP)


def test_preflight_warns_when_close():
    hw = Hardware(has_cuda=False, cpu_total_gib=16, cpu_available_gib=TEACHER_GIB / 0.95)
    warnings = preflight(TEACHER_GIB, plan_teacher(TEACHER_GIB, settings(), hw), hw)
    assert any("little room" in w and f"{TEACHER_GIB:.1f} GiB" in w for w in warnings)
    roomy = preflight(TEACHER_GIB, plan_teacher(TEACHER_GIB, settings(), BIG_CARD), BIG_CARD)
    assert roomy == []


def test_read_hardware_on_this_machine():
    hw = hardware.read_hardware(torch.device("cpu"))
    assert not hw.has_cuda and hw.cpu_total_gib >= hw.cpu_available_gib > 0


def test_step_choices_per_device():
    assert hardware.adamw_options(torch.device("cpu")) == {"fused": True}  # torch >= 2.4
    assert hardware.adamw_options(torch.device("cuda")) == {"fused": True}
    assert hardware.adamw_options(torch.device("mps")) == {}
    assert not hardware.deterministic_algorithms(torch.device("cpu"))
    assert hardware.use_grad_checkpointing("on", torch.device("cpu"))
    assert not hardware.use_grad_checkpointing("auto", torch.device("cpu"))


def test_fused_adamw_steps_like_the_reference_loop():
    """fused=True is the same algorithm: a few steps land within float rounding of foreach=False."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(17, 9)) for _ in range(3)]
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    fused = torch.optim.AdamW(
        params,
        lr=1e-2,
        betas=(0.9, 0.95),
        weight_decay=0.01,
        **hardware.adamw_options(torch.device("cpu")),
    )
    plain = torch.optim.AdamW(copies, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.01, foreach=False)
    for _ in range(5):
        for group, opt in ((params, fused), (copies, plain)):
            opt.zero_grad()
            sum((p * p).sum() for p in group).backward()
            opt.step()
    for a, b in zip(params, copies):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_training_state_must_fit_the_machine():
    n = 3 * 2**30  # 3G parameters: 48 GiB of fp32 weight, gradient and AdamW moments
    with pytest.raises(UserError) as err:
        hardware.check_training_fits(
            n, torch.device("cpu"), LAPTOP, "train.width 8192, train.depth 48"
        )
    msg = str(err.value)
    assert "48.0 GiB of RAM" in msg and "16.0 GiB" in msg and "train.width 8192" in msg
    hardware.check_training_fits(n, torch.device("cuda"), BIG_CARD, "w")  # 80 GiB card: fits


def test_resolve_device_refuses_what_is_not_there(monkeypatch):
    assert hardware.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(UserError, match="not a device"):
        hardware.resolve_device("gpu0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert hardware.resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(UserError, match="has 2 CUDA device"):
        hardware.resolve_device("cuda:7")


def test_the_tab_polls_exactly_while_it_says_torch_is_being_asked(monkeypatch):
    """torch's facts arriving between two readings once stopped the poll under a text that
    still said "asking": the tab never showed them (a browser test waited 180 s in vain)."""
    from gguf_trainer.ui import hardware as ui_hardware
    from gguf_trainer.ui import hardware_tab

    arrived = {**ui_hardware.environment(), "torch_facts": {"error": "stand-in facts"}}
    readings = iter([{**arrived, "torch_facts": None}] + [arrived] * 5)
    monkeypatch.setattr(ui_hardware, "environment", lambda: next(readings))
    text, poll = hardware_tab.render_and_poll(None)
    assert "asking torch" in text and poll.active
