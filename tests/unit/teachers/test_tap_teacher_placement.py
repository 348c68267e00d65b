"""The tap teacher honours the planner's mode as the T5 and Qwen3-VL teachers do (teachers/
offload.py, qwen3vl.place): gpu resident, offload the text stack streamed through the card from
RAM (accelerate hooks; the embedding table and the tower stay plain modules), cpu in fp32. On a
machine without a card the CPU stands in for it (as test_qwen3vl_teacher's offload test does):
`teacher_device` is patched to hand back the CPU, so the whole load path, the streaming hooks,
the tap pre-hooks and the deepstack addition run; every mode must give the same targets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from gguf_trainer.base.errors import UserError
from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.fibo2 import preprocess_fibo2
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.engine.template_padding import Padding
from gguf_trainer.machine.hardware import Plan
from gguf_trainer.model.vision import image_runs
from gguf_trainer.packs import get_pack
from gguf_trainer.teachers import qwen_taps
from gguf_trainer.teachers.base import VisionSegment
from gguf_trainer.teachers.qwen_taps import TapLayout, load_tap_teacher
from gguf_trainer.tiny.qwen3vl import copy_tiny_qwen3vl

FIBO2 = get_pack("qwen3vl_fibo2")
PAD = FIBO2.image_pad_id
PROMPTS = ("a sheep in sunglasses", "a (red:1.3) fox, [blurry] background", "")
# taps 1 and 3 are layer inputs, 4 = num_layers is the final norm's input: a pre-hook on a module
# that accelerate streams; FLUX.3-like pads put masked keys and rope position 1 in the batch
LAYOUT = TapLayout(taps=(1, 3, 4), padding=Padding(multiple=16, pad_position=1))


@pytest.fixture
def card_is_cpu(monkeypatch):
    """The CPU as the card: the loader's device check passes for gpu and offload."""
    monkeypatch.setattr(qwen_taps, "teacher_device", lambda mode, device: torch.device("cpu"))


def _pieces(sample, counts=()):
    return FIBO2.student_pieces(sample, counts)


def _text_targets(teacher):
    samples = [Sample(t) for t in PROMPTS]
    ids = [teacher.template_ids(s) for s in samples]  # the student's, as the pack builds them
    return [r.rows for r in teacher.targets(samples, ids)]


def _streamed(teacher) -> bool:
    """The text stack's weights left the modules (accelerate keeps them in RAM, per forward)."""
    return teacher.text.layers[0].mlp.up_proj.weight.device.type == "meta"


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_vl"])
def test_every_mode_gives_the_cpu_teachers_targets(arch, tiny_tap_teacher, card_is_cpu):
    root = tiny_tap_teacher(arch, 4)
    want = _text_targets(load_tap_teacher(root, "cpu", _pieces, LAYOUT, mode="cpu"))
    for mode in ("gpu", "offload"):
        t = load_tap_teacher(root, "cuda", _pieces, LAYOUT, mode=mode)
        assert t.mode == mode and _streamed(t) == (mode == "offload")
        assert t.text.embed_tokens.weight.device.type == "cpu"  # offload: a plain RAM table
        got = _text_targets(t)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
        t.close()


def _edit_batch(teacher, tmp_path):
    rng = np.random.default_rng(0)
    paths = []
    for i, (h, w) in enumerate([(70, 100), (130, 64)]):
        paths.append(tmp_path / f"im{i}.png")
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(paths[-1])
    samples = [Sample("make it night", images=(paths[0],)),
               Sample("a cat", images=(paths[0], paths[1])), Sample("plain text")]
    rows = teacher.vision([p for s in samples for p in s.images])
    encode = engine_bpe(teacher.tokenizer).encode
    ids, segs, at = [], [], 0
    for s in samples:
        r = rows[at : at + len(s.images)]
        at += len(s.images)
        ids.append(FIBO2.student_ids(encode, s, [x.shape[0] for x in r]))
        segs.append([VisionSegment(a, x) for (a, _), x in zip(image_runs(ids[-1], PAD), r)])
    return samples, ids, segs


def test_offload_keeps_the_deepstack_path_and_the_tower(tmp_path, tiny_tap_teacher, card_is_cpu):
    """Fibo 2.0 edits under offload: the tower resident, the deepstack rows added at the image
    rows of the streamed stack and taken by the pre-hooks after the addition: the CPU teacher's
    targets (whose path test_fibo2_edits checks against transformers' own Qwen3VLModel)."""
    root = tiny_tap_teacher("qwen3_vl", 4)
    layout = TapLayout(taps=(1, 2, 3, 4), image_preprocess=preprocess_fibo2)
    cpu = load_tap_teacher(root, "cpu", _pieces, layout, mode="cpu")
    off = load_tap_teacher(root, "cuda", _pieces, layout, mode="offload")
    assert _streamed(off) and off.visual is not None
    assert next(off.visual.parameters()).device.type == "cpu"  # resident: no hooks, no meta
    samples, ids, segs = _edit_batch(cpu, tmp_path)
    for a, b in zip(off.vision([p for s in samples for p in s.images]),
                    [seg.rows for sample_segs in segs for seg in sample_segs]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    want = cpu.targets(samples, ids, segs)
    got = off.targets(samples, ids, segs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.rows, b.rows, rtol=0, atol=1e-6)


@pytest.mark.parametrize("pid, layers", [("qwen3vl_krea2", 35), ("qwen3vl_minimax_h3", 50),
                                         ("qwen3vl_qwen_image_2_1", 0)])
def test_the_packs_pass_the_planned_mode(pid, layers, tmp_path, tiny_tap_teacher, card_is_cpu):
    """A layerwise, a token-aligned and a full-vision pack: the planner's offload reaches the
    teacher (it used to load the whole model onto the card whatever the plan said)."""
    pack = get_pack(pid)
    root = (copy_tiny_qwen3vl(tmp_path / "t") if not layers
            else tiny_tap_teacher(pack.teacher_arch, layers))
    want = None
    for mode in ("cpu", "offload"):
        plan = Plan(mode=mode, budgets=None, gpu_gib=12.0, cpu_gib=64.0)
        t = pack.load_teacher({"teacher": root}, plan, torch.device("cuda"))
        assert t.mode == mode and _streamed(t) == (mode == "offload"), (pid, mode)
        assert (t.visual is not None) == getattr(pack, "teacher_full_vision", False)
        s = Sample("a fox")
        rows = t.targets([s], [pack.student_ids(engine_bpe(t.tokenizer).encode, s)])[0].rows
        if want is None:
            want = rows
        torch.testing.assert_close(rows, want, rtol=0, atol=1e-6)
        t.close()


def test_card_modes_need_a_card(tiny_tap_teacher):
    root = tiny_tap_teacher("qwen3", 27)
    pack = get_pack("qwen3_flux2_klein")  # taps 9, 18, 27
    for mode in ("gpu", "offload"):
        with pytest.raises(UserError, match=f"teacher mode {mode} needs a CUDA device"):
            pack.load_teacher({"teacher": root}, Plan(mode=mode, budgets=None), "cpu")
    # cpu on a card machine: fp32 on the CPU, not the card
    t = load_tap_teacher(root, "cuda", _pieces, LAYOUT, mode="cpu")
    assert t.device.type == "cpu" and t.dtype == torch.float32 and t.mode == "cpu"


def test_the_ram_the_mode_keeps_is_checked_before_loading(tiny_tap_teacher, card_is_cpu):
    """cpu holds fp32 (4 bytes a parameter), offload bf16 (2): a limit of 3 bytes a parameter
    refuses the one and loads the other; the tower counts when the layout keeps it."""
    root = tiny_tap_teacher("qwen3_vl", 4)
    n = qwen_taps.text_stack_params(root)
    limit = n * 3 / 1024**3
    with pytest.raises(UserError, match=r"needs 0\.0 GiB of RAM in teacher mode cpu"):
        load_tap_teacher(root, "cpu", _pieces, LAYOUT, mode="cpu", ram_limit_gib=limit)
    load_tap_teacher(root, "cuda", _pieces, LAYOUT, mode="offload", ram_limit_gib=limit).close()
    tower = qwen_taps.text_stack_params(root, tower=True)
    assert tower > n
    edits = TapLayout(taps=(1,), image_preprocess=preprocess_fibo2)
    with pytest.raises(UserError, match="teacher mode offload"):
        load_tap_teacher(root, "cuda", _pieces, edits, mode="offload",
                         ram_limit_gib=(n + tower) / 1024**3)
