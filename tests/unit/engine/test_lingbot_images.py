"""LingBot Video reference images (conditioner.hpp 2994-3044): the size rule, the one-piece
template with one `<|vision_start|>` block per image after the dropped 140-token prefix, at the
rows the engine's tokenizer counts, and the Qwen3-VL teacher on a tiny real snapshot sized and
spliced by LingBot's declarations. The engine tier (tests/engine) runs the same sizes, ids,
runs and refusals through the engine's own code."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.engine.qwen_vl_images import vision_tokens
from gguf_trainer.engine.template_ids import Piece, template_ids
from gguf_trainer.model.student import load_tokenizer
from gguf_trainer.model.vision import image_runs
from gguf_trainer.packs import get_pack
from gguf_trainer.packs.qwen3vl_lingbot import LINGBOT_PREFIX, lingbot_target_size
from gguf_trainer.teachers import qwen3vl
from gguf_trainer.teachers.base import VisionSegment
from gguf_trainer.tiny import qwen_tokenizer_dir
from gguf_trainer.tiny.qwen3vl import HIDDEN, copy_tiny_qwen3vl

PACK = get_pack("qwen3vl_lingbot")
ASSISTANT = "<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def encode():
    return engine_bpe(load_tokenizer(qwen_tokenizer_dir())).encode


def test_the_size_rule_is_the_engines():
    """Sides rounded to 32 (3007-3008); area over 16384·32² scaled down with floor (3015-3018),
    under 4·32² scaled up with ceil (3019-3022)."""
    assert lingbot_target_size(64, 96) == (64, 96)  # kept: 6 tokens
    assert lingbot_target_size(300, 200) == (288, 192)  # 9.375 -> 9, 6.25 -> 6 cells
    assert lingbot_target_size(20, 20) == (64, 64)  # 32×32 is under 4·32²: β = 3.2, ceil
    assert lingbot_target_size(10, 1000) == (32, 992)  # 0.31 -> 0 -> 32 at least
    assert lingbot_target_size(5000, 5000) == (4096, 4096)  # 156² cells > 16384: β = 1.22
    assert vision_tokens(5000, 5000, lingbot_target_size) == 16384
    with pytest.raises(ValueError):
        lingbot_target_size(3, 0)


def test_the_template_is_one_piece_with_the_blocks_after_the_dropped_prefix(encode):
    sample = Sample("the cat (walks:1.2) away", images=("a.png", "b.png"))
    ids = PACK.student_ids(encode, sample, [6, 4])
    block = "<|vision_start|>{}<|vision_end|>".format
    images = block("<|image_pad|>" * 6) + block("<|image_pad|>" * 4)
    # one unparsed piece (3047): weight syntax stays text
    assert ids == template_ids(encode, [Piece(LINGBOT_PREFIX + images + sample.text + ASSISTANT)])
    assert PACK.template_start(sample) == PACK.template_start(Sample("x")) == 140
    first = len(encode(LINGBOT_PREFIX + "<|vision_start|>"))  # 3028-3029
    second = len(encode(LINGBOT_PREFIX + block("<|image_pad|>" * 6) + "<|vision_start|>"))
    assert image_runs(ids, PACK.image_pad_id) == [(first, 6), (second, 4)] and first == 141
    assert PACK.student_ids(encode, Sample("x")) == encode(LINGBOT_PREFIX + "x" + ASSISTANT)


def test_the_teacher_sizes_by_lingbots_rule_and_splices_as_the_engine(tmp_path, encode):
    root = copy_tiny_qwen3vl(tmp_path / "Qwen3-VL-tiny")
    teacher = qwen3vl.load_qwen3vl_teacher(root, "cpu", "cpu", student_pieces=PACK.student_pieces,
                                           template=PACK.teacher_template())
    try:
        rng = np.random.default_rng(2)
        paths = []
        for i, (h, w) in enumerate(((64, 96), (20, 20))):
            paths.append(tmp_path / f"p{i}.png")
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(paths[-1])
        rows = teacher.vision(paths)
        assert [r.shape for r in rows] == [(6, HIDDEN), (4, HIDDEN)]  # 64×96 and 20×20 -> 64×64
        sample = Sample("the cat walks away", images=tuple(paths))
        ids = PACK.student_ids(encode, sample, [r.shape[0] for r in rows])
        runs = image_runs(ids, PACK.image_pad_id)
        segs = [VisionSegment(s, r) for (s, _), r in zip(runs, rows)]
        got = teacher.targets([sample], [ids], [segs])[0]
        assert got.rows.shape == (len(ids), HIDDEN) and got.sup_start == 140
        e = teacher.text.embed_tokens(torch.tensor([ids])).clone()
        for seg in segs:
            e[0, seg.start: seg.start + seg.rows.shape[0]] = seg.rows
        with torch.no_grad():
            keep = torch.ones(1, len(ids), dtype=torch.long)
            want = teacher.text(inputs_embeds=e, attention_mask=keep).last_hidden_state[0]
        assert torch.allclose(got.rows, want, atol=1e-5)
    finally:
        teacher.close()
