"""engine/qwen35_refs.py: the Qwen3.5 bridge's reference sizing and pixels (the engine tier,
tests/engine/test_qwen35_bridge_refs.py, compares them with ggk's own lines)."""

from __future__ import annotations

import numpy as np

from gguf_trainer.engine.qwen35_refs import bilinear_weights, bridge_pixels, smart_size


def test_smart_size_rounds_clamps_and_caps():
    assert smart_size(300, 200) == (320, 224)  # rounded to 32 (llround), area >= 65536
    assert smart_size(37, 91) == (192, 416)  # clamped up to 65536 px (ceil)
    assert smart_size(1500, 900) == (1312, 768)  # capped at 1024² (floor)
    assert smart_size(1001, 517, 512 * 512) == (704, 352)  # vlm_max_size 512
    assert smart_size(336, 336) == (352, 352)  # 10.5 rounds away from zero, as C's llround


def test_weights_are_a_partition_of_unity_and_pixels_composite_over_white():
    for n_in, n_out in ((10, 4), (4, 10), (7, 7)):
        assert np.allclose(bilinear_weights(n_in, n_out).sum(1), 1.0)
    clear = np.zeros((256, 256, 4), dtype=np.float32)  # fully transparent black
    x = bridge_pixels(clear)
    assert x.shape == (3, 256, 256) and np.allclose(x, 1.0)  # white, 2x - 1
