"""The lead figures (data/dit_rows.py, data/lead.py): the centred cosine of the rows the DiT
reads, tokens and pads apart, each set centred on its own mean, per length bucket and tap."""

from __future__ import annotations

import pytest
import torch

from gguf_trainer.data.dit_rows import DitFigures, SetMeans, row_sets
from gguf_trainer.data.lead import lead_line, lead_value
from gguf_trainer.data.shards import Batch

D = 8
SINK = 500.0


def sample_batch(lengths=(10, 90), start=1, n_pad=3, seed=0) -> Batch:
    """Token-aligned samples: row 0 the template's lead (shared by every prompt, a sink row
    of SINK in dim 0), `start` rows before the DiT's first row, `n_pad` pads after the real
    rows; lengths are the real rows."""
    g = torch.Generator().manual_seed(seed)
    r = max(lengths) + n_pad
    b = len(lengths)
    target = torch.zeros(b, r, D)
    mask = torch.zeros(b, r, dtype=torch.bool)
    for i, n in enumerate(lengths):
        target[i, :n] = torch.randn(n, D, generator=g) + 3.0
        target[i, 0] = 0.0
        target[i, 0, 0] = SINK
        target[i, n:n + n_pad] = torch.randn(n_pad, D, generator=g) - 5.0
        mask[i, :n + n_pad] = True
    return Batch(torch.zeros(b, r, 4), mask.clone(), target, mask.clone(), None,
                 torch.full((b,), start), [(0, i) for i in range(b)],
                 n_real=torch.tensor(lengths))


def figures(batch, pred, n_taps=1, n_const=1, mu=None):
    means = SetMeans.of_batches([batch], n_const)
    mu = batch.target[batch.row_mask].mean(0) if mu is None else mu
    acc = DitFigures(mu, means, n_taps, taps=tuple(range(n_taps)) if n_taps > 1 else ())
    acc.update(batch, pred)
    return acc.result()


def test_rows_fall_in_tokens_and_pads_from_the_start_row_less_the_shared_lead():
    b = sample_batch(lengths=(5, 7), start=2, n_pad=2)
    sets = row_sets(b, n_const=3)
    assert sets["tokens"][0].tolist()[:9] == [False] * 3 + [True] * 2 + [False] * 4
    assert sets["pads"][0].tolist()[:9] == [False] * 5 + [True] * 2 + [False] * 2
    assert sets["tokens"][1].tolist() == [False] * 3 + [True] * 4 + [False] * 2


def test_a_perfect_prediction_scores_one_and_the_set_mean_scores_zero():
    b = sample_batch()
    lead = figures(b, b.target.clone())
    assert lead_value(lead) == pytest.approx(1.0)
    assert lead_value(lead, "pads") == pytest.approx(1.0)
    assert lead_value(lead, figure="rel_mse") == pytest.approx(0.0)
    means = SetMeans.of_batches([b], 1)
    pred = means.tokens.expand(b.target.shape).clone()
    lead = figures(b, pred)
    assert lead_value(lead) == pytest.approx(0.0, abs=1e-9)
    assert lead_value(lead, figure="rel_mse") == pytest.approx(1.0)


def test_a_mean_holding_the_sink_row_would_make_the_mean_look_perfect():
    """The probe's finding, as a guard: centred on the all-row mean (sink included) the mean
    of the token rows scores ~1; the lead centres each set on its own mean and scores it 0."""
    b = sample_batch()
    means = SetMeans.of_batches([b], 1)
    pred = means.tokens.expand(b.target.shape).clone()
    mu_all = b.target[b.row_mask].mean(0)
    sel = row_sets(b, 1)["tokens"]
    naive = torch.nn.functional.cosine_similarity(pred[sel] - mu_all, b.target[sel] - mu_all,
                                                  dim=-1).mean()
    assert float(naive) > 0.9
    assert lead_value(figures(b, pred)) == pytest.approx(0.0, abs=1e-9)


def test_the_plain_cosine_stays_beside_it_and_the_baseline_is_the_step_0_mean():
    b = sample_batch()
    noisy = b.target + 0.5 * torch.randn(b.target.shape, generator=torch.Generator().manual_seed(3))
    lead = figures(b, noisy)
    tok = lead["sets"]["tokens"]["all"]
    assert tok["cos"] > tok["centred_cos"]  # the offset of +3 lifts the plain cosine
    assert 0 < tok["centred_cos"] < 1
    assert tok["baseline_rel_mse"] > tok["rel_mse"]
    assert tok["rows"] == (10 - 1) + (90 - 1)


def test_short_and_long_buckets_split_by_the_real_rows_from_the_start_row():
    b = sample_batch(lengths=(10, 90), start=1)
    lead = figures(b, b.target.clone())
    assert lead["sets"]["tokens"]["short"]["rows"] == 9
    assert lead["sets"]["tokens"]["long"]["rows"] == 89
    assert set(lead["sets"]["pads"]) == {"all", "short", "long"}


def test_a_stack_gets_each_taps_figure_and_their_mean():
    b = sample_batch()
    pred = b.target.clone()
    pred[..., D // 2:] = pred[..., D // 2:].flip(1)  # the second tap's rows are wrong
    lead = figures(b, pred, n_taps=2)
    per = lead["sets"]["tokens"]["all"]["per_tap"]
    assert per[0]["centred_cos"] == pytest.approx(1.0)
    assert per[1]["centred_cos"] < 0.9
    assert lead_value(lead) == pytest.approx((per[0]["centred_cos"] + per[1]["centred_cos"]) / 2)
    assert "tokens per tap: L0 1.000" in lead_line(lead)


def test_a_resampler_has_tokens_only():
    b = sample_batch()
    b.n_real, b.sup_start = None, None
    lead = figures(b, b.target.clone(), n_const=0)
    assert set(lead["sets"]) == {"tokens"}
    assert lead_value(lead, "pads") is None


def test_the_line_leads_with_tokens_then_pads_and_reads_nothing_from_an_old_record():
    b = sample_batch()
    line = lead_line(figures(b, b.target.clone()))
    assert line.startswith("tokens centred cos 1.0000")
    assert "; pads centred cos 1.0000" in line
    assert "[short 1.0000, long 1.0000]" in line
    assert lead_line(None) is None and lead_line({"sets": {}}) is None
