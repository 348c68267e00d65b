"""RowMetrics: global weighting, each key against an independent numpy computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gguf_trainer.data.metrics import RowMetrics, masked_rows, row_cos, sample_index

DIM = 16
ROWS = 200
SAMPLES = 37
SEED = 7
UNEVEN = [3, 90, 1, 40, 7, 50, 9]  # 7 batches that cut samples in two


def make_set(seed=SEED, rows=ROWS, dim=DIM):
    """Rows whose quality varies a lot, so batch means differ from the global mean."""
    rng = np.random.default_rng(seed)
    offset = rng.normal(3.0, 1.0, dim)
    target = offset + rng.normal(0, 1, (rows, dim))
    noise_scale = rng.uniform(0.05, 3.0, (rows, 1))
    pred = target + noise_scale * rng.normal(0, 1, (rows, dim))
    ref = pred + 0.01 * rng.normal(0, 1, (rows, dim))
    ids = np.sort(rng.integers(0, SAMPLES, rows))
    tags = {"eos": rng.random(rows) < 0.2, "vis": rng.random(rows) < 0.5,
            "empty": np.zeros(rows, bool)}
    mu = offset + rng.normal(0, 0.1, dim)  # a train mean: close to, not equal to, the offset
    return pred, target, ref, ids, tags, mu


def numpy_metrics(pred, target, ref, ids, tags, mu, centered):
    """The definitions of RowMetrics' docstring, written independently in numpy."""
    def cos(a, b):
        dot = (a * b).sum(1)
        return dot / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-8)

    def rms(x):
        return x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-5)

    sub = mu if centered else 0.0
    head = cos(pred - sub, target - sub)
    out = {"cos": head.mean(), "cos_raw": cos(pred, target).mean(),
           "cos_rms": cos(rms(pred - sub), rms(target - sub)).mean(),
           "cos_centered": cos(pred - mu, target - mu).mean(),
           "rel_mse": ((pred - target) ** 2).sum() / (target ** 2).sum(),
           "worst_row_cos": head.min(),
           "worst_sample_cos": min(head[ids == s].mean() for s in np.unique(ids)),
           "roundtrip_cos": cos(pred - sub, ref - sub).mean(),
           "baseline_cos": cos(np.broadcast_to(mu, target.shape), target).mean(),
           "baseline_cos_centered": 0.0,
           "baseline_rel_mse": ((mu - target) ** 2).sum() / (target ** 2).sum(),
           "rows": len(ids), "samples": len(np.unique(ids))}
    base = cos(np.broadcast_to(mu, target.shape), target)
    for name, sel in tags.items():
        if sel.any():
            out[f"cos_{name}"] = head[sel].mean()
            # the mean baseline on the same rows (its centred prediction is the zero row)
            out[f"baseline_cos_{name}"] = 0.0 if centered else base[sel].mean()
    return out


def run_batches(sizes, pred, target, ref, ids, tags, mu, centered):
    m = RowMetrics(mu=torch.from_numpy(mu), centered=centered)
    start = 0
    for n in sizes:
        sl = slice(start, start + n)
        m.update(torch.from_numpy(pred[sl]), torch.from_numpy(target[sl]),
                 torch.from_numpy(ids[sl]),
                 tags={k: torch.from_numpy(v[sl]) for k, v in tags.items()},
                 ref=torch.from_numpy(ref[sl]))
        start += n
    assert start == len(ids)
    return m.result()


@pytest.mark.parametrize("centered", [False, True])
def test_batch_split_does_not_change_any_key(centered):
    data = make_set()
    whole = run_batches([ROWS], *data, centered=centered)
    split = run_batches(UNEVEN, *data, centered=centered)
    assert whole.keys() == split.keys()
    for key in whole:
        assert split[key] == pytest.approx(whole[key], abs=1e-12), key
    # The earlier trainer's mean of per-batch means is a different number on these rows,
    # so this test would catch a regression to it.
    pred, target, ref, ids, tags, mu = data
    per_batch = []
    for start, n in zip(np.cumsum([0] + UNEVEN[:-1]), UNEVEN, strict=True):
        sl = slice(start, start + n)
        batch_tags = {k: v[sl] for k, v in tags.items()}
        one = run_batches([n], pred[sl], target[sl], ref[sl], ids[sl], batch_tags, mu, centered)
        per_batch.append(one["cos"])
    assert abs(np.mean(per_batch) - whole["cos"]) > 1e-3


@pytest.mark.parametrize("centered", [False, True])
def test_every_key_matches_numpy(centered):
    data = make_set(seed=11)
    got = run_batches(UNEVEN, *data, centered=centered)
    want = numpy_metrics(*data, centered=centered)
    assert got.keys() == want.keys()
    # a tag with zero rows is omitted
    assert "cos_empty" not in got and "baseline_cos_empty" not in got
    assert {"baseline_cos_vis", "baseline_cos_eos"} <= got.keys()  # per-tag baselines, deliberately
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-10, abs=1e-12), key
    if centered:
        assert got["cos"] == pytest.approx(got["cos_centered"], abs=1e-12)
    else:
        assert got["cos"] == pytest.approx(got["cos_raw"], abs=1e-12)


def test_cos_rms_equals_cos_because_cosine_is_scale_invariant():
    g = torch.Generator().manual_seed(SEED)
    scale = torch.logspace(-3, 3, 64).unsqueeze(1)
    target = torch.randn(64, 128, generator=g) * scale
    pred = (target + torch.randn(64, 128, generator=g) * scale) * 7.0
    m = RowMetrics()
    m.update(pred, target, torch.arange(64))
    r = m.result()
    assert r["cos_rms"] == pytest.approx(r["cos"], abs=1e-6)


def test_shared_offset_fools_plain_cosine_not_centred():
    """Why LLaDA's headline is centred: an uninformative prediction reads ~0.99 plain."""
    g = torch.Generator().manual_seed(SEED)
    dim, rows = 256, 64
    offset = 2000 + 50 * torch.randn(dim, generator=g, dtype=torch.float64)
    target = offset + 20 * torch.randn(rows, dim, generator=g, dtype=torch.float64)
    mu = target.mean(0)
    guess = offset + 20 * torch.randn(rows, dim, generator=g, dtype=torch.float64)
    for pred, centred_bound in [(mu.expand(rows, dim), 0.0), (guess, 0.05)]:
        m = RowMetrics(mu=mu)
        m.update(pred, target, torch.arange(rows))
        r = m.result()
        assert r["cos"] > 0.99
        assert abs(r["cos_centered"]) <= centred_bound


def test_tags_worst_sample_and_rows_split_across_updates():
    e = torch.eye(4, dtype=torch.float64)
    # sample 0: two perfect rows; sample 1: one perfect, one orthogonal row (mean 0.5);
    # sample 1 is cut across two updates.
    m = RowMetrics()
    m.update(torch.stack([e[0], e[1], e[2]]), torch.stack([e[0], e[1], e[2]]),
             torch.tensor([0, 0, 1]), tags={"eos": torch.tensor([False, True, False])})
    m.update(e[3:4], e[0:1], torch.tensor([1]), tags={"eos": torch.tensor([True])})
    r = m.result()
    assert r["rows"] == 4 and r["samples"] == 2
    assert r["cos"] == pytest.approx(0.75)
    assert r["cos_eos"] == pytest.approx(0.5)  # rows 1 (cos 1) and 3 (cos 0)
    assert r["worst_row_cos"] == 0.0
    assert r["worst_sample_cos"] == pytest.approx(0.5)
    assert "roundtrip_cos" not in r and "baseline_cos" not in r and "cos_centered" not in r


def test_tag_name_that_collides_with_a_key_is_refused():
    with pytest.raises(AssertionError, match="collides"):
        RowMetrics().update(torch.ones(2, 3), torch.ones(2, 3), torch.arange(2),
                            tags={"raw": torch.ones(2, dtype=torch.bool)})


@pytest.mark.parametrize("centered", [False, True])
def test_roundtrip_of_identical_prediction_is_one(centered):
    pred, target, _, ids, _, mu = make_set()
    m = RowMetrics(mu=torch.from_numpy(mu), centered=centered)
    p = torch.from_numpy(pred).float()
    m.update(p, torch.from_numpy(target).float(), torch.from_numpy(ids), ref=p.clone())
    assert m.result()["roundtrip_cos"] == pytest.approx(1.0, abs=1e-6)


def test_prediction_equal_to_mu_scores_the_baseline():
    _, target, _, ids, _, mu = make_set()
    m = RowMetrics(mu=torch.from_numpy(mu))
    m.update(torch.from_numpy(np.broadcast_to(mu, target.shape).copy()),
             torch.from_numpy(target), torch.from_numpy(ids))
    r = m.result()
    assert r["cos"] == pytest.approx(r["baseline_cos"], abs=1e-12)
    assert r["rel_mse"] == pytest.approx(r["baseline_rel_mse"], abs=1e-12)
    assert r["cos_centered"] == r["baseline_cos_centered"] == 0.0


def test_padded_batch_helpers_flatten_in_sample_order():
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(3, 5, DIM, generator=g)
    y = torch.randn(3, 5, DIM, generator=g)
    lengths = torch.tensor([2, 5, 1])
    mask = torch.arange(5) < lengths.unsqueeze(1)
    rows = masked_rows(x, mask)
    ids = sample_index(mask, offset=10)
    assert rows.shape == (8, DIM)
    assert ids.tolist() == [10, 10, 11, 11, 11, 11, 11, 12]
    assert torch.equal(rows[2:7], x[1])
    m = RowMetrics()
    m.update(rows, masked_rows(y, mask), ids)
    assert m.result()["samples"] == 3
    assert m.result()["cos"] == pytest.approx(float(row_cos(rows, masked_rows(y, mask)).mean()))


def test_zero_rows_and_empty_updates():
    z = torch.zeros(2, 4)
    assert row_cos(z, torch.ones(2, 4)).tolist() == [0.0, 0.0]  # the documented zero-row rule
    m = RowMetrics()
    assert m.result() == {"rows": 0, "samples": 0}
    m.update(torch.zeros(0, 4), torch.zeros(0, 4), torch.zeros(0, dtype=torch.long))
    assert m.result() == {"rows": 0, "samples": 0}


def test_bf16_inputs_are_accumulated_in_float64():
    pred, target, ref, ids, tags, mu = make_set()
    m = RowMetrics(mu=torch.from_numpy(mu), centered=True)
    m.update(torch.from_numpy(pred).bfloat16(), torch.from_numpy(target).bfloat16(),
             torch.from_numpy(ids))
    got, want = m.result(), numpy_metrics(pred, target, ref, ids, tags, mu, centered=True)
    assert all(isinstance(v, (float, int)) for v in got.values())
    for key in ("cos", "cos_raw", "cos_centered", "rel_mse", "baseline_cos"):
        assert got[key] == pytest.approx(want[key], abs=2e-2), key
