"""The engine tier's check of export.dtype q8_0 (and bf16): the file this tool exports, loaded by
ggk 0.9.7's own ModelLoader and run by the runner ggk picks (adapter_probe.cpp), equals this
tool's dequantized reading of the same file (load_gguf, the gguf library's dequantizer) once
each Q8_0 Linear's input is rounded to Q8_0 blocks as ggml's Q8_0 dot product rounds it: the
engine kept the Q8_0 weights (ggml_extend.hpp 3695-3698: a Linear keeps its file's type when its
input width is a block multiple), computed in them, and the Linear of another width (in 48,
f16 in the file) ran as f16.
"""

from __future__ import annotations

import subprocess

import gguf
import numpy as np
import pytest
from engine_build import build

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

Q8 = gguf.GGMLQuantizationType.Q8_0
IN_DIM, WIDTH, OUT_DIM, ROWS = 48, 64, 128, 9  # in_proj and skip read 48: not a Q8_0 block


@pytest.fixture(scope="module")
def probe():
    return build(log=print).parent / "adapter_probe"


def q8_rounded(x):
    """x as ggml's Q8_0 dot product sees it: quantized to Q8_0 blocks along the input width."""
    import torch

    a = x.detach().float().contiguous().numpy()
    rounded = gguf.quants.dequantize(gguf.quants.quantize(a, Q8), Q8)
    return torch.from_numpy(rounded.reshape(a.shape))


def engine_rows(probe, path, hidden, tmp_path) -> tuple[np.ndarray, str]:
    hidden.numpy().astype("<f4").tofile(tmp_path / "h.bin")
    out = tmp_path / "out.bin"
    res = subprocess.run([str(probe), str(path), str(out), "--hidden", str(tmp_path / "h.bin"),
                          str(ROWS)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout[-1000:] + res.stderr[-2000:]
    return np.fromfile(out, dtype="<f4"), res.stdout.splitlines()[0]


@pytest.mark.parametrize("kind,taps", [("token_aligned", ()), ("layerwise", (2, 4))])
def test_the_engine_runs_a_q8_0_export_as_its_dequantized_reading(probe, tmp_path, kind, taps):
    import torch

    from gguf_trainer.model.adapter_file import read_adapter
    from gguf_trainer.model.adapters import AdapterConfig, build_adapter, load_gguf
    from gguf_trainer.model.export import write_adapter_gguf

    cfg = AdapterConfig(kind=kind, in_dim=IN_DIM, out_dim=OUT_DIM, width=WIDTH, depth=2, taps=taps)
    torch.manual_seed(0)
    module = build_adapter(cfg)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = tmp_path / "adapter-q8_0.gguf"
    write_adapter_gguf(path, module.state_dict(), cfg, metadata={}, dtype="q8_0")
    types = {n.removeprefix("adapter."): ty for n, (_, ty) in read_adapter(path).tensors.items()}
    assert types["in_proj.weight"] == types["skip.weight"] == "f16"  # input width 48
    q8 = sorted(n.removesuffix(".weight") for n, ty in types.items() if ty == "q8_0")
    assert len(q8) == 1 + 6 * cfg.depth  # out_proj and each block's q, k, v, o, mlp.0, mlp.2

    hidden = torch.randn(ROWS, IN_DIM, generator=torch.Generator().manual_seed(1))
    got, detected = engine_rows(probe, path, hidden, tmp_path)
    assert f"out_dim {OUT_DIM} width {WIDTH} depth 2" in detected

    ours = load_gguf(path)  # f32 from the file's blocks, as the engine converts
    with torch.no_grad():
        plain = ours(hidden[None])[0].numpy()
    modules = dict(ours.named_modules())
    for name in q8:
        modules[name].register_forward_pre_hook(lambda m, args: (q8_rounded(args[0]), *args[1:]))
    with torch.no_grad():
        want = ours(hidden[None])[0].numpy()
    scale = float(np.abs(want).max())
    worst = float(np.abs(got.reshape(want.shape) - want).max()) / scale
    plain_gap = float(np.abs(got.reshape(want.shape) - plain).max()) / scale
    print(f"{kind} q8_0: engine vs dequantized reading {worst:.2e} (without the activation "
          f"rounding {plain_gap:.2e})")
    assert worst <= 1e-5
    assert plain_gap > 10 * worst  # the engine computed in Q8_0: not a widened f32 copy


def test_the_engine_runs_a_bf16_export_as_its_reading(probe, tmp_path):
    import torch

    from gguf_trainer.model.adapters import AdapterConfig, build_adapter, load_gguf
    from gguf_trainer.model.export import write_adapter_gguf

    cfg = AdapterConfig(kind="token_aligned", in_dim=IN_DIM, out_dim=OUT_DIM, width=WIDTH,
                        depth=1)
    torch.manual_seed(0)
    module = build_adapter(cfg)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = tmp_path / "adapter-bf16.gguf"
    write_adapter_gguf(path, module.state_dict(), cfg, metadata={}, dtype="bf16")
    hidden = torch.randn(ROWS, IN_DIM, generator=torch.Generator().manual_seed(1))
    got, _ = engine_rows(probe, path, hidden, tmp_path)
    with torch.no_grad():
        want = load_gguf(path)(hidden[None])[0].numpy()
    assert np.abs(got.reshape(want.shape) - want).max() <= 1e-5 * np.abs(want).max()
