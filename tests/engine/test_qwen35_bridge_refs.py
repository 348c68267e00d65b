"""Engine tier, Qwen3.5 bridge references: ggk 0.9.7's own preprocessing of a reference picture
for the Qwen3.5 vision tower (Qwen35BridgeEmbedder: smart resize to multiples of 32, the area
clamped to [65536, max_pixels], sd::ops::interpolate Bilinear with antialias, alpha over white,
2x - 1) against engine/qwen35_refs.py. The driver (qwen35_bridge/ref_probe.cpp, built by
qwen35_engine.py) compiles the engine's lines, cut verbatim from conditioner.hpp, over
core/tensor.hpp (header only: one g++ call, ~15 s). Asserts the same size and the same pixels
within 1e-6 on shapes that upscale, downscale past max_pixels, clamp to min_pixels, keep their
size, RGB and RGBA."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from qwen35_engine import build_ref_probe

from gguf_trainer.engine.qwen35_refs import bridge_pixels, smart_size

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ref_probe() -> Path:
    return build_ref_probe()


@pytest.mark.parametrize("w,h,c,max_pixels", [
    (300, 200, 3, 1024 * 1024), (37, 91, 4, 1024 * 1024), (640, 480, 3, 1024 * 1024),
    (1500, 900, 4, 1024 * 1024), (257, 333, 3, 1024 * 1024), (1001, 517, 3, 512 * 512),
])
def test_engine_reference_pixels_are_ours(ref_probe, w, h, c, max_pixels):
    img = np.random.default_rng(w * h).random((h, w, c)).astype(np.float32)
    res = subprocess.run([str(ref_probe), str(w), str(h), str(c), str(max_pixels)],
                         input=np.ascontiguousarray(img.transpose(2, 0, 1)).tobytes(),
                         capture_output=True, check=True)
    w_bar, h_bar = map(int, res.stderr.split())
    assert (w_bar, h_bar) == smart_size(w, h, max_pixels)
    engine = np.frombuffer(res.stdout, dtype=np.float32).reshape(3, h_bar, w_bar)
    ours = bridge_pixels(img, max_pixels)
    diff = float(np.abs(engine - ours).max())
    print(f"{w}x{h}x{c} -> {w_bar}x{h_bar}: max |engine - ours| {diff:.2e}")
    assert diff <= 1e-6
