"""The Qwen3.5 bridge teacher with reference images, on the tiny real snapshot (tiny/qwen35.py,
a real transformers Qwen3_5ForConditionalGeneration with its vision tower): `vision` gives as
many rows as the engine's tower (the smart-resized grid / 32), `vision_segments` puts each
reference on its `<|image_pad|>` run where the engine counts it, and `targets` with those
segments is transformers' own multimodal forward (input_ids with the pads, pixel_values of the
engine's pixels, image_grid_thw, M-RoPE) exactly, in a batch beside a text-only prompt whose
rows stay its own. A prompt that spells `<|image_pad|>` is refused with one sentence."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.qwen35_refs import bridge_pixels, load_image, smart_size
from gguf_trainer.engine.qwen_vl_images import patchify
from gguf_trainer.teachers.qwen35 import IMAGE_PAD_ID, load_qwen35_teacher
from gguf_trainer.tiny.qwen35 import copy_tiny_qwen35

pytestmark = pytest.mark.slow  # the tiny snapshot's 248320-row vocabulary: ~40 s to build


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return copy_tiny_qwen35(tmp_path_factory.mktemp("qwen35") / "Qwen3.5-tiny")


@pytest.fixture(scope="module")
def teacher(root):
    return load_qwen35_teacher(root, "cpu", max_slots=512, mode="cpu")


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    from PIL import Image

    folder = tmp_path_factory.mktemp("refs")
    rng = np.random.default_rng(0)
    out = []
    for k, (h, w, mode) in enumerate([(100, 140, "RGB"), (300, 200, "RGBA")]):
        path = folder / f"p{k}.png"
        Image.fromarray(rng.integers(0, 255, (h, w, len(mode)), dtype=np.uint8), mode).save(path)
        out.append(path)
    return out


def test_references_are_transformers_own_multimodal_forward(root, teacher, pictures):
    from transformers import AutoModel

    rows = teacher.vision(pictures)
    for r, p in zip(rows, pictures):
        x = load_image(p)
        w_bar, h_bar = smart_size(x.shape[1], x.shape[0])
        assert r.shape == ((h_bar // 32) * (w_bar // 32), 64) and r.grid == (h_bar // 32,
                                                                           w_bar // 32)
    segs = teacher.vision_segments(rows)
    sample = Sample("put the cat from image 2 on the sofa", tuple(pictures))
    text = Sample("a red fox in the snow")
    out = teacher.targets([sample, text], [[1], [1]], [segs, []])
    ids = out[0].seed_ids[: out[0].rows.shape[0]]
    for g in segs:  # each on its pad run
        assert ids[g.start : g.start + g.rows.shape[0]] == [IMAGE_PAD_ID] * g.rows.shape[0]
    assert teacher.lengths([sample, text], [[1], [1]], [segs, []]) == [len(o.rows) for o in out]

    model = AutoModel.from_pretrained(str(root), dtype=torch.float32).eval()
    px = [patchify(bridge_pixels(load_image(p))) for p in pictures]
    with torch.no_grad():
        want = model(input_ids=torch.tensor([ids]),
                     pixel_values=torch.from_numpy(np.concatenate([r for r, _ in px])),
                     image_grid_thw=torch.tensor([g for _, g in px]),
                     mm_token_type_ids=(torch.tensor([ids]) == IMAGE_PAD_ID).int()
                     ).last_hidden_state[0]
        alone = model.language_model(input_ids=torch.tensor([out[1].seed_ids[:len(out[1].rows)]]))
    diff = float((out[0].rows - want).abs().max())
    print(f"teacher with 2 references vs transformers' multimodal forward: max |diff| {diff:.2e}")
    torch.testing.assert_close(out[0].rows, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[1].rows, alone.last_hidden_state[0], rtol=1e-4, atol=1e-4)
    blind = teacher.targets([Sample(sample.text)], [[1]])[0].rows  # the pictures matter
    assert float((blind[-5:] - out[0].rows[-5:]).abs().max()) > 1e-3

