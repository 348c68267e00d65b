"""Export: the GGUF the engine reads computes what the torch module computes.

The expected numbers come from tests/engine_reference.py, a NumPy forward written from the
engine contract and reading the file with its own reader, not from gguf_trainer.
"""

from __future__ import annotations

import copy

import gguf
import numpy as np
import pytest
import torch
from adapter_cases import CFGS, DEPTH, FACTORIZED, IN, OUT, QUERIES, RANK, VIS, VOCAB, WIDTH
from engine_reference import engine_forward, read_engine_tensors, vision_project

from gguf_trainer.base.errors import UserError
from gguf_trainer.model.adapter_file import read_adapter
from gguf_trainer.model.adapters import (
    TOKEN_ALIGNED_KINDS,
    AdapterConfig,
    build_adapter,
    load_gguf,
    set_vision_proj,
)
from gguf_trainer.model.export import factorize_seed, fold_standardization, write_adapter_gguf

LEN = 7
SEED = 1234
RTOL = 1e-5


def kept_f32(name: str, ndim: int) -> bool:
    """The contract's f32 list (§1.2, §6.3), written here independently of export.py."""
    return ndim == 1 or name in ("query", "vision_proj.weight", "layer_map") or ".ln_" in "." + name


def randomized(cfg: AdapterConfig, seed: int = SEED) -> torch.nn.Module:
    """A module whose every weight matters (the zero-init out_proj would hide the blocks)."""
    torch.manual_seed(seed)
    m = build_adapter(cfg)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if p.ndim == 1:
                p.copy_(1 + 0.2 * r if name.endswith("weight") else 0.2 * r)
            elif name in ("query", "t5_embed.weight", "t5_embed_a.weight"):
                p.copy_(r)
            else:
                p.copy_(r / p.shape[1] ** 0.5)
    if cfg.kind == "token_aligned_vision":
        set_vision_proj(m, torch.randn(IN, VIS, generator=g) / VIS**0.5)
    return m.eval()


def rounded(m: torch.nn.Module) -> torch.nn.Module:
    """The module as the engine holds it: f16 weights rounded, the f32 ones kept."""
    r = copy.deepcopy(m)
    with torch.no_grad():
        for name, p in r.named_parameters():
            if not kept_f32(name, p.ndim):
                p.copy_(p.half().float())
    return r


def inputs(cfg: AdapterConfig, length: int = LEN, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(1, length, IN, generator=g)
    kw = {}
    if cfg.kind == "seeded_resampler":
        kw["seed_ids"] = torch.randint(0, VOCAB, (1, QUERIES), generator=g)
    if cfg.kind == "token_aligned_vision":
        vis = torch.randn(1, length, VIS, generator=g)
        vis[:, : length // 2] = 0  # image rows only in the second half
        kw["vis"] = vis
    return hidden, kw


def reference(path, hidden, kw) -> np.ndarray:
    seed_ids = kw["seed_ids"][0].numpy() if "seed_ids" in kw else None
    vis = kw["vis"][0].numpy() if "vis" in kw else None
    return engine_forward(path, hidden[0].numpy(), seed_ids=seed_ids, vis=vis)


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("kind", list(CFGS))
def test_engine_forward_matches_module(kind, tmp_path):
    cfg = CFGS[kind]
    m = randomized(cfg)
    path = tmp_path / f"{kind}-f16.gguf"
    info = write_adapter_gguf(path, m.state_dict(), cfg, metadata={"adapter.pack": "test"})
    assert info["n_tensors"] == len(m.state_dict()) == info["n_f16"] + info["n_f32"]
    hidden, kw = inputs(cfg)
    ref = reference(path, hidden, kw)
    with torch.no_grad():
        torch_out = rounded(m)(hidden, **kw)[0].numpy()
        loaded_out = load_gguf(path)(hidden, **kw)[0].numpy()
    err, err_loaded = rel_err(torch_out, ref), rel_err(loaded_out, ref)
    print(f"{kind}: engine vs f16-rounded torch rel err {err:.2e}; load_gguf {err_loaded:.2e}")
    assert ref.shape == ((LEN if kind in TOKEN_ALIGNED_KINDS else QUERIES), OUT)
    assert err < RTOL and err_loaded < RTOL
    # and the f16 rounding is real: the unrounded module differs by far more than the tolerance
    with torch.no_grad():
        assert rel_err(m(hidden, **kw)[0].numpy(), ref) > 10 * err


def test_vision_proj_is_exported_exactly(tmp_path):
    cfg = CFGS["token_aligned_vision"]
    m = randomized(cfg)
    path = tmp_path / "v.gguf"
    write_adapter_gguf(path, m.state_dict(), cfg, metadata={})
    e_raw = np.random.default_rng(0).normal(size=(5, VIS))
    want = e_raw @ m.vision_proj.weight.detach().double().numpy().T
    np.testing.assert_allclose(vision_project(path, e_raw), want, rtol=1e-12, atol=0)


def test_fold_emits_teacher_scale_rows(tmp_path):
    cfg = CFGS["resampler"]
    m = randomized(cfg)
    rng = np.random.default_rng(3)
    mu = rng.normal(0, 2, OUT)
    sigma = rng.uniform(0.5, 3.0, OUT)
    sigma[5] = 1e-6  # a near-constant target dimension
    floor = 1e-2
    sigma_f = np.maximum(sigma, floor)
    assert sigma_f[5] == floor
    hidden, kw = inputs(cfg)
    with torch.no_grad():
        std_out = m(hidden)[0].double().numpy()  # the model predicts (t - mu) / sigma_f
        folded = build_adapter(cfg)
        folded.load_state_dict(fold_standardization(m.state_dict(), mu, sigma_f))
        folded_out = folded(hidden)[0].double().numpy()
    teacher_scale = sigma_f * std_out + mu
    assert rel_err(folded_out, teacher_scale) < 1e-6  # the fold itself is exact math
    path = tmp_path / "folded.gguf"
    write_adapter_gguf(path, m.state_dict(), cfg, metadata={}, mu=mu, sigma_f=sigma_f)
    ref = reference(path, hidden, kw)
    with torch.no_grad():
        err = rel_err(rounded(folded)(hidden)[0].numpy(), ref)
    coarse = rel_err(ref, teacher_scale)
    print(
        f"fold: engine vs folded f16-rounded torch rel err {err:.2e}; vs sigma_f*out+mu "
        f"{coarse:.2e}"
    )
    assert err < RTOL
    assert coarse < 5e-3  # only the f16 rounding of the folded weights separates them
    np.testing.assert_allclose(
        ref[:, 5], floor * std_out[:, 5] + mu[5], rtol=0, atol=1e-3 * abs(mu[5]) + 1e-6
    )


def test_fold_rejects_bad_sigma():
    sd = build_adapter(CFGS["resampler"]).state_dict()
    with pytest.raises(ValueError):
        fold_standardization(sd, np.zeros(OUT), np.zeros(OUT))
    with pytest.raises(ValueError):
        fold_standardization(sd, np.zeros(OUT - 1), np.ones(OUT - 1))


def test_dtypes_and_kv(tmp_path):
    cfg = CFGS["seeded_resampler"]
    m = randomized(cfg)
    path = tmp_path / "run-f16.gguf"
    meta = {
        "adapter.trained_steps": 12,
        "adapter.offset": -3,
        "adapter.snapshot": False,
        "adapter.val_cos": 0.875,
        "adapter.best_val_cos": float("nan"),
        "adapter.pack": "t5xxl_pixart",
        "adapter.big": 2**40,
    }
    info = write_adapter_gguf(path, m.state_dict(), cfg, metadata=meta)
    reader = gguf.GGUFReader(path)
    types = {t.name: t.tensor_type for t in reader.tensors}
    for name, p in m.state_dict().items():
        want = (
            gguf.GGMLQuantizationType.F32
            if kept_f32(name, p.ndim)
            else gguf.GGMLQuantizationType.F16
        )
        assert types["adapter." + name] == want, name
    assert types["adapter.t5_embed.weight"] == gguf.GGMLQuantizationType.F16
    assert info["n_f32"] == sum(t == gguf.GGMLQuantizationType.F32 for t in types.values())
    assert info["bytes"] == path.stat().st_size
    V = gguf.GGUFValueType
    want_kv = {
        "general.name": ("run-f16", V.STRING),
        "adapter.in_dim": (IN, V.UINT32),
        "adapter.out_dim": (OUT, V.UINT32),
        "adapter.width": (WIDTH, V.UINT32),
        "adapter.depth": (DEPTH, V.UINT32),
        "adapter.heads": (2, V.UINT32),
        "adapter.num_queries": (QUERIES, V.UINT32),
        "adapter.t5_vocab": (VOCAB, V.UINT32),
        "adapter.trained_steps": (12, V.UINT32),
        "adapter.offset": (-3, V.INT32),
        "adapter.snapshot": (False, V.BOOL),
        "adapter.pack": ("t5xxl_pixart", V.STRING),
        "adapter.big": (2**40, V.UINT64),
    }
    for key, (value, vtype) in want_kv.items():
        field = reader.fields[key]
        assert field.types == [vtype] and field.contents() == value, key
    assert reader.fields["adapter.val_cos"].types == [V.FLOAT32]
    assert "adapter.best_val_cos" not in reader.fields  # non-finite floats are skipped
    assert "adapter.vis_dim" not in reader.fields
    # tensors are stored untransposed: torch (out, in) shows up as ne = [in, out]
    assert read_adapter(path).tensors["adapter.in_proj.weight"] == ((IN, WIDTH), "f16")
    assert read_engine_tensors(path)["query"].shape == (QUERIES, WIDTH)


def test_name_overrides_stem(tmp_path):
    cfg = CFGS["token_aligned_vision"]
    path = tmp_path / "x.gguf"
    write_adapter_gguf(path, build_adapter(cfg).state_dict(), cfg, metadata={}, name="pig_mageflow")
    r = gguf.GGUFReader(path)
    assert r.fields["general.name"].contents() == "pig_mageflow"
    assert r.fields["adapter.vis_dim"].contents() == VIS and "adapter.num_queries" not in r.fields


def test_failed_verification_leaves_nothing(tmp_path):
    cfg = CFGS["resampler"]
    sd = build_adapter(cfg).state_dict()
    path = tmp_path / "bad.gguf"
    wrong = AdapterConfig("resampler", IN, OUT, WIDTH, DEPTH + 1, num_queries=QUERIES)
    with pytest.raises(RuntimeError):
        write_adapter_gguf(path, sd, wrong, metadata={})
    with pytest.raises(RuntimeError, match="ignores"):
        write_adapter_gguf(path, {**sd, "stray.weight": torch.zeros(2, 2)}, cfg, metadata={})
    del sd["blocks.1.mlp.2.bias"]
    with pytest.raises(RuntimeError, match="missing"):
        write_adapter_gguf(path, sd, cfg, metadata={})
    assert list(tmp_path.iterdir()) == []


def test_rejects_nonfinite_and_clashing_keys(tmp_path):
    cfg = CFGS["resampler"]
    sd = build_adapter(cfg).state_dict()
    with pytest.raises(ValueError, match="structural"):
        write_adapter_gguf(tmp_path / "a.gguf", sd, cfg, metadata={"adapter.width": 64})
    sd["blocks.0.mlp.0.weight"][0, 0] = 1e6  # overflows f16
    with pytest.raises(UserError, match="blocks.0.mlp.0.weight"):
        write_adapter_gguf(tmp_path / "a.gguf", sd, cfg, metadata={})
    assert list(tmp_path.iterdir()) == []


def test_text_only_token_aligned_file_has_no_vision_tensors(tmp_path):
    """A text-only family's file: skip but no vision_proj/vis_in; the reference refuses images."""
    cfg = CFGS["token_aligned"]
    path = tmp_path / "t.gguf"
    write_adapter_gguf(path, randomized(cfg).state_dict(), cfg, metadata={})
    names = set(read_engine_tensors(path))
    assert "skip.weight" in names and not names & {"vision_proj.weight", "vis_in.weight"}
    assert "adapter.vis_dim" not in gguf.GGUFReader(path).fields
    hidden, _ = inputs(cfg)
    with pytest.raises(ValueError, match="vision"):
        engine_forward(path, hidden[0].numpy(), vis=np.zeros((LEN, VIS)))


def test_factorized_export_matches_engine_and_the_svd(tmp_path):
    """A full-table checkpoint exported at rank r: the engine's forward of the factorized file
    equals load_gguf's (the file is what the module computes), the seed rows are the best
    rank-r approximation (error = the discarded singular values), and the gap to the
    full-table export is of the order of that error."""
    cfg = CFGS["seeded_resampler"]
    m = randomized(cfg)
    state, fcfg, err = factorize_seed(m.state_dict(), cfg, RANK)
    assert fcfg == FACTORIZED and "t5_embed.weight" not in state
    table = m.t5_embed.weight.detach().double()
    s = torch.linalg.svdvals(table)
    assert err == pytest.approx(float(s[RANK:].norm() / s.norm()), rel=1e-6)
    approx = state["t5_embed_a.weight"].double() @ state["t5_embed_b.weight"].double().T
    assert float((table - approx).norm() / table.norm()) == pytest.approx(err, rel=1e-6)
    full_path, fz_path = tmp_path / "full.gguf", tmp_path / "fz.gguf"
    write_adapter_gguf(full_path, m.state_dict(), cfg, metadata={})
    info = write_adapter_gguf(fz_path, state, fcfg, metadata={"adapter.seed_svd_rel_error": err})
    v = read_adapter(fz_path)
    assert v.kind == "seeded_resampler_factorized" and v.embed_rank == RANK and v.problems == []
    assert info["bytes"] < full_path.stat().st_size
    hidden, kw = inputs(cfg)
    ref = reference(fz_path, hidden, kw)
    loaded = load_gguf(fz_path)
    assert loaded.config == FACTORIZED
    with torch.no_grad():
        got = loaded(hidden, **kw)[0].numpy()
    assert rel_err(got, ref) < RTOL
    gap = rel_err(ref, reference(full_path, hidden, kw))
    print(
        f"factorized rank {RANK}: engine vs load_gguf {rel_err(got, ref):.2e}; "
        f"gap to full export {gap:.3e}; SVD error {err:.3e}"
    )
    assert 0 < gap


def test_a_seed_rank_over_the_tables_rank_is_one_sentence():
    cfg = CFGS["seeded_resampler"]
    with pytest.raises(UserError, match=f"set it between 1 and {VOCAB}, or 0"):
        factorize_seed(randomized(cfg).state_dict(), cfg, VOCAB + 1)  # VOCAB < WIDTH here
    with pytest.raises(ValueError, match="full-table"):
        factorize_seed(randomized(FACTORIZED).state_dict(), FACTORIZED, RANK)
