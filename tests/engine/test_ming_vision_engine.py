"""Engine tier, Ming-Image vision companion: `pig_ming_vision-f16.gguf` written by
teachers/ming_vision_export.py from a released-layout snapshot (tiny/ming.py: the tiny tower on
what the engine hard-codes: 16 heads, 112 px windows, full attention at block 7) and read as
ggk 0.9.7 reads `--llm_vision` for Ming-Image: ModelLoader under "text_encoders.llm.",
MingImageVisionRunner::detect (must say LING: vision.* + linear_proj.*), load_tensors,
encode_image (ming_image/ming_vision_probe.cpp).

Asserted against the project's tower (teachers/ming_vision.py: transformers' Qwen2.5-VL tower +
linear_proj + L2) on the same CLIP-normalised pixels, a square image (4 whole windows) and a
12 x 20-patch one (windows padded): rows in the same raster order, within 2e-3 relative of the
tower with its weights rounded to f16 as the file stores them (measured 7.9e-4 / 6.4e-4: the gk
CPU backend multiplies f16 weights by f16-rounded activations), each row's cosine >= 0.99999.

    python -m pytest -q tests/engine/test_ming_vision_engine.py   # builds ming_vision_probe once
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import torch
from ming_engine import build_probe

pytestmark = pytest.mark.slow

RTOL = 2e-3


@pytest.fixture(scope="module")
def binary():
    return build_probe(target="ming_vision_probe")


@pytest.fixture(scope="module")
def companion(tmp_path_factory):
    from gguf_trainer.teachers.ming_vision import load_ming_vision
    from gguf_trainer.teachers.ming_vision_export import vision_file_for, write_ming_vision_gguf
    from gguf_trainer.tiny.ming import write_released_snapshot

    folder = tmp_path_factory.mktemp("ming_vision")
    root = write_released_snapshot(folder / "Ming-Image-0.1-Design")
    dest = vision_file_for(folder / "pig_ming_adapter-f16.gguf")
    assert dest.name == "pig_ming_vision-f16.gguf"
    write_ming_vision_gguf(root, dest)
    tower = load_ming_vision(root)
    with torch.no_grad():  # as the file stores them: >= 2-D f16, 1-D f32
        for p in tower.parameters():
            if p.ndim >= 2:
                p.copy_(p.half().float())
    return dest, tower


@pytest.mark.parametrize("size", [(224, 224), (168, 280)], ids=["224x224", "168x280"])
def test_the_engine_reads_the_companion_as_the_towers_rows(binary, companion, tmp_path, size):
    path, tower = companion
    hidden = tower.linear_proj[2].out_features
    h, w = size
    image = torch.randn(3, h, w, generator=torch.Generator().manual_seed(h + w))
    image.numpy().astype("<f4").tofile(tmp_path / "img.bin")
    res = subprocess.run([str(binary), str(path), str(hidden), str(tmp_path / "img.bin"), str(w),
                          str(h), str(tmp_path / "out.bin")], capture_output=True, text=True,
                         check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    line = next(x for x in res.stdout.splitlines() if x.startswith("source "))
    n = (h // 28) * (w // 28)
    assert line == f"source ling layers 8 hidden 128 out 96 tokens {n}", line
    got = np.fromfile(tmp_path / "out.bin", dtype="<f4").reshape(n, hidden)
    want = tower.encode(image).double().numpy()
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    cos = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    print(f"pig_ming_vision {h}x{w}: engine vs tower rel {rel:.2e}, min row cos {cos.min():.7f}")
    assert rel <= RTOL and cos.min() >= 0.99999, (rel, cos.min())
