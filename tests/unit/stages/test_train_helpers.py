"""Pure helpers of precompute and train: budget batching, device budgets, the LR schedule and
the loss, each against an independent computation."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gguf_trainer.data.shards import Batch, Stats
from gguf_trainer.machine.hardware import budget_batches, choose_budgets
from gguf_trainer.stages.train import compute_loss, lr_at
from gguf_trainer.store.project_schema import PrecomputeSettings

SEED = 5

# ----------------------------------------------------------------- budget_batches


def _check_batches(lengths, batches, max_batch, max_tokens):
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))  # every index exactly once
    ordered = [lengths[i] for i in flat]
    assert ordered == sorted(ordered)  # ascending length, across and within batches
    for b in batches:
        assert 1 <= len(b) <= max_batch
        cost = len(b) * max(lengths[i] for i in b)
        assert cost <= max_tokens or len(b) == 1, (b, cost)


@pytest.mark.parametrize(
    "max_batch, max_tokens", [(16, 4096), (256, 65536), (4, 100), (1, 10), (64, 50)]
)
def test_budget_batches_heavy_tail(max_batch, max_tokens):
    rng = np.random.default_rng(SEED)
    lengths = np.clip(rng.lognormal(3.5, 1.0, 700), 5, 512).astype(int).tolist()
    batches = budget_batches(lengths, max_batch, max_tokens)
    _check_batches(lengths, batches, max_batch, max_tokens)


def test_budget_batches_small_cases():
    assert budget_batches([], 4, 100) == []
    assert budget_batches([7], 4, 1) == [[0]]  # a single item over budget still gets a batch
    assert budget_batches([5, 5, 4, 5], 8, 100) == [[2, 0, 1, 3]]  # ties keep index order
    # 10 padded tokens: within the slack
    assert budget_batches([5, 3, 5, 1], 8, 100) == [[3, 1, 0, 2]]
    # >= 90% real per batch
    assert budget_batches([200, 100, 200, 100], 8, 10_000) == [[1, 3], [0, 2]]
    assert budget_batches([10, 10, 10, 10, 10], 2, 1000) == [[0, 1], [2, 3], [4]]
    assert budget_batches([10, 10, 10], 8, 20) == [[0, 1], [2]]
    assert budget_batches([600, 2, 3], 8, 100) == [[1, 2], [0]]  # the long one alone


def test_budget_batches_greedy_fill_is_tight():
    """A batch closes only when the next item would break a limit: count, tokens, or the
    batch's real ÷ processed share falling under MIN_BATCH_EFFICIENCY."""
    from gguf_trainer.machine.hardware import MIN_BATCH_EFFICIENCY, PAD_SLACK_TOKENS

    rng = np.random.default_rng(SEED + 1)
    lengths = rng.integers(1, 300, 400).tolist()
    max_batch, max_tokens = 32, 2048
    batches = budget_batches(lengths, max_batch, max_tokens)
    for b, nxt in itertools.pairwise(batches):
        nxt_len = lengths[nxt[0]]
        real = sum(lengths[i] for i in b) + nxt_len
        padding = (len(b) + 1) * nxt_len - real
        assert (
            len(b) == max_batch
            or (len(b) + 1) * nxt_len > max_tokens
            or (padding > PAD_SLACK_TOKENS and real < MIN_BATCH_EFFICIENCY * (len(b) + 1) * nxt_len)
        )


def test_choose_budgets_cpu_auto_and_given():
    auto = choose_budgets(PrecomputeSettings(), torch.device("cpu"))
    assert (auto.teacher_batch, auto.tok_budget, auto.student_batch, auto.student_tok_budget) == (
        16,
        4096,
        32,
        8192,
    )
    given = choose_budgets(
        PrecomputeSettings(teacher_batch=3, student_tok_budget=999), torch.device("cpu")
    )
    assert (
        given.teacher_batch,
        given.tok_budget,
        given.student_batch,
        given.student_tok_budget,
    ) == (3, 4096, 32, 999)


def _card_budgets(monkeypatch, total_memory):
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device: SimpleNamespace(total_memory=total_memory),
    )
    return choose_budgets(PrecomputeSettings(), torch.device("cuda"))


def test_choose_budgets_cards(monkeypatch):
    small, big = _card_budgets(monkeypatch, 12e9), _card_budgets(monkeypatch, 80e9)
    for name in ("teacher_batch", "tok_budget", "student_batch", "student_tok_budget"):
        assert getattr(big, name) > getattr(small, name) > 0  # a big card gets bigger batches


SHARD = 1024  # precompute's default shard size: batches are packed per shard
TEMPLATE = 20  # student tokens around the prompt


def heavy_tail_lengths(n=SHARD, seed=SEED):
    """Prompt token counts: lognormal (median ~37), clipped to 5..512."""
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(3.6, 0.9, n)), 5, 512).astype(int).tolist()


def padding_efficiency(lengths, max_batch, max_tokens):
    batches = budget_batches(lengths, max_batch, max_tokens)
    processed = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    return sum(lengths) / processed


def _assert_efficient(b):
    teacher = heavy_tail_lengths()
    student = [n + TEMPLATE for n in teacher]
    eff_t = padding_efficiency(teacher, b.teacher_batch, b.tok_budget)
    eff_s = padding_efficiency(student, b.student_batch, b.student_tok_budget)
    assert eff_t >= 0.9 and eff_s >= 0.9, (eff_t, eff_s)


def test_padding_efficiency_cpu_budgets():
    """precompute's claim: real ÷ processed tokens stays high on heavy-tailed lengths."""
    _assert_efficient(choose_budgets(PrecomputeSettings(), torch.device("cpu")))


@pytest.mark.parametrize("total_memory", [12e9, 80e9])
def test_padding_efficiency_card_budgets(monkeypatch, total_memory):
    _assert_efficient(_card_budgets(monkeypatch, total_memory))


# ----------------------------------------------------------------- lr_at

LR, WARMUP, STEPS = 2e-4, 100, 1000


def reference_lr(step):
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    t = min((step - WARMUP) / (STEPS - WARMUP), 1.0)
    floor = 0.1 * LR
    return floor + (LR - floor) * 0.5 * (1 + math.cos(math.pi * t))


def test_lr_warmup_peak_end_and_flat():
    assert lr_at(0, STEPS, WARMUP, LR) == pytest.approx(LR / WARMUP)
    assert lr_at(WARMUP - 1, STEPS, WARMUP, LR) == pytest.approx(LR)
    assert lr_at(WARMUP, STEPS, WARMUP, LR) == pytest.approx(LR)  # peak where the cosine starts
    warm = [lr_at(s, STEPS, WARMUP, LR) for s in range(WARMUP)]
    assert np.allclose(np.diff(warm), LR / WARMUP)  # linear
    assert lr_at(STEPS, STEPS, WARMUP, LR) == pytest.approx(0.1 * LR, rel=1e-12)
    for after in (STEPS + 1, STEPS + 500, 10 * STEPS):
        assert lr_at(after, STEPS, WARMUP, LR) == pytest.approx(0.1 * LR, rel=1e-12)
    mid = WARMUP + (STEPS - WARMUP) // 2
    assert lr_at(mid, STEPS, WARMUP, LR) == pytest.approx(0.55 * LR)


def test_lr_matches_reference_everywhere():
    got = np.array([lr_at(s, STEPS, WARMUP, LR) for s in range(STEPS + 50)])
    want = np.array([reference_lr(s) for s in range(STEPS + 50)])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert np.all(np.diff(got[WARMUP : STEPS + 1]) <= 1e-18)  # never rises after the peak
    assert got[WARMUP:].min() == pytest.approx(0.1 * LR, rel=1e-12)  # the floor, never below


def test_lr_edge_cases():
    assert lr_at(0, 10, 0, LR) == pytest.approx(LR)  # no warmup: start at the peak
    assert lr_at(10, 10, 0, LR) == pytest.approx(0.1 * LR)
    assert lr_at(5, 5, 5, LR) == pytest.approx(LR)  # warmup == steps: no division by zero
    assert lr_at(20, 5, 5, LR) == pytest.approx(0.1 * LR)


# ----------------------------------------------------------------- compute_loss

B, R, D = 3, 5, 16
COS_WEIGHT = 0.5


def make_case(seed=SEED):
    g = torch.Generator().manual_seed(seed)
    mu = 4.0 + torch.randn(D, generator=g)
    sigma = torch.rand(D, generator=g) * 2.0
    sigma[:3] = 0.001  # near-constant dims: the floor applies
    sigma_f = sigma.clamp_min(0.03)
    stats = Stats(mu, sigma, sigma_f, 1000)
    target = mu + sigma * torch.randn(B, R, D, generator=g)
    row_mask = torch.ones(B, R, dtype=torch.bool)
    row_mask[0, 3:] = False
    row_mask[2, 1:] = False
    target[~row_mask] = 0.0  # padding rows, as collate leaves them
    batch = Batch(
        hidden=torch.zeros(B, 2, 4),
        mask=torch.ones(B, 2, dtype=torch.bool),
        target=target,
        row_mask=row_mask,
        seed_ids=None,
        sup_start=None,
        samples=[],
    )
    return batch, stats, g


def numpy_loss(pred, batch, stats, standardized, cos_weight):
    """The docstring's definition, written independently: rows outside row_mask dropped first."""
    keep = batch.row_mask.numpy()
    p = pred.double().numpy()[keep]
    t = batch.target.double().numpy()[keep]
    mu, sf = stats.mu.double().numpy(), stats.sigma_f.double().numpy()
    if standardized:
        t = (t - mu) / sf
        err = p - t
    else:
        err = (p - t) / sf
    mse = (err**2).mean()
    cos = ((p * t).sum(1) / (np.linalg.norm(p, axis=1) * np.linalg.norm(t, axis=1))).mean()
    return mse + cos_weight * (1 - cos), mse, cos


@pytest.mark.parametrize("standardized", [False, True])
def test_loss_is_zero_at_the_target(standardized):
    batch, stats, _ = make_case()
    pred = (batch.target - stats.mu) / stats.sigma_f if standardized else batch.target.clone()
    loss, parts = compute_loss(pred, batch, stats, standardized, COS_WEIGHT)
    assert float(loss) == pytest.approx(0.0, abs=1e-5)
    assert parts["mse"] == pytest.approx(0.0, abs=1e-8) and parts["cos"] == pytest.approx(
        1.0, abs=1e-5
    )


@pytest.mark.parametrize("standardized", [False, True])
def test_loss_matches_independent_computation(standardized):
    batch, stats, g = make_case()
    pred = torch.randn(B, R, D, generator=g) * 2.0
    if not standardized:
        pred = pred + stats.mu
    loss, parts = compute_loss(pred, batch, stats, standardized, COS_WEIGHT)
    want, mse, cos = numpy_loss(pred, batch, stats, standardized, COS_WEIGHT)
    assert float(loss) == pytest.approx(want, rel=1e-5)
    assert parts["mse"] == pytest.approx(mse, rel=1e-5) and parts["cos"] == pytest.approx(
        cos, rel=1e-5
    )


def test_mse_is_whitened_by_sigma_f():
    """Raw rows off by k·σ_f in every dim give mse k² in both modes, floored dims included."""
    batch, stats, _ = make_case()
    k = 0.7
    raw = batch.target + k * stats.sigma_f
    _, plain = compute_loss(raw, batch, stats, False, 0.0)
    std_pred = (raw - stats.mu) / stats.sigma_f
    _, std = compute_loss(std_pred, batch, stats, True, 0.0)
    assert plain["mse"] == pytest.approx(k * k, rel=1e-5)
    assert std["mse"] == pytest.approx(k * k, rel=1e-4)


@pytest.mark.parametrize("standardized", [False, True])
def test_masked_rows_do_not_count(standardized):
    batch, stats, g = make_case()
    pred = torch.randn(B, R, D, generator=g)
    base, _ = compute_loss(pred, batch, stats, standardized, COS_WEIGHT)
    wild_pred, wild_target = pred.clone(), batch.target.clone()
    wild_pred[~batch.row_mask] = 1e4 * torch.randn(int((~batch.row_mask).sum()), D, generator=g)
    wild_target[~batch.row_mask] = -3e3
    wild = Batch(batch.hidden, batch.mask, wild_target, batch.row_mask, None, None, [])
    loss, _ = compute_loss(wild_pred, wild, stats, standardized, COS_WEIGHT)
    assert float(loss) == pytest.approx(float(base), rel=1e-6)


@pytest.mark.parametrize("standardized", [False, True])
def test_loss_on_the_supervised_rows_alone_is_the_padded_loss(standardized):
    """The train step's forward returns the supervised rows only (N, D): same loss, same parts."""
    batch, stats, g = make_case()
    pred = torch.randn(B, R, D, generator=g) * 2.0 + (0.0 if standardized else stats.mu)
    loss, parts = compute_loss(pred, batch, stats, standardized, COS_WEIGHT)
    rows_loss, rows_parts = compute_loss(
        pred[batch.row_mask], batch, stats, standardized, COS_WEIGHT
    )
    want, _, _ = numpy_loss(pred, batch, stats, standardized, COS_WEIGHT)
    assert float(rows_loss) == pytest.approx(want, rel=1e-5) and float(loss) == pytest.approx(
        want, rel=1e-5
    )
    assert rows_parts["mse"] == pytest.approx(parts["mse"], rel=1e-6)
    assert rows_parts["cos"] == pytest.approx(parts["cos"], rel=1e-6)


def test_supervised_rows_forward_gives_the_full_forward_loss_and_gradients():
    """What train_step backpropagates (scoring.forward_rows: the supervised rows alone) has the
    loss and gradients of the full forward with the padded loss, up to float rounding."""
    import copy

    from gguf_trainer.data.scoring import forward, forward_rows
    from gguf_trainer.model.adapters import AdapterConfig, build_adapter, trainable_parameters

    cfg = AdapterConfig("seeded_resampler", 8, D, 64, 2, num_queries=R, seed_vocab=20)
    batch, stats, g = make_case()
    batch.hidden = torch.randn(B, 4, 8, generator=g)
    batch.mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    batch.seed_ids = torch.randint(0, 20, (B, R), generator=g) * batch.row_mask
    torch.manual_seed(SEED)
    rows_model = build_adapter(cfg)
    full_model = copy.deepcopy(rows_model)
    losses = []
    for model, fwd in ((rows_model, forward_rows), (full_model, forward)):
        loss, _ = compute_loss(fwd(model, batch), batch, stats, True, COS_WEIGHT)
        loss.backward()
        losses.append(float(loss))
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    for a, b in zip(trainable_parameters(rows_model), trainable_parameters(full_model)):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-7)
    assert rows_model.blocks[-1].mlp[0].weight.grad.abs().sum() > 0


def test_loss_has_gradients_only_through_supervised_rows():
    batch, stats, g = make_case()
    pred = torch.randn(B, R, D, generator=g, requires_grad=True)
    loss, _ = compute_loss(pred, batch, stats, True, COS_WEIGHT)
    loss.backward()
    assert torch.all(pred.grad[~batch.row_mask] == 0)
    assert torch.all(pred.grad[batch.row_mask].abs().sum(-1) > 0)
