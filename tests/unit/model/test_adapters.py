"""Adapter modules: names and shapes per engine-contract §1.4, init, masking, config checks."""

from __future__ import annotations

import pytest
import torch
from adapter_cases import (
    CFGS,
    DEPTH,
    FACTORIZED,
    IN,
    OUT,
    QUERIES,
    RANK,
    VIS,
    VOCAB,
    WIDTH,
    randomize,
)

from gguf_trainer.base.errors import UserError
from gguf_trainer.model.adapter_file import expected_tensors
from gguf_trainer.model.adapters import (
    HEAD_DIM,
    AdapterConfig,
    build_adapter,
    load_gguf,
    set_vision_proj,
    start_output,
    trainable_parameters,
)
from gguf_trainer.model.adapters import (
    KINDS as ALL_KINDS,
)
from gguf_trainer.model.export import write_adapter_gguf
from gguf_trainer.model.slot_resampler import SLOT_KINDS

# slot kinds: test_slot_resampler.py; ming_image: test_ming_adapter.py
KINDS = tuple(k for k in ALL_KINDS if k not in (*SLOT_KINDS, "ming_image"))

SEED = 0
FILE_KIND = {
    "resampler": "resampler",
    "seeded_resampler": "seeded_resampler",
    "token_aligned": "token_aligned",
    "token_aligned_vision": "token_aligned",
    "layerwise": "token_aligned",
}
TOKEN = ("token_aligned", "token_aligned_vision", "layerwise")


def engine_inventory(cfg: AdapterConfig) -> dict:
    """§1.4 for this config, in torch shape order (ne reversed)."""
    ta, vision = cfg.kind in TOKEN, cfg.kind == "token_aligned_vision"
    ne = expected_tensors(
        "seeded_resampler_factorized" if cfg.seed_rank else FILE_KIND[cfg.kind],
        in_dim=cfg.in_dim,
        out_dim=cfg.out_dim,
        width=cfg.width,
        depth=cfg.depth,
        mlp_hidden=cfg.hidden_dim,
        num_queries=cfg.num_queries,
        t5_vocab=cfg.seed_vocab,
        embed_rank=cfg.seed_rank,
        vis_dim=cfg.vis_dim,
        has_skip=ta,
        has_vision_proj=vision,
        has_vis_in=vision,
        n_out_layers=len(cfg.taps),
        has_layer_map=bool(cfg.taps),
    )
    return {k: tuple(reversed(v)) for k, v in ne.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_is_the_engine_inventory(kind):
    m = build_adapter(CFGS[kind])
    got = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert got == engine_inventory(CFGS[kind])
    assert m.config == CFGS[kind]
    assert (
        isinstance(m.blocks[0].mlp[1], torch.nn.GELU) and m.blocks[0].mlp[1].approximate == "none"
    )
    assert m.blocks[0].ln_self.eps == 1e-5


@pytest.mark.parametrize(
    "kind,depth,count",
    [("seeded_resampler", 6, 176), ("resampler", 6, 175), ("token_aligned_vision", 4, 74),
     ("token_aligned", 4, 72)],
)
def test_reference_tensor_counts(kind, depth, count):
    """The shipped files' counts (contract §1.4, anchor §3.5); the count does not depend on
    width."""
    small = AdapterConfig(**{**CFGS[kind].to_dict(), "width": HEAD_DIM, "depth": depth})
    assert len(build_adapter(small).state_dict()) == count
    per_block = 16 if kind in TOKEN else 28
    top = {"seeded_resampler": 8, "resampler": 7, "token_aligned_vision": 10, "token_aligned": 8}[
        kind
    ]
    assert per_block * depth + top == count
    big = AdapterConfig(**{**small.to_dict(), "width": 1024, "in_dim": 1024})
    assert len(engine_inventory(big)) == count  # shapes only, no width-1024 model built


def test_init():
    torch.manual_seed(SEED)
    s = build_adapter(
        AdapterConfig("seeded_resampler", IN, OUT, 256, 1, num_queries=64, seed_vocab=500)
    )
    assert (
        abs(s.query.std().item() - 0.02) < 0.002
        and abs(s.t5_embed.weight.std().item() - 0.02) < 0.002
    )
    t = build_adapter(CFGS["token_aligned_vision"])
    assert not t.out_proj.weight.any() and not t.out_proj.bias.any()
    assert t.skip.bias is not None and t.vis_in.bias is None and t.vision_proj.bias is None
    assert not t.vision_proj.weight.requires_grad
    names = {id(p) for p in trainable_parameters(t)}
    assert id(t.vision_proj.weight) not in names
    assert len(names) == len(list(t.parameters())) - 1
    w = torch.randn(IN, VIS)
    set_vision_proj(t, w)
    assert torch.equal(t.vision_proj.weight, w) and not t.vision_proj.weight.requires_grad
    with pytest.raises(ValueError):
        set_vision_proj(t, torch.randn(VIS, IN))
    h = torch.randn(1, 5, IN)
    with torch.no_grad():  # zero out_proj: the adapter starts as its skip path
        assert torch.allclose(t(h), t.skip(h))


def test_deterministic_given_seed():
    for cfg in CFGS.values():
        torch.manual_seed(SEED)
        a = build_adapter(cfg).state_dict()
        torch.manual_seed(SEED)
        b = build_adapter(cfg).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kind", KINDS)
def test_padded_batch_equals_unpadded_runs(kind):
    cfg = CFGS[kind]
    torch.manual_seed(SEED)
    m = randomize(build_adapter(cfg)).eval()
    lengths = [5, 9, 1]
    g = torch.Generator().manual_seed(2)
    samples = [torch.randn(1, n, IN, generator=g) for n in lengths]
    vis = [torch.randn(1, n, VIS, generator=g) for n in lengths]
    seeds = torch.randint(0, VOCAB, (len(lengths), QUERIES), generator=g)
    L = max(lengths)
    hidden = torch.zeros(len(lengths), L, IN).normal_(generator=g)  # garbage in pads on purpose
    v = torch.zeros(len(lengths), L, VIS)
    mask = torch.zeros(len(lengths), L, dtype=torch.bool)
    for i, n in enumerate(lengths):
        hidden[i, :n], v[i, :n], mask[i, :n] = samples[i][0], vis[i][0], True
    kw = {"seed_ids": seeds} if kind == "seeded_resampler" else {}
    if kind == "token_aligned_vision":
        kw["vis"] = v
    token = kind in TOKEN
    with torch.no_grad():
        batch = m(hidden, mask, **kw)
        for i, n in enumerate(lengths):
            one_kw = {"seed_ids": seeds[i : i + 1]} if kind == "seeded_resampler" else {}
            if kind == "token_aligned_vision":
                one_kw["vis"] = vis[i]
            alone = m(samples[i], **one_kw)[0]
            got = batch[i, :n] if token else batch[i]
            torch.testing.assert_close(got, alone, rtol=1e-5, atol=1e-5)
    assert batch.shape == (len(lengths), L if token else QUERIES, OUT)
    assert torch.isfinite(batch).all()


def test_forward_argument_errors():
    h = torch.randn(1, 3, IN)
    with pytest.raises(ValueError):
        build_adapter(CFGS["seeded_resampler"])(h)
    with pytest.raises(ValueError):
        build_adapter(CFGS["resampler"])(h, seed_ids=torch.zeros(1, QUERIES, dtype=torch.long))
    with pytest.raises(ValueError):
        build_adapter(CFGS["token_aligned_vision"])(h, seed_ids=torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="text-only"):
        build_adapter(CFGS["token_aligned"])(h, vis=torch.zeros(1, 3, VIS))


def test_config_round_trip_and_validate():
    for cfg in CFGS.values():
        assert AdapterConfig.from_dict(cfg.to_dict()) == cfg and cfg.validate() == []
    with pytest.raises(ValueError):
        AdapterConfig.from_dict({**CFGS["resampler"].to_dict(), "bogus": 1})
    bad = AdapterConfig("resampler", IN, OUT, 96, DEPTH, num_queries=0, seed_vocab=5)
    problems = bad.validate()
    assert len(problems) == 3 and any("multiple of 64" in p for p in problems)
    assert AdapterConfig("token_aligned_vision", IN, OUT, WIDTH, DEPTH).validate()  # needs vis_dim
    # text-only
    assert AdapterConfig("token_aligned", IN, OUT, WIDTH, DEPTH, vis_dim=VIS).validate()
    assert FACTORIZED.validate() == []
    assert AdapterConfig("resampler", IN, OUT, WIDTH, DEPTH, num_queries=4, seed_rank=2).validate()
    too_big = {**FACTORIZED.to_dict(), "seed_rank": VOCAB + 1}
    assert any("exceeds" in p for p in AdapterConfig(**too_big).validate())
    assert AdapterConfig("seeded_resampler", IN, OUT, WIDTH, DEPTH, num_queries=4).validate()
    assert AdapterConfig("nope", IN, OUT, WIDTH, DEPTH).validate()
    with pytest.raises(UserError, match="multiple of 64"):
        build_adapter(bad)
    assert CFGS["resampler"].hidden_dim == 4 * WIDTH and CFGS["resampler"].heads == 2


@pytest.mark.parametrize("kind", KINDS)
def test_load_gguf_rebuilds_config_and_keeps_rng(kind, tmp_path):
    cfg = AdapterConfig(**{**CFGS[kind].to_dict(), "mlp_hidden": 3 * WIDTH})
    m = build_adapter(cfg)
    path = tmp_path / "a.gguf"
    write_adapter_gguf(path, m.state_dict(), cfg, metadata={"adapter.pack": "p"})
    torch.manual_seed(SEED)
    expected_next = torch.rand(1)
    torch.manual_seed(SEED)
    loaded = load_gguf(path)
    assert torch.equal(torch.rand(1), expected_next)  # loading does not consume the caller's RNG
    assert loaded.config == cfg
    assert loaded.metadata["adapter.pack"] == "p" and loaded.metadata["general.name"] == "a"
    for k, v in loaded.state_dict().items():
        assert v.dtype == torch.float32
        assert torch.equal(v, m.state_dict()[k].half().float()) or torch.equal(v, m.state_dict()[k])
    assert trainable_parameters(loaded)
    if kind == "token_aligned_vision":
        assert not loaded.vision_proj.weight.requires_grad
    if kind == "token_aligned":  # a text-only file: no vision tensors written, none rebuilt
        assert not any(k.startswith(("vision_proj", "vis_in")) for k in loaded.state_dict())


def _run(m, kind, hidden, g):
    kw = (
        {"vis": torch.randn(*hidden.shape[:2], VIS, generator=g)}
        if kind == "token_aligned_vision"
        else {}
    )
    if kind == "seeded_resampler":
        kw["seed_ids"] = torch.randint(0, VOCAB, (hidden.shape[0], QUERIES), generator=g)
    return m(hidden, **kw)


@pytest.mark.parametrize("kind", KINDS)
def test_start_output_predicts_the_mean_for_every_kind(kind):
    """Step 0 of every kind is exactly the per-dim mean baseline, whatever the inputs."""
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(SEED)
    m = build_adapter(CFGS[kind])
    mean = torch.randn(OUT, generator=g)
    start_output(m, mean)
    out = _run(m, kind, torch.randn(2, 5, IN, generator=g), g)
    assert torch.equal(out, mean.expand_as(out))
    params = dict(m.named_parameters())
    assert params["out_proj.weight"].requires_grad  # zero, but trained
    if kind not in TOKEN:
        with pytest.raises(ValueError, match="no skip path"):
            start_output(m, mean, skip=(torch.zeros(OUT, IN), torch.zeros(OUT)))


def test_start_output_with_a_linear_skip_is_that_map():
    g = torch.Generator().manual_seed(4)
    m = build_adapter(CFGS["token_aligned_vision"])
    w, b = torch.randn(OUT, IN, generator=g), torch.randn(OUT, generator=g)
    start_output(m, torch.zeros(OUT), skip=(w, b))
    h = torch.randn(2, 5, IN, generator=g)
    out = _run(m, "token_aligned_vision", h, g)
    assert torch.allclose(out, h @ w.T + b, atol=1e-5)


WIDE = {  # a second geometry: more rows and wider matmuls than the tiny CFGS
    "resampler": AdapterConfig("resampler", 64, 512, 256, 2, num_queries=64),
    "seeded_resampler": AdapterConfig(
        "seeded_resampler", 64, 512, 256, 2, num_queries=64, seed_vocab=VOCAB
    ),
    "token_aligned_vision": AdapterConfig("token_aligned_vision", 64, 512, 256, 2, vis_dim=VIS),
    "token_aligned": AdapterConfig("token_aligned", 64, 512, 256, 2),
    "layerwise": AdapterConfig("layerwise", 64, 512, 256, 2, taps=(4, 8, 12, 16, 20, 24, 28, 32)),
}


def _supervised_case(cfg, g, lengths):
    """A padded batch (garbage in the pads) and the rows its loss reads, per kind: every
    query (resampler), the real slots (seeded resampler, one sample with none), the real
    tokens (token-aligned, which the batch's row_mask equals)."""
    b, L = len(lengths), max(lengths)
    mask = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]
    hidden = torch.randn(b, L, cfg.in_dim, generator=g)
    kw = {}
    if cfg.kind == "token_aligned_vision":
        vis = torch.randn(b, L, cfg.vis_dim, generator=g)
        vis[:, 1::3] = 0  # text positions between image rows
        kw["vis"], rows = vis, mask
    elif cfg.kind in ("token_aligned", "layerwise"):
        rows = mask
    else:
        slots = torch.randint(1, cfg.num_queries + 1, (b,), generator=g)
        slots[-1] = 0
        rows = torch.arange(cfg.num_queries)[None, :] < slots[:, None]
        if cfg.kind == "seeded_resampler":
            kw["seed_ids"] = (
                torch.randint(0, cfg.seed_vocab, (b, cfg.num_queries), generator=g) * rows
            )
        else:
            rows = torch.ones_like(rows)
    return hidden, mask, kw, rows


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cfgs", [CFGS, WIDE], ids=["tiny", "wide"])
def test_rows_forward_is_the_full_forward_on_those_rows_exactly(kind, cfgs):
    """The training forward (`rows=`, the supervised rows only) is bit-identical in fp32 to
    the full forward on those rows, with padding and vision inputs, in train mode."""
    cfg = cfgs[kind]
    torch.manual_seed(SEED)
    m = randomize(build_adapter(cfg)).train()
    g = torch.Generator().manual_seed(4)
    hidden, mask, kw, rows = _supervised_case(cfg, g, [7, 40, 1, 23, 40, 12])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: MKL's kernel for a row does not depend on the row count
    try:
        full = m(hidden, mask, **kw)
        got = m(hidden, mask, rows=rows, **kw)
    finally:
        torch.set_num_threads(threads)
    assert got.shape == (int(rows.sum()), cfg.out_dim)
    assert (got - full[rows]).abs().max().item() == 0.0
    # With several threads MKL may split a matmul's sum across threads when it has few rows,
    # so a gathered row can differ in the last bits (as it does between two batch sizes).
    torch.testing.assert_close(
        m(hidden, mask, rows=rows, **kw), m(hidden, mask, **kw)[rows], rtol=1e-6, atol=1e-6
    )
    # any row set, leading or not, gives those rows; a handful of rows may take a different
    # BLAS kernel (MKL splits the sum over threads for few rows), so these are compared closely
    odd = torch.rand(rows.shape, generator=g) < 0.3
    torch.testing.assert_close(m(hidden, mask, rows=odd, **kw), full[odd], rtol=1e-6, atol=1e-6)
    # and the gradients reach the same parameters (out_proj, the last block's MLP, ...)
    got.square().sum().backward()
    assert all(p.grad is not None for p in trainable_parameters(m))


def test_factorized_seed_module():
    """seed_rank > 0: t5_embed_a (V, r) + t5_embed_b (r -> W, no bias) in the §4 inventory,
    and the seed added to the queries is B(A[id])."""
    torch.manual_seed(SEED)
    m = randomize(build_adapter(FACTORIZED)).eval()
    got = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert got == engine_inventory(FACTORIZED)
    assert got["t5_embed_a.weight"] == (VOCAB, RANK) and got["t5_embed_b.weight"] == (WIDTH, RANK)
    assert m.t5_embed_b.bias is None and not hasattr(m, "t5_embed")
    ids = torch.randint(0, VOCAB, (2, QUERIES))
    want = m.t5_embed_a.weight[ids] @ m.t5_embed_b.weight.T
    torch.testing.assert_close(m.seed(ids), want)
