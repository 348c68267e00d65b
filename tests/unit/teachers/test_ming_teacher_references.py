"""The Ming teacher of a released snapshot (tiny/ming.py write_released_snapshot: mllm/ with the
tower) with an edit's reference: load_ming_teacher loads the release's tower + linear_proj,
`vision` gives its L2 rows of the engine-sized picture with the merged grid, `vision_segments`
puts the first reference (only) on the template's <imagePatch> run, and `targets` is the
thinker run with that image block (ming.py images=), the picture changing the rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.ling_bpe import IMAGE_PATCH, ming_prompt_ids
from gguf_trainer.teachers.ming_snapshot import load_ming_teacher
from gguf_trainer.teachers.ming_vision import FACTOR, load_ming_vision, preprocess

pytestmark = pytest.mark.slow  # the tiny tower on 672-px pictures: ~1 min on a loaded CPU


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    from gguf_trainer.tiny.ming import write_released_snapshot

    return write_released_snapshot(tmp_path_factory.mktemp("ming") / "Ming-Image-0.1-Design")


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    from PIL import Image

    folder = tmp_path_factory.mktemp("refs")
    rng = np.random.default_rng(3)
    out = []
    for k, (h, w) in enumerate([(90, 150), (200, 120)]):
        path = folder / f"p{k}.png"
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(path)
        out.append(path)
    return out


def test_the_release_teacher_reads_the_first_reference(released, pictures):
    teacher = load_ming_teacher(released, "cpu", 1280)
    assert teacher.tower is not None and teacher.vis_dim == teacher.model.cfg.hidden
    rows = teacher.vision(pictures)
    tower = load_ming_vision(released)
    for r, p in zip(rows, pictures):
        from PIL import Image

        rgb = torch.from_numpy(np.asarray(Image.open(p).convert("RGB"), dtype=np.float32) / 255)
        x = preprocess(rgb.permute(2, 0, 1))
        assert r.grid == (x.shape[1] // FACTOR, x.shape[2] // FACTOR)
        torch.testing.assert_close(r, tower.encode(x).float())
    segs = teacher.vision_segments(rows)
    assert len(segs) == 1 and segs[0].rows is rows[0]  # the engine shows one reference
    sample = Sample("make it a watercolour", tuple(pictures))
    ids, start = ming_prompt_ids(teacher.bpe, sample.text, rows[0].shape[0])
    assert segs[0].start == start and ids[start : start + len(rows[0])] == [IMAGE_PATCH] * len(
        rows[0])
    assert teacher.lengths([sample], [[1]], [segs]) == [len(ids)]
    out = teacher.targets([sample], [[1]], [segs])[0]
    assert out.seed_ids[: len(ids)] == ids
    with torch.no_grad():
        want = teacher.model([ids], images=[(rows[0], start, *rows[0].grid)])
    torch.testing.assert_close(out.rows[256:], want.direct[0].float())
    blind = teacher.targets([Sample(sample.text)], [[1]])[0].rows
    assert float((blind[-3:] - out.rows[-3:]).abs().max()) > 1e-4  # the picture matters
