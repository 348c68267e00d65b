"""The layerwise adapter kind (engine-families §4): the token-aligned trunk whose out_proj and
skip emit n teacher taps per token, plus `adapter.layer_map` f32 [n]. Checked against the
engine-faithful NumPy reading in tests/engine_reference.py (its own reader, detection and the
conditioner's stack check), not against the training module alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_reference import (
    conditioner_stack,
    detect,
    engine_forward,
    read_engine_tensors,
    tap_slices,
)

from gguf_trainer.base.errors import UserError
from gguf_trainer.model.adapter_file import (
    LAYERWISE_FAMILIES,
    families_for,
    read_adapter,
    trainer_kind,
)
from gguf_trainer.model.adapter_report import format_report, report_dict
from gguf_trainer.model.adapters import AdapterConfig, build_adapter, load_gguf
from gguf_trainer.model.export import write_adapter_gguf

IN, WIDTH, DEPTH, D = 32, 128, 2, 24
TAPS = (9, 18, 27)
CFG = AdapterConfig("layerwise", IN, len(TAPS) * D, WIDTH, DEPTH, taps=TAPS)


def _randomized(cfg: AdapterConfig, seed: int = 3) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = build_adapter(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(
                torch.randn_like(p) * (0.3 if p.ndim > 1 else 0.1)
                + (1.0 if "ln_" in name and name.endswith("weight") else 0.0)
            )
    return m.eval()


def _export(tmp_path, cfg=CFG, seed=3):
    m = _randomized(cfg, seed)
    path = tmp_path / "pig_layerwise_adapter-f16.gguf"
    write_adapter_gguf(path, m.state_dict(), cfg, metadata={"adapter.pack": "test"})
    return m, path


def test_config_rules():
    assert CFG.validate() == []
    assert CFG.tap_dim == D
    for bad in ((9,), (18, 9, 27), (9, 9, 27), (0, 9, 18)):
        assert AdapterConfig("layerwise", IN, len(bad) * D, WIDTH, DEPTH, taps=bad).validate()
    assert AdapterConfig("layerwise", IN, 3 * D + 1, WIDTH, DEPTH, taps=TAPS).validate()
    assert AdapterConfig("token_aligned", IN, D, WIDTH, DEPTH, taps=TAPS).validate()
    # a JSON round trip (checkpoints) gives a list back
    assert AdapterConfig.from_dict({**CFG.to_dict(), "taps": list(TAPS)}) == CFG


def test_file_names_shapes_and_dtypes_are_the_engines(tmp_path):
    _, path = _export(tmp_path)
    view = read_adapter(path)
    assert view.problems == [] and view.notes == []
    t = view.tensors
    # ne order: a torch Linear (out, in) is ne [in, out]; layer_map f32 [n]
    assert t["adapter.layer_map"] == ((3,), "f32")
    assert t["adapter.out_proj.weight"] == ((WIDTH, 3 * D), "f16")
    assert t["adapter.out_proj.bias"] == ((3 * D,), "f32")
    assert t["adapter.skip.weight"] == ((IN, 3 * D), "f16")
    assert t["adapter.skip.bias"] == ((3 * D,), "f32")
    assert not any("vision_proj" in n or "vis_in" in n or "query" in n for n in t)
    assert view.kind == "token_aligned" and view.has_layer_map and view.n_out_layers == 3
    assert view.taps == TAPS and trainer_kind(view) == "layerwise"
    assert view.metadata["adapter.n_layers"] == 3
    # the independent engine reading detects the same stack
    tensors = read_engine_tensors(path)
    assert detect(tensors)["n_out_layers"] == 3
    assert list(tensors["layer_map"]) == [9.0, 18.0, 27.0]


def test_engine_forward_matches_module_and_load_gguf(tmp_path):
    m, path = _export(tmp_path)
    hidden = torch.randn(1, 11, IN, generator=torch.Generator().manual_seed(0))
    ref = conditioner_stack(path, hidden[0].numpy(), out_layers={9, 18, 27})
    loaded = load_gguf(path)
    assert loaded.config == CFG
    assert torch.equal(loaded.layer_map, torch.tensor([9.0, 18.0, 27.0]))
    with torch.no_grad():
        got = loaded(hidden)[0].double().numpy()
        trained = m(hidden)[0].double().numpy()
    assert ref.shape == (11, 3 * D)
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel <= 1e-5, rel
    # the trained module differs from the file by f16 rounding only
    assert np.linalg.norm(trained - ref) / np.linalg.norm(ref) < 5e-3
    # the taps, in ascending order, are the D-wide column blocks of every row
    for k, (a, b) in enumerate(zip(tap_slices(got, 3), tap_slices(ref, 3))):
        assert a.shape == (11, D)
        assert np.array_equal(b, ref[:, k * D : (k + 1) * D])
        assert np.allclose(a, b, rtol=1e-4, atol=1e-4)


def test_the_adapter_sees_no_mask(tmp_path):
    """The engine runs the adapter over the whole template, pads included (conditioner.hpp
    2727-2735 pass no mask): a row's output depends on the pad rows after it."""
    _, path = _export(tmp_path)
    hidden = torch.randn(9, IN, generator=torch.Generator().manual_seed(1)).numpy()
    whole = engine_forward(path, hidden)
    cut = engine_forward(path, hidden[:6])
    assert not np.allclose(whole[:6], cut, atol=1e-4)
    with torch.no_grad():
        got = load_gguf(path)(torch.from_numpy(hidden).float()[None])[0].double().numpy()
    assert np.linalg.norm(got - whole) / np.linalg.norm(whole) <= 1e-5


def test_the_engine_refuses_another_stack_count(tmp_path):
    _, path = _export(tmp_path)
    hidden = np.zeros((4, IN))
    with pytest.raises(RuntimeError, match="layer stack"):
        conditioner_stack(path, hidden, out_layers={4, 8, 12, 16, 20, 24, 28, 32})
    assert families_for(3) == ["Flux.2 klein", "SeFi-Image"]
    assert families_for(12) == ["Krea2", "Iris-3B"]
    assert families_for(5) == []
    assert sorted({len(t) for t in LAYERWISE_FAMILIES.values()}) == [3, 8, 12, 13, 15]


def test_inspect_names_the_taps_and_the_families(tmp_path):
    _, path = _export(tmp_path)
    view = read_adapter(path)
    text = format_report(view)
    assert "taps           : 3 (9, 18, 27), 24 features each" in text
    assert "accepted by    : Flux.2 klein, SeFi-Image" in text
    rep = report_dict(view)
    assert rep["taps"] == [9, 18, 27] and rep["families"] == ["Flux.2 klein", "SeFi-Image"]
    assert rep["trainer_kind"] == "layerwise"


def test_a_vision_layerwise_file_is_rebuilt_with_its_vision_tensors(tmp_path):
    """Fibo 2.0 edits: layer_map + vision_proj + vis_in is a layerwise adapter with vis_dim (the
    engine's AdapterRunner takes both extensions at once, llm_adapter.hpp 86-162); a file with
    only one of the two vision tensors still is no file gguf-trainer rebuilds."""
    import gguf

    _, path = _export(tmp_path)
    arrays = {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}
    arrays["adapter.vision_proj.weight"] = np.zeros((IN, 16), np.float32)
    arrays["adapter.vis_in.weight"] = np.full((WIDTH, 16), 0.5, np.float16)

    def write(name, keep):
        out = tmp_path / name
        w = gguf.GGUFWriter(out, "pig")
        for k, a in arrays.items():
            if keep(k):
                w.add_tensor(k, a)
        w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
        return out

    both = write("vision.gguf", lambda k: True)
    view = read_adapter(both)
    assert view.refusals == [] and trainer_kind(view) == "layerwise" and view.vis_dim == 16
    assert "vision         : vision_proj + vis_in (vis_dim 16)" in format_report(view)
    module = load_gguf(both)
    assert module.config.kind == "layerwise" and module.config.vis_dim == 16
    assert torch.equal(module.vis_in.weight, torch.full((WIDTH, 16), 0.5))
    half = write("half.gguf", lambda k: k != "adapter.vision_proj.weight")
    assert trainer_kind(read_adapter(half)) is None
    with pytest.raises(UserError):
        load_gguf(half)


def test_per_tap_figures_are_each_taps_block_of_the_dit_rows():
    """score_taps: a prediction exact on tap 0, the mean on tap 1 and the negated target on
    tap 2 reads cos 1 / the baseline / -1, over rows >= sup_start only."""
    from gguf_trainer.data.scoring import score_taps
    from gguf_trainer.data.shards import Batch, Stats

    g = torch.Generator().manual_seed(0)
    target = torch.randn(2, 5, 3 * D, generator=g)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[1, 4] = False
    sup = torch.tensor([2, 0])
    batch = Batch(
        torch.zeros(2, 5, IN), mask, target, mask, None, sup, [(0, 0), (0, 1)], None, None
    )
    mu = torch.randn(3 * D, generator=g)
    stats = Stats(mu, torch.ones(3 * D), torch.ones(3 * D), 0)

    def predict(b):
        t0, _, t2 = b.target.chunk(3, -1)
        return torch.cat([t0, mu[D : 2 * D].expand_as(t0), -t2], -1)

    res = score_taps([batch], predict, stats, TAPS, "cpu")
    assert res["taps"] == list(TAPS)
    assert res["cos"][0] == pytest.approx(1.0) and res["cos"][2] == pytest.approx(-1.0)
    assert res["cos"][1] == pytest.approx(res["baseline_cos"][1])
    rows = torch.cat([target[0, 2:], target[1, :4]])[:, D : 2 * D].double()
    want = torch.nn.functional.cosine_similarity(rows, mu[D : 2 * D].double()[None], dim=-1).mean()
    assert res["baseline_cos"][1] == pytest.approx(float(want))
