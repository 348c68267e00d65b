"""Engine tier, Qwen3.5 bridge references: ggk 0.9.7's own preprocessing of a reference picture
for the Qwen3.5 vision tower (Qwen35BridgeEmbedder: smart resize to multiples of 32, the area
clamped to [65536, max_pixels], sd::ops::interpolate Bilinear with antialias, alpha over white,
2x - 1) against engine/qwen35_refs.py. The driver (qwen35_bridge/ref_probe.cpp) compiles the
engine's lines, cut verbatim from conditioner.hpp, over core/tensor.hpp (header only: one g++
call, ~15 s). Asserts the same size and the same pixels within 1e-6 on shapes that upscale,
downscale past max_pixels, clamp to min_pixels, keep their size, RGB and RGBA."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from engine_build import (
    CONDITIONER,
    SDIST_SHA256,
    EngineBuildError,
    cache_root,
    fetch_sdist,
    source_lines,
    unpack,
)

from gguf_trainer.engine.qwen35_refs import bridge_pixels, smart_size

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent / "qwen35_bridge"
STRUCT = "struct Qwen35BridgeEmbedder"


@pytest.fixture(scope="module")
def ref_probe() -> Path:
    if shutil.which("g++") is None:
        raise EngineBuildError("g++ is not installed (apt-get install -y g++)")
    root = cache_root() / SDIST_SHA256[:16]
    engine = unpack(fetch_sdist(root), root / "src")
    cond = (engine / CONDITIONER).read_text(encoding="utf-8").splitlines()
    s = next(i for i, t in enumerate(cond) if t.startswith(STRUCT))
    a = next(i for i in range(s, len(cond))
             if cond[i].strip() == "const int64_t width  = image.shape()[0];") + 1
    b = next(i for i in range(a, len(cond)) if "student->encode_image(" in cond[i])  # excluded
    work = root / "qwen35_bridge_refs"
    work.mkdir(parents=True, exist_ok=True)
    inc = f'#line {a} "{CONDITIONER}"\n' + "\n".join(source_lines(engine, CONDITIONER, a, b)) + "\n"
    (work / "bridge_refs.inc").write_text(inc)
    shutil.copyfile(HERE / "ref_probe.cpp", work / "ref_probe.cpp")
    out = work / "ref_probe"
    res = subprocess.run(["g++", "-std=c++17", "-O2", f"-I{engine / 'diffusion/src'}",
                          f"-I{work}", str(work / "ref_probe.cpp"), "-o", str(out)],
                         capture_output=True, text=True, check=False)
    if res.returncode:
        raise EngineBuildError("ref_probe did not build:\n" + res.stderr[-6000:])
    return out


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
