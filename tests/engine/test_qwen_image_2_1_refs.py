"""Engine tier, Qwen Image 2.1 references: the pixels its vision tower gets, from ggk 0.9.7's own
lines against qwen_image_refs.py. A small program is cut from the pinned source at the lines the
pack cites (`engine_references`): the CLI's 8-bit to float (ggml_extend.hpp sd_image_get_f32,
util.cpp sd_image_to_tensor), the pipeline's reference sizing and nearest resize at the render
area (gk-diffuser.cpp, preset "qwen"), the conditioner's alpha-over-white 2x − 1 (conditioner.hpp);
it is compiled with g++ and fed RGBA / RGB noise of the tier's 100 sizes at three renders. Sizes
must be identical and the pixels equal to 1e-6 (float32 either way)."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from engine_build import ENGINE, SDIST_SHA256, cache_root, fetch_sdist, source_lines, unpack
from PIL import Image
from tier_corpus import image_sizes

from gguf_trainer.engine.qwen_image_refs import ref_pixels, ref_size
from gguf_trainer.packs import get_pack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

PACK = get_pack("qwen3vl_qwen_image_2_1")
# What each cited range must start and end with (a moved line fails here, not in the compiler).
ANCHORS = {
    "to_float": ("__STATIC_INLINE__ float sd_image_get_f32", "}"),
    "to_tensor": ("sd::Tensor<float> sd_image_to_tensor(sd_image_t image,", "}"),
    "resize": ("double vae_width;", "bilinear_ref);"),
    "composite": ("auto rgb = sd::Tensor<float>({width, height, 3, 1});", "}"),
}
PRESET = ('{"qwen", {true, true, Rope::RefIndexMode::INCREASE, false, true, -1, '
          "RefImageResizeMode::AREA, -1, -1}},")

PROGRAM = r"""
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <utility>
#include <vector>
#include "gk-diffuser.h"
#include "model.h"
#include "core/tensor.hpp"
#define __STATIC_INLINE__ static inline
%(to_float)s
%(to_tensor)s
// The "qwen" preset (model/diffusion/model.hpp; the test checks its line): only the fields the
// cut reads, at that preset's values (resize_before_vae true, the rest RefImageParams' defaults).
struct { bool resize_vae_to_target = false, resize_single_ref_to_target = false,
         vae_size_buckets = false, vae_center_crop = false; int vae_input_max_pixels = -1; }
    ref_image_params;
static std::pair<int, int> select_image_size_bucket(int, int, int, int, int, int) {
    throw std::runtime_error("not the qwen preset");
}
static sd::Tensor<float> resize_and_center_crop(const sd::Tensor<float>&, int, int) {
    throw std::runtime_error("not the qwen preset");
}
struct { SDVersion version = VERSION_QWEN_IMAGE_2_1; } sd_;
struct { decltype(sd_)* sd = &sd_; } ctx_, *sd_ctx = &ctx_;

// stdin: "W H w h C IN OUT" per line (IN: h*w*C bytes as the CLI loads them); stdout "h_bar w_bar";
// OUT: the f32 planar [3][h_bar][w_bar] the tower gets
int main() {
    int W, H, w, h, C;
    std::string in, out_path;
    while (std::cin >> W >> H >> w >> h >> C >> in >> out_path) {
        std::vector<uint8_t> bytes(static_cast<size_t>(w) * h * C);
        FILE* f = fopen(in.c_str(), "rb");
        if (!f || fread(bytes.data(), 1, bytes.size(), f) != bytes.size()) return 2;
        fclose(f);
        sd_image_t picture = {static_cast<uint32_t>(w), static_cast<uint32_t>(h),
                              static_cast<uint32_t>(C), bytes.data()};
        std::vector<sd::Tensor<float>> ref_images = {sd_image_to_tensor(picture, -1, -1, true)};
        struct { int width, height; } req = {W, H}, *request = &req;
        size_t i = 0;
%(resize)s
        const auto& image = resized_ref_img;
        int64_t width = image.shape()[0], height = image.shape()[1], pixels = width * height;
%(composite)s
        FILE* o = fopen(out_path.c_str(), "wb");
        fwrite(rgb.data(), sizeof(float), static_cast<size_t>(rgb.numel()), o);
        fclose(o);
        std::cout << height << " " << width << std::endl;
    }
    return 0;
}
"""


def _cut(engine, name: str) -> str:
    file, first, last = PACK.engine_references[name]
    lines = source_lines(engine, file, first, last)
    head, tail = ANCHORS[name]
    assert lines[0].strip().startswith(head) and lines[-1].strip().endswith(tail), (
        f"{file}:{first}-{last} no longer holds the {name} lines: {lines[0]!r} .. {lines[-1]!r}"
    )
    return f'#line {first} "{file}"\n' + "\n".join(lines)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    for tool in ("g++",):
        if shutil.which(tool) is None:
            pytest.fail("g++ is not installed; the engine tier needs it (.ci/run installs it)")
    root = cache_root() / SDIST_SHA256[:16]
    engine = unpack(fetch_sdist(root), root / "src")
    assert PRESET in (engine / "diffusion/src/model/diffusion/model.hpp").read_text()
    folder = tmp_path_factory.mktemp("qi21refs")
    src = folder / "refs.cpp"
    src.write_text(PROGRAM % {k: _cut(engine, k) for k in ANCHORS})
    e = root / "src" / ENGINE
    inc = [e / "diffusion/src", e / "diffusion/src/core", e / "diffusion/include",
           e / "diffusion/thirdparty", e / "diffusion", e / "gk/compat/include"]
    exe = folder / "refs"
    res = subprocess.run(["g++", "-std=c++17", "-O1", *[f"-I{p}" for p in inc], str(src), "-o",
                          str(exe)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    return exe


def test_reference_sizes_and_pixels_are_the_engines(program, tmp_path):
    rng = np.random.default_rng(7)
    lines, cases = [], []
    renders = ((1024, 1024), (512, 768), (192, 192))
    for k, (h, w) in enumerate(image_sizes()):
        W, H = renders[k % len(renders)]
        if h * w > 1_500_000:
            continue
        channels = 4 if k % 2 else 3
        px = rng.integers(0, 256, (h, w, channels), dtype=np.uint8)
        if channels == 4:
            px[..., 3] = rng.choice([0, 128, 255], (h, w))
        path = tmp_path / f"{k}.png"
        Image.fromarray(px, "RGBA" if channels == 4 else "RGB").save(path)
        (tmp_path / f"{k}.u8").write_bytes(px.tobytes())
        lines.append(f"{W} {H} {w} {h} {channels} {tmp_path / f'{k}.u8'} {tmp_path / f'{k}.f32'}")
        cases.append((k, h, w, W * H, path))
    res = subprocess.run([str(program)], input="\n".join(lines) + "\n", capture_output=True,
                         text=True, check=False, timeout=1200)
    assert res.returncode == 0, res.stderr[-2000:]
    engine_sizes = [tuple(map(int, s.split())) for s in res.stdout.splitlines()]
    assert len(engine_sizes) == len(cases) >= 90
    bad, worst = [], 0.0
    for (k, h, w, area, path), size in zip(cases, engine_sizes):
        if ref_size(h, w, area) != size:
            bad.append((h, w, area, size, ref_size(h, w, area)))
            continue
        want = np.fromfile(tmp_path / f"{k}.f32", dtype="<f4").reshape(3, *size)
        worst = max(worst, float(np.abs(ref_pixels(path, size) - want).max()))
    print(f"qwen_image_2_1: {len(cases)} references at 3 renders, sizes identical for "
          f"{len(cases) - len(bad)}, pixels max |d| {worst:.2e}")
    assert not bad, f"{len(bad)} sizes differ (h, w, area, engine, ours): {bad[:5]}"
    assert worst <= 1e-6
