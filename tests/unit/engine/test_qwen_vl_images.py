"""Reference images as ggk's MageFlow conditioner sees them (engine-contract §3.2): sizes
computed by hand, the engine's double floor rule, the shapes its clip_preprocess throws on, nearest
resize + centre crop + CLIP normalisation,
and the vision tower's patch layout against transformers' own Qwen2-VL image processor."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from gguf_trainer.engine.qwen_vl_images import (
    CLIP_MEAN,
    CLIP_STD,
    MAX_TOKENS,
    engine_refuses,
    patchify,
    preprocess_image,
    resized_size,
    target_size,
    vision_tokens,
)


@pytest.mark.parametrize("hw, want, tokens", [
    # portrait, ≤ 384: 300/32 = 9.375 -> 9 -> 288; 200/32 = 6.25 -> 6 -> 192
    ((300, 200), (288, 192), 9 * 6),
    # landscape, > 384: β = 384/640 = 0.6; 480·0.6/32 = 9 -> 288; 640·0.6/32 = 12 -> 384
    ((480, 640), (288, 384), 9 * 12),
    # tiny: each side rounds to 0 cells and is raised to 32
    ((10, 7), (32, 32), 1),
    # huge: β = 384/4000; 4000β/32 = 12 -> 384; 3000β/32 = 9 -> 288
    ((4000, 3000), (384, 288), 12 * 9),
    # odd: β = 384/517; 333β = 247.3 -> 7 cells -> 224; 517β = 384 -> 384
    ((333, 517), (224, 384), 7 * 12),
    # halves round up: 48/32 = 1.5 -> 2 -> 64; 80/32 = 2.5 -> 3 -> 96
    ((48, 80), (64, 96), 2 * 3),
    # exactly 384 is not scaled: 100/32 = 3.125 -> 96
    ((384, 100), (384, 96), 12 * 3),
    # a 1-px sliver: the short side never drops under 32
    ((1, 1000), (32, 384), 12),
])
def test_target_sizes_by_hand(hw, want, tokens):
    assert target_size(*hw) == want
    assert vision_tokens(*hw) == tokens


@pytest.mark.parametrize("hw, want, float32_gave", [
    # conditioner.hpp 3176-3181 computes β and the floor in double. 401×535 (w×h): 535·(384/535)
    # in double is 383.99999 -> 11 cells (352); float32 made it 384 (96 tokens, not the engine's 88)
    ((535, 401), (352, 256), (384, 256)),
    ((8, 535), (32, 352), (32, 384)),
    # 141·384/423 is exactly 128 in double; float32 β made it 127.99999 -> 96
    ((141, 423), (128, 384), (96, 384)),
])
def test_the_scaled_sides_follow_the_engines_double_floor(hw, want, float32_gave):
    beta = np.float32(384) / np.float32(max(hw))
    assert (
        tuple(max(32, int(np.floor(np.float32(s) * beta / np.float32(32))) * 32) for s in hw)
        == float32_gave
    )
    assert target_size(*hw) == want
    assert vision_tokens(*hw) == want[0] // 32 * want[1] // 32


def test_the_shapes_the_engine_throws_on_are_refused(tmp_path):
    """util.cpp clip_preprocess: a float32 scale can leave the resize a pixel short of the target,
    and the engine's crop then throws; such a picture is refused, never padded."""
    assert target_size(592, 78) == (384, 32)
    assert engine_refuses(592, 78) and resized_size(592, 78, 384, 32) == (383, 50)  # 383 < 384
    assert not engine_refuses(300, 200) and not engine_refuses(535, 401)
    pixels = np.zeros((592, 78, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match="engine cannot preprocess a 78×592 picture"):
        preprocess_image(_png(tmp_path / "thin.png", pixels))
    rng = np.random.default_rng(5)
    shapes = rng.integers(8, 1200, size=(3000, 2))
    share = np.mean([engine_refuses(int(h), int(w)) for h, w in shapes])
    assert 0.01 < share < 0.10  # a few percent of shapes, as the engine run found


def test_no_size_gives_more_than_144_tokens():
    rng = np.random.default_rng(0)
    for h, w in rng.integers(1, 6000, size=(2000, 2)):
        th, tw = target_size(int(h), int(w))
        assert th % 32 == 0 and tw % 32 == 0 and max(th, tw) <= 384
        assert vision_tokens(int(h), int(w)) <= MAX_TOKENS == 144


def _png(path, pixels):
    Image.fromarray(pixels).save(path)
    return path


def _normalised(rgb_uint8):
    x = rgb_uint8.astype(np.float32) / np.float32(255)
    return (x - np.array(CLIP_MEAN, np.float32)) / np.array(CLIP_STD, np.float32)


def test_an_image_of_the_target_size_is_only_normalised(tmp_path):
    pixels = np.random.default_rng(1).integers(0, 256, (64, 96, 3), dtype=np.uint8)
    x = preprocess_image(_png(tmp_path / "a.png", pixels))
    assert x.shape == (3, 64, 96) and x.dtype == np.float32
    assert np.allclose(x.transpose(1, 2, 0), _normalised(pixels), atol=1e-6)


def test_nearest_cover_resize_then_centre_crop(tmp_path):
    # 100×150 -> target 96×160 (3.125 -> 3 cells, 4.6875 -> 5 cells); scale = max(160/150,
    # 96/100) = 16/15: resized to 106×160, then rows 5..100 are kept (centre crop).
    pixels = np.random.default_rng(2).integers(0, 256, (100, 150, 3), dtype=np.uint8)
    x = preprocess_image(_png(tmp_path / "b.png", pixels)).transpose(1, 2, 0)
    assert x.shape == (96, 160, 3)
    rh, rw, top = 106, 160, 5
    want = np.empty((96, 160, 3), np.uint8)
    for y in range(96):
        for c in range(160):
            want[y, c] = pixels[(y + top) * 100 // rh, c * 150 // rw]
    assert np.allclose(x, _normalised(want), atol=1e-6)


def test_greyscale_and_alpha_images_become_rgb(tmp_path):
    Image.new("L", (40, 40), 255).save(tmp_path / "g.png")
    Image.new("RGBA", (40, 40), (255, 0, 0, 10)).save(tmp_path / "r.png")
    g, r = preprocess_image(tmp_path / "g.png"), preprocess_image(tmp_path / "r.png")
    assert g.shape == r.shape == (3, 32, 32)
    assert np.allclose(g[2], (1 - CLIP_MEAN[2]) / CLIP_STD[2], atol=1e-6)
    assert np.allclose(r[1], -CLIP_MEAN[1] / CLIP_STD[1], atol=1e-6)


def test_patch_rows_match_the_qwen2vl_image_processor():
    """The rows the tower takes: transformers' processor on the same (already preprocessed)
    pixels, with its own resize / rescale / normalise turned off."""
    from transformers import Qwen2VLImageProcessorPil

    x = np.random.default_rng(3).standard_normal((3, 64, 96)).astype(np.float32)
    proc = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2)
    ref = proc(
        images=[x],
        do_resize=False,
        do_rescale=False,
        do_normalize=False,
        return_tensors="np",
        input_data_format="channels_first",
    )
    rows, grid = patchify(x)
    assert grid == (1, 4, 6) and ref["image_grid_thw"].tolist() == [[1, 4, 6]]
    assert rows.shape == (24, 3 * 2 * 16 * 16)
    assert np.array_equal(rows, ref["pixel_values"])
    with pytest.raises(ValueError, match="multiple of 32"):
        patchify(np.zeros((3, 48, 64), np.float32))
