"""The vision path's parts: the ridge fit behind vision_proj (and the skip start), the
project file that caches it by its inputs, image-token runs and splices, the MageFlow image
preprocessing and templates (real tokenizer), and the image-aware mock teacher."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.engine.qwen_ids import IMAGE_PAD_ID
from gguf_trainer.engine.qwen_vl_images import preprocess_image, target_size
from gguf_trainer.model import vision
from gguf_trainer.model.ridge import RidgeAccumulator
from gguf_trainer.model.student import load_tokenizer
from gguf_trainer.packs import get_pack
from gguf_trainer.packs.qwen3vl_mageflow import (
    EDIT_PREFIX,
    EDIT_START,
    IMAGE_HEADER_TOKENS,
    T2I_START,
)
from gguf_trainer.teachers.base import VisionSegment

VIS, IN = 24, 8


def test_ridge_recovers_a_linear_map_with_bias():
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(IN, VIS, generator=g), torch.randn(IN, generator=g)
    x = torch.randn(500, VIS, generator=g)
    acc = RidgeAccumulator(VIS, IN)
    for chunk in x.split(128):  # chunked accumulation == one pass
        acc.add(chunk, chunk @ w.T + b)
    got_w, got_b = acc.solve(bias=True, lambda_rel=1e-9)
    assert torch.allclose(got_w, w, atol=1e-4) and torch.allclose(got_b, b, atol=1e-4)
    no_bias, none = acc.solve(bias=False)
    assert none is None and not torch.allclose(no_bias, w, atol=1e-2)  # the bias is not free


def test_fit_vision_proj_maps_teacher_table_to_student_table():
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(300, VIS, generator=g)
    true = torch.randn(IN, VIS, generator=g)
    student = teacher[:200] @ true.T  # the student vocabulary is smaller: 200 shared ids
    w, fit = vision.fit_vision_proj(teacher, student)
    assert w.shape == (IN, VIS) and fit["shared_vocab"] == 200
    assert torch.allclose(w, true, atol=1e-2) and fit["cos_mean"] > 0.999 and fit["rel_mse"] < 1e-4


def test_vision_proj_file_is_fitted_once_per_inputs(tmp_path):
    g = torch.Generator().manual_seed(2)
    tables = (torch.randn(64, VIS, generator=g), torch.randn(64, IN, generator=g))
    calls = []

    def load():
        calls.append(1)
        return tables

    path = tmp_path / "vision_proj.safetensors"
    inputs = {"student_sha256": "a", "teacher": {"mock": "x"}}
    sha = vision.ensure_vision_proj(path, inputs, load)
    assert vision.ensure_vision_proj(path, inputs, load) == sha and len(calls) == 1
    w = vision.load_vision_proj(path)
    assert w.shape == (IN, VIS) and w.dtype == torch.float32
    assert vision.read_inputs(path)["student_sha256"] == "a"
    vision.ensure_vision_proj(path, {**inputs, "student_sha256": "b"}, load)  # new student: refit
    assert len(calls) == 2
    path.write_bytes(b"garbage")  # a damaged file is refitted, never trusted
    assert vision.ensure_vision_proj(path, inputs, load) == sha and len(calls) == 3


def test_fitted_sha_only_looks(tmp_path):
    """What precompute's `inputs` reads: the fitted map's sha256 or None; never fits."""
    g = torch.Generator().manual_seed(3)
    tables = (torch.randn(64, VIS, generator=g), torch.randn(64, IN, generator=g))
    path = tmp_path / "vision_proj.safetensors"
    inputs = {"student_sha256": "a", "teacher": {"mock": "x"}}
    assert vision.fitted_sha(path, inputs) is None and not path.exists()
    sha = vision.ensure_vision_proj(path, inputs, lambda: tables)
    before = path.read_bytes()
    assert vision.fitted_sha(path, inputs) == sha
    assert vision.fitted_sha(path, {**inputs, "student_sha256": "b"}) is None
    assert path.read_bytes() == before  # a stale map is left for ensure_vision_proj to refit


def test_image_runs_and_splices():
    ids = [
        5,
        IMAGE_PAD_ID,
        IMAGE_PAD_ID,
        7,
        IMAGE_PAD_ID,
        9,
        IMAGE_PAD_ID,
        IMAGE_PAD_ID,
        IMAGE_PAD_ID,
    ]
    runs = vision.image_runs(ids, IMAGE_PAD_ID)
    assert runs == [(1, 2), (4, 1), (6, 3)]
    raw = [torch.randn(n, VIS) for _, n in runs]
    w = torch.randn(IN, VIS)
    sp = vision.splices(runs, raw, w, batch_index=3)
    assert [(b, s) for b, s, _ in sp] == [(3, 1), (3, 4), (3, 6)]
    assert torch.allclose(sp[2][2], raw[2] @ w.T)
    with pytest.raises(ValueError, match="do not match"):
        vision.splices(runs, raw[:2], w, 0)


@pytest.mark.parametrize(
    "hw, want",
    [
        ((64, 96), (64, 96)),
        ((50, 70), (64, 64)),
        ((10, 10), (32, 32)),
        ((800, 600), (384, 288)),
        ((1000, 100), (384, 32)),
    ],
)
def test_target_size(hw, want):
    assert target_size(*hw) == want


def _png(path, h, w, seed=0):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(path)
    return path


def test_preprocess_is_nearest_crop_and_clip_normalised(tmp_path):
    x = preprocess_image(_png(tmp_path / "a.png", 70, 100))
    assert x.shape == (3, 64, 96) and x.dtype == np.float32
    flat = _png(tmp_path / "b.png", 40, 40)
    Image.new("RGB", (40, 40), (255, 0, 0)).save(flat)
    y = preprocess_image(flat)
    assert y.shape == (3, 32, 32)
    assert np.allclose(y[0], (1.0 - 0.48145466) / 0.26862954) and np.allclose(
        y[1], -0.4578275 / 0.26130258
    )


@pytest.fixture(scope="module")
def tokenizer(qwen_tokenizer_dir):
    return load_tokenizer(qwen_tokenizer_dir)


def test_mageflow_edit_template_positions(tokenizer, tmp_path):
    pack = get_pack("qwen3vl_mageflow")
    sample = Sample("make it night", (tmp_path / "a.png", tmp_path / "b.png"))
    encode = engine_bpe(tokenizer).encode
    ids = pack.student_ids(encode, sample, (6, 4))
    assert len(encode(EDIT_PREFIX)) == EDIT_START == 64
    runs = vision.image_runs(ids, pack.image_pad_id)
    # the engine's splice index: 64 + 6 for image 1, then 1 + n_prev + 6 later
    assert runs == [
        (EDIT_START + IMAGE_HEADER_TOKENS, 6),
        (EDIT_START + 2 * IMAGE_HEADER_TOKENS + 7, 4),
    ]
    assert ids[runs[0][0] - 1] == 151652 and ids[runs[0][0] + 6] == 151653  # vision_start / _end
    text_only = pack.student_ids(encode, Sample("make it night"))
    assert vision.image_runs(text_only, pack.image_pad_id) == []


def test_mageflow_mock_teacher_sees_images(tokenizer, tmp_path):
    pack = get_pack("qwen3vl_mageflow")
    teacher = pack.build_mock_teacher(None)
    a, b = _png(tmp_path / "a.png", 64, 96, 1), _png(tmp_path / "b.png", 64, 96, 2)
    (ra,), (rb,) = teacher.vision([a]), teacher.vision([b])
    assert ra.shape == (6, pack.vis_dim) and torch.isfinite(ra).all()  # (64/32)·(96/32) tokens
    assert teacher.embed_table().shape[1] == pack.vis_dim
    sample = Sample("make it night", (a,))
    ids = pack.student_ids(engine_bpe(tokenizer).encode, sample, (6,))
    ((start, _),) = vision.image_runs(ids, IMAGE_PAD_ID)
    (ta,) = teacher.targets([sample], [ids], [[VisionSegment(start, ra)]])
    (tb,) = teacher.targets([sample], [ids], [[VisionSegment(start, rb)]])
    assert ta.rows.shape == (len(ids), pack.out_dim) and ta.sup_start == EDIT_START
    assert torch.equal(ta.rows[:start], tb.rows[:start])  # causal: rows before the image agree
    assert not torch.allclose(ta.rows[start:], tb.rows[start:], atol=1e-3)  # the image matters
    (txt,) = teacher.targets([Sample("x")], [ids[:40]])
    assert txt.sup_start == T2I_START
