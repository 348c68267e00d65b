"""The token-aligned Qwen families (packs/token_aligned_qwen.py): each pack's template, start row
and pads against the strings of ggk 0.9.7's conditioner.hpp (copied here from the source, so a
pack that drifts fails), the teacher row each family's DiT reads (Z-Image: raw layer 35 =
transformers hidden_states[-2] of a 36-layer Qwen3; Ovis: the final norm; MiniMax H3: raw layer
50) on tiny real teachers."""

from __future__ import annotations

import pytest
import torch

from gguf_trainer.base.errors import UserError
from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.engine.qwen_ids import PAD_ID
from gguf_trainer.engine.template_ids import Piece, template_ids
from gguf_trainer.model.student import load_tokenizer
from gguf_trainer.packs import get_pack, pack_ids
from gguf_trainer.teachers.qwen_taps import load_tap_teacher
from gguf_trainer.tiny import qwen_tokenizer_dir
from gguf_trainer.tiny.qwen_taps import HIDDEN

PROMPTS = ("a sheep in sunglasses", "a (red:1.3) fox, [blurry] background", "", " \t\n", "x " * 300)
ASSISTANT = "<|im_end|>\n<|im_start|>assistant\n"
# conditioner.hpp 3590 (Ovis-Image's fixed user text)
OVIS_TEXT = (
    "<|im_start|>user\nDescribe the image by detailing the color, quantity, text, shape, size, "
    "texture, spatial relationships of the objects and background:"
)
QI21_SYSTEM = "<|im_start|>system\nComprehend and analyze the provided prompt.<|im_end|>\n"  # 3079
BOOGU_T2I = (
    "You are a helpful assistant that generates high-quality images based on user instructions. "
    "The instructions are as follows."
)  # 3240-3241
BOOGU_EDIT = (
    "Describe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. "
    "Generate a new image that meets the user's requirements while maintaining consistency with "
    "the original input where appropriate."
)  # 3242-3243
LINGBOT_PREFIX = (  # 2973-2983
    "<|im_start|>system\nGiven a user input that may include a text prompt alone, a text prompt "
    "with an "
    "image reference, or a text prompt with a video reference or a video reference alone, generate "
    "an "
    '"Enhanced prompt" that provides detailed visual descriptions suitable for video generation. '
    "Evaluate the level of detail in the user's input: if it is simple, enrich it by adding "
    "specifics "
    "about colors, shapes, sizes, textures, lighting, motion dynamics, camera movement, temporal "
    "progression, and spatial relationships to create vivid, concrete, and temporally coherent "
    "scenes "
    "to create vivid and concrete scenes. Please generate only the enhanced description for the "
    "prompt "
    "below and avoid including any additional commentary or "
    "evaluations:<|im_end|>\n<|im_start|>user\n"
)


@pytest.fixture(scope="module")
def encode():
    return engine_bpe(load_tokenizer(qwen_tokenizer_dir())).encode


def _pieces(pid, text):
    """The engine's chunks for each family, written from its branch of get_learned_condition."""
    if pid == "qwen3_zimage":  # 3435-3441: prefix | parsed prompt range | tail
        return [Piece("<|im_start|>user\n"), Piece(text, prompt=True), Piece(ASSISTANT)]
    if pid == "qwen3_ovis":  # 3591-3596: the range is " " + prompt
        return [
            Piece(OVIS_TEXT),
            Piece(" " + text, prompt=True),
            Piece(ASSISTANT + "<think>\n\n</think>\n\n"),
        ]
    if pid == "qwen3vl_minimax_h3":  # 2950-2951: the raw prompt, range {0, 0}: one unparsed piece
        return [Piece(text)]
    if pid == "qwen3vl_qwen_image_2_1":  # 3079-3152 without references; "" -> " " (3148-3149)
        return [
            Piece(QI21_SYSTEM + "<|im_start|>user\n"),
            Piece(text or " ", prompt=True),
            Piece(ASSISTANT),
        ]
    if (
        pid == "qwen3vl_boogu"
    ):  # 3284-3291: blank text takes the edit system prompt; no assistant turn
        system = BOOGU_EDIT if not text.strip(" \t\r\n") else BOOGU_T2I
        return [
            Piece("<|im_start|>system\n" + system + "<|im_end|>\n<|im_start|>user\n"),
            Piece(text, prompt=True),
            Piece("<|im_end|>\n"),
        ]
    if pid == "qwen3vl_lingbot":  # 2972-3049 without images: range {0, 0}, one piece
        return [Piece(LINGBOT_PREFIX + text + ASSISTANT)]
    raise KeyError(pid)


# pack -> (start, min_length, teacher taps, out_dim at the real teacher); Qwen Image 2.1's tap is
# the snapshot's last layer (None here)
ENGINE = {
    "qwen3_zimage": (0, 0, (35,), 2560),
    "qwen3_ovis": (28, 284, (), 2048),
    "qwen3vl_minimax_h3": (0, 0, (50,), 5120),
    "qwen3vl_qwen_image_2_1": (14, 0, None, 4096),
    "qwen3vl_boogu": (0, 0, (), 4096),
    "qwen3vl_lingbot": (140, 0, (), 2560),
}
# the packs that take reference images: vis_dim (the main merger's width)
VISION = {"qwen3vl_boogu": 4096, "qwen3vl_lingbot": 2560, "qwen3vl_qwen_image_2_1": 4096}


@pytest.mark.parametrize("pid", list(ENGINE))
def test_template_start_and_pads_are_the_engines(pid, encode):
    pack = get_pack(pid)
    start, min_length, taps, out_dim = ENGINE[pid]
    kind = (
        "token_aligned_vision" if pid in VISION else "token_aligned"
    )  # edits: vision_proj + vis_in
    assert pid in pack_ids() and pack.adapter_kind == kind and pack.taps == ()
    assert (
        pack.tap_last_layer if taps is None else pack.teacher_taps == taps
    ) and pack.out_dim == out_dim
    assert pack.padding.min_length == min_length and pack.padding.multiple == 0
    cfg = pack.adapter_config(type("T", (), {"width": 128, "depth": 2})(), 1024)
    assert cfg.kind == kind and cfg.taps == () and cfg.vis_dim == VISION.get(pid, 0)
    assert "--llm {student} --llm-adapter {adapter}" in pack.engine_command_template
    for text in PROMPTS:
        s = Sample(text)
        ids = pack.student_ids(encode, s)
        want = template_ids(encode, _pieces(pid, text))
        n = len(want)
        assert ids[:n] == want and ids[n:] == [PAD_ID] * (len(ids) - n)
        assert len(ids) == max(n, min_length)
        assert pack.template_start(s) == start
    if pid == "qwen3_ovis":  # the engine hard-codes 28: the fixed text's last token reaches the DiT
        assert len(encode(OVIS_TEXT)) == 29
    if pid == "qwen3vl_qwen_image_2_1":  # the system turn's tokens (3081)
        assert len(encode(QI21_SYSTEM)) == start
    if pid == "qwen3vl_lingbot":  # the prefix's non-pad tokens (2985-2991)
        assert len(encode(LINGBOT_PREFIX)) == start
    if pid == "qwen3vl_minimax_h3":  # weight syntax is text on an unparsed range
        assert pack.student_ids(encode, Sample("(red:1.3)")) == encode("(red:1.3)")
        assert pack.student_ids(encode, Sample("")) == []  # nothing to encode, as in the engine
        assert (
            pack.defaults["corpus.empty_frac"] == 0 and pack.demo_settings["corpus.empty_frac"] == 0
        )


@pytest.fixture(scope="module")
def tiny(tiny_tap_teacher):
    return {"qwen3": tiny_tap_teacher("qwen3", 36), "qwen3_vl": tiny_tap_teacher("qwen3_vl", 51)}


def _hf_states(teacher, ids):
    x = torch.tensor([ids])
    with torch.no_grad():
        return teacher.text(
            input_ids=x, attention_mask=torch.ones_like(x), output_hidden_states=True
        ).hidden_states


@pytest.mark.parametrize("pid", list(ENGINE))
def test_the_teacher_rows_are_what_the_dit_reads(pid, tiny, encode):
    pack = get_pack(pid)
    root = tiny[pack.teacher_arch]
    layout = pack.tap_layout(
        36 if pack.teacher_arch == "qwen3" else 51
    )  # the tiny snapshot's depth
    teacher = load_tap_teacher(root, "cpu", pack.student_pieces, layout, family=pack.family)
    s = Sample("a sheep in sunglasses")
    ids = pack.student_ids(encode, s)
    got = teacher.targets([s], [ids])[0]
    assert got.rows.shape == (len(ids), HIDDEN) and got.sup_start == pack.start
    n = pack.padding.real_length(ids)
    hs = _hf_states(teacher, ids[:n])  # hs[k] = layer k's raw output, hs[-1] = the final norm
    want = hs[layout.taps[0]] if layout.taps else hs[-1]
    if pack.tap_last_layer:  # the last layer before the norm: raw, and the norm of it is hs[-1]
        assert layout.taps == (51,) and not torch.allclose(got.rows[:n], hs[-1][0], atol=1e-3)
        assert torch.allclose(teacher.text.norm(got.rows[:n]), hs[-1][0], atol=1e-4)
        want = got.rows[:n][None]
    assert torch.allclose(got.rows[:n], want[0], atol=1e-5)
    if pid == "qwen3_zimage":  # layer 35 of 36 = transformers' hidden_states[-2]
        assert torch.allclose(got.rows[:n], hs[-2][0], atol=1e-5)
    if (
        pid == "qwen3_ovis"
    ):  # pads on the right are rows the adapter reads; the real rows never see them
        assert len(ids) == 284 and n < 284


def test_a_teacher_too_shallow_for_the_tap_is_refused(tiny_tap_teacher):
    root = tiny_tap_teacher("qwen3", 20)
    pack = get_pack("qwen3_zimage")
    with pytest.raises(UserError, match="20 decoder layers but the family taps layer 35"):
        pack.check_teacher({"teacher": root})
    assert "final norm" in get_pack("qwen3_ovis").check_teacher({"teacher": root})


def test_the_preflight_reads_the_linked_snapshot(tiny, tmp_path):
    """A tiny or truncated copy is judged by its own weights (bf16 bytes, x2 in fp32 on a CPU),
    not by the family's reference figure (MiniMax H3: 52 GiB); no weights yet: the figure."""
    pack = get_pack("qwen3vl_minimax_h3")
    weights = sum(f.stat().st_size for f in tiny["qwen3_vl"].glob("*.safetensors")) / 2**30
    assert pack.teacher_gib({"teacher": tiny["qwen3_vl"]}, "cpu") == pytest.approx(2 * weights)
    assert pack.teacher_gib({"teacher": tiny["qwen3_vl"]}, "cuda:0") == pytest.approx(weights)
    assert pack.teacher_gib({"teacher": tmp_path}, "cpu") == pack.teacher_memory_gib == 52.0
