"""Boogu Image edits (conditioner.hpp 3246-3286): the reference-image size rule, the edit template
with one `<|vision_start|>` block per image at the rows the engine's tokenizer counts, the
Qwen3-VL teacher on a tiny real snapshot sized and spliced by Boogu's declarations (not
MageFlow's), and the corpus refusing the shapes the engine throws on at Boogu's size. The
engine tier (tests/engine) runs the same sizes, ids and runs through the engine's own code."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.engine.qwen_vl_images import engine_refuses, target_size, vision_tokens
from gguf_trainer.engine.template_ids import Piece, template_ids
from gguf_trainer.model.student import load_tokenizer
from gguf_trainer.model.vision import image_runs
from gguf_trainer.packs import get_pack
from gguf_trainer.packs.qwen3vl_boogu import EDIT_SYSTEM, T2I_SYSTEM, boogu_target_size
from gguf_trainer.stages import corpus_build
from gguf_trainer.teachers import qwen3vl
from gguf_trainer.teachers.base import VisionSegment
from gguf_trainer.tiny import qwen_tokenizer_dir
from gguf_trainer.tiny.qwen3vl import HIDDEN, copy_tiny_qwen3vl

PACK = get_pack("qwen3vl_boogu")
EDIT_PREFIX = "<|im_start|>system\n" + EDIT_SYSTEM + "<|im_end|>\n<|im_start|>user\n"


@pytest.fixture(scope="module")
def encode():
    return engine_bpe(load_tokenizer(qwen_tokenizer_dir())).encode


def test_the_size_rule_is_the_engines_area_rule():
    """β = sqrt(384²/(h·w)); each side max(32, round(side·β/32)·32) (3258-3263)."""
    assert boogu_target_size(64, 64) == (384, 384) == boogu_target_size(1000, 1000)
    assert boogu_target_size(64, 96) == (320, 480)  # 9.80 -> 10, 14.70 -> 15 cells
    assert boogu_target_size(10, 1000) == (32, 3840)  # no cap on the long side, 32 at least
    assert boogu_target_size(48, 336) == (160, 1024)  # 4.53 -> 5, 31.75 -> 32 cells
    assert target_size(48, 48 * 7) == (64, 352)  # MageFlow's rule for the same picture
    assert vision_tokens(64, 96, boogu_target_size) == 150
    for h, w in ((37, 91), (300, 200), (1024, 768), (5, 2000)):  # about 384² pixels
        th, tw = boogu_target_size(h, w)
        assert th % 32 == tw % 32 == 0 and 0.5 < th * tw / 384**2 < 2.2
    with pytest.raises(ValueError):
        boogu_target_size(0, 10)


def test_the_edit_template_has_one_block_per_image_at_the_tokenizer_counted_rows(encode):
    sample = Sample("make it night", images=("a.png", "b.png"))
    ids = PACK.student_ids(encode, sample, [6, 4])
    block = "<|vision_start|>{}<|vision_end|>".format
    images = block("<|image_pad|>" * 6) + block("<|image_pad|>" * 4)
    want = template_ids(encode, [Piece(EDIT_PREFIX + images), Piece("make it night", prompt=True),
                                 Piece("<|im_end|>\n")])
    assert ids == want and PACK.template_start(sample) == 0
    # 3270-3271: image i sits after the tokens of everything before it, its <|vision_start|> too
    first = len(encode(EDIT_PREFIX + "<|vision_start|>"))
    second = len(encode(EDIT_PREFIX + block("<|image_pad|>" * 6) + "<|vision_start|>"))
    assert image_runs(ids, PACK.image_pad_id) == [(first, 6), (second, 4)]
    # with images the edit system prompt for any text (3246); the same text alone is text-to-image
    t2i = encode("<|im_start|>system\n" + T2I_SYSTEM + "<|im_end|>\n<|im_start|>user\n")
    assert PACK.student_ids(encode, Sample("make it night"))[: len(t2i)] == t2i


def test_the_teacher_template_counts_by_tokenizer_not_mageflows_constants():
    template = PACK.teacher_template()
    counts = qwen3vl.check_templates(load_tokenizer(qwen_tokenizer_dir()), template)
    assert counts["image 1 header"] == counts["image 9 header"] == 1  # <|vision_start|> alone
    assert counts["edit prefix"] == 64  # the same system prompt as MageFlow's; start stays 0
    assert qwen3vl.splice_starts([6, 4], template, counts["edit prefix"]) == [65, 65 + 6 + 1 + 1]
    assert qwen3vl.sup_start(True, template) == qwen3vl.sup_start(False, template) == 0


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    root = copy_tiny_qwen3vl(tmp_path_factory.mktemp("boogu") / "Qwen3-VL-tiny")
    t = qwen3vl.load_qwen3vl_teacher(root, "cpu", "cpu", student_pieces=PACK.student_pieces,
                                     template=PACK.teacher_template())
    yield t
    t.close()


def test_the_teacher_sizes_by_boogus_rule_and_splices_as_the_engine(teacher, tmp_path, encode):
    rng = np.random.default_rng(1)
    paths = []
    for i, (h, w) in enumerate(((64, 96), (100, 60))):
        paths.append(tmp_path / f"p{i}.png")
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(paths[-1])
    rows = teacher.vision(paths)
    second = vision_tokens(100, 60, boogu_target_size)
    assert [r.shape for r in rows] == [(150, HIDDEN), (second, HIDDEN)]
    sample = Sample("swap the colours", images=tuple(paths))
    ids = PACK.student_ids(encode, sample, [r.shape[0] for r in rows])
    runs = image_runs(ids, PACK.image_pad_id)
    segs = [VisionSegment(s, r) for (s, _), r in zip(runs, rows)]
    got = teacher.targets([sample], [ids], [segs])[0]
    assert got.rows.shape == (len(ids), HIDDEN) and got.sup_start == 0
    # the final norm over the template's embeddings with the raw merger rows over the pad runs
    e = teacher.text.embed_tokens(torch.tensor([ids])).clone()
    for seg in segs:
        e[0, seg.start: seg.start + seg.rows.shape[0]] = seg.rows
    with torch.no_grad():
        keep = torch.ones(1, len(ids), dtype=torch.long)
        want = teacher.text(inputs_embeds=e, attention_mask=keep)
    assert torch.allclose(got.rows, want.last_hidden_state[0], atol=1e-5)
    plain = teacher.targets([sample], [ids], [[VisionSegment(s, torch.zeros_like(r)) for s, r in
                                                zip((s for s, _ in runs), rows)]])[0]
    assert not torch.allclose(plain.rows[runs[0][0]], got.rows[runs[0][0]], atol=1e-3)


def test_the_corpus_refuses_the_shapes_the_engine_throws_on_at_boogus_size(tmp_path):
    boogu_only, mageflow_only = (20, 22), (28, 55)  # engine_refuses at one rule, not the other
    assert engine_refuses(*boogu_only, boogu_target_size) and not engine_refuses(*boogu_only)
    assert engine_refuses(*mageflow_only) and not engine_refuses(*mageflow_only, boogu_target_size)
    samples = []
    for h, w in (boogu_only, mageflow_only):
        path = tmp_path / f"{h}x{w}.png"
        Image.new("RGB", (w, h)).save(path)
        samples.append(Sample("make it night", images=(path,)))
    tally: Counter = Counter()
    kept = corpus_build._check_images(samples, True, tally, boogu_target_size)
    assert [s.images[0].name for s in kept] == ["28x55.png"] and tally["engine_size"] == 1
