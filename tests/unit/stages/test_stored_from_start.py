"""Shards store no target row before the start row when nothing reads them: a recipe with
`train.prefix_rows` "out" (the loss weighs them 0) and `train.stats_rows` "loss" (the moments
weigh them as the loss does) on a family with a fixed start row (Krea 2's 34, LingBot's 140)
stores each sample's target rows from its `sup_start` on, with `target_pos`, and every row's
student state. Training, the statistics and the lead figures read the same from such a shard as
from one of every row; any other recipe — a project from before the recipe keys among them —
stores every row; the fingerprint, `status` and the disk pre-flight name the change."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_stored_rows import IN, WIDTH, _ctx, _project, _Report, _samples, _Student, recipe_of

from gguf_trainer.data.dit_rows import DitFigures, SetMeans
from gguf_trainer.data.recipe import (
    RowFit,
    StoredRows,
    describe_stored_rows,
    legacy_recipe,
    recipe_stats,
    stored_rows,
)
from gguf_trainer.data.shards import Shard, collate, linear_fit, write_shard
from gguf_trainer.machine import disk_space
from gguf_trainer.packs import get_pack
from gguf_trainer.stages import precompute
from gguf_trainer.stages.precompute_shard import build_shard
from gguf_trainer.stages.train import compute_loss
from gguf_trainer.teachers.base import TargetRows

KREA2, LINGBOT, OVIS, FLUX3, MAGEFLOW = (
    "qwen3vl_krea2", "qwen3vl_lingbot", "qwen3_ovis", "qwen3vl_flux3", "qwen3vl_mageflow")
START = 4  # the fake teacher's start row (a family's sup_start)


class _Teacher:
    """Rows that vary with the prompt, a template lead every prompt shares, and the start row."""

    def __init__(self, pack, start=START):
        self.pack, self.start = pack, start

    def targets(self, samples, ids, vis):
        out = []
        for row in ids:
            g = torch.Generator().manual_seed(len(row) * 131 + sum(row) % 997)
            rows = torch.randn(len(row), 2 * WIDTH, generator=g) * 2.0 + 1.0
            rows[:2] = 40.0  # the sink-like shared lead, before the start row
            out.append(TargetRows(rows=rows, sup_start=self.start))
        return out


def _shard(tmp_path, pack, name, pad_rows=0, from_start=False, n_reals=(5, 23, 81)):
    ctx = _ctx(pack)
    ctx.teacher = _Teacher(pack)
    samples = _samples(pack, n_reals)
    tensors = build_shard(ctx, samples, _Report(), lambda f: None,
                          [len(s.ids) for s in samples], pad_rows, from_start)
    path = tmp_path / f"{name}.safetensors"
    write_shard(path, tensors, {"fingerprint": "f"})
    return path, tensors


def test_only_prefix_out_with_loss_statistics_on_a_fixed_start_drops_rows():
    krea2, lingbot, ovis = get_pack(KREA2), get_pack(LINGBOT), get_pack(OVIS)
    assert stored_rows(recipe_of(krea2), krea2) == StoredRows(0, True)  # the shipped recipe
    assert stored_rows(recipe_of(lingbot), lingbot) == StoredRows(0, True)
    assert stored_rows(recipe_of(ovis, pad_weight="one"), ovis) == StoredRows(32, True)
    assert stored_rows(recipe_of(krea2, prefix_rows="in"), krea2).every  # trained on
    assert stored_rows(recipe_of(krea2, stats_rows="all"), krea2).every  # in the statistics
    assert stored_rows(legacy_recipe(krea2, 0.03), krea2).every  # a project from before
    flux3 = get_pack(FLUX3)  # start 0: nothing before it, the pads-only label as before
    assert stored_rows(recipe_of(flux3), flux3) == StoredRows(1, False)
    mageflow = get_pack(MAGEFLOW)  # its start varies by sample: every row
    assert stored_rows(recipe_of(mageflow, prefix_rows="out", stats_rows="loss"),
                       mageflow).every


def test_labels_and_their_words():
    assert StoredRows().label == "all"
    assert StoredRows(1).label == "1 pad row per sample"  # shards of the pads-only change
    assert StoredRows(0, True).label == "from the start row"
    assert StoredRows(32, True).label == "from the start row, 32 pad rows per sample"
    assert describe_stored_rows("all") == "every target row"
    assert describe_stored_rows("1 pad row per sample") == "the real rows and 1 pad row per sample"
    assert describe_stored_rows("from the start row") == "the target rows from the start row on"
    assert describe_stored_rows("from the start row, 32 pad rows per sample") == (
        "the real rows from the start row on and 32 pad rows per sample")


def test_krea2_stores_the_rows_from_the_start_row_and_trains_and_scores_as_on_every_row(
        tmp_path):
    pack = get_pack(KREA2)
    recipe = recipe_of(pack)
    full_path, full = _shard(tmp_path, pack, "full")
    part_path, part = _shard(tmp_path, pack, "part", from_start=True)
    lens = full["target_len"].tolist()
    assert part["target_len"].tolist() == [n - START for n in lens]
    assert part["target_pos"].tolist() == [j for n in lens for j in range(START, n)]
    assert torch.equal(part["student_rows"], full["student_rows"])  # every row's state
    a, b = Shard(full_path), Shard(part_path)
    for i in range(a.n):
        keep = b.target_keep(i)
        assert keep.tolist() == [j >= START for j in range(lens[i])]
        assert torch.equal(b.target(i)[keep], a.target(i)[keep])

    stats_a, scales_a = recipe_stats([full_path], recipe, 2)
    stats_b, scales_b = recipe_stats([part_path], recipe, 2)
    assert torch.allclose(stats_a.mu, stats_b.mu, atol=1e-5)
    assert torch.allclose(stats_a.sigma_f, stats_b.sigma_f, atol=1e-5)
    if scales_a is not None:  # sink "token": the token rows' own sigma, the same rows
        assert torch.allclose(scales_a.token, scales_b.token, atol=1e-5)
        assert scales_a.n_const == scales_b.n_const

    def loss(shard):
        batch = collate(shard, [0, 1, 2], 0)
        pred = torch.randn(batch.target.shape, generator=torch.Generator().manual_seed(5))
        fit = RowFit.for_batch(batch, recipe, scales_a, 2)
        value, _ = compute_loss(pred[batch.row_mask], batch, stats_a, recipe.standardized,
                                0.5, fit)
        return float(value), batch, pred

    la, batch_a, pred_a = loss(a)
    lb, batch_b, pred_b = loss(b)
    assert torch.equal(batch_a.row_mask, batch_b.row_mask)  # the loss reads the same rows
    assert lb == pytest.approx(la, rel=1e-6)

    def tokens(path, batch, pred):
        figs = DitFigures(stats_a.mu, SetMeans.of([path], 8), 2, (1, 2))
        figs.update(batch, pred)
        return figs.result()["sets"]["tokens"]["all"]

    fa, fb = tokens(full_path, batch_a, pred_a), tokens(part_path, batch_b, pred_b)
    assert fa["rows"] == fb["rows"] > 0
    for k in ("centred_cos", "rel_mse", "cos"):
        assert fb[k] == pytest.approx(fa[k], rel=1e-6)


def test_ovis_with_pads_as_one_stores_real_rows_from_the_start_and_k_pads(tmp_path):
    from gguf_trainer.data.recipe import kept_pad_rows

    pack = get_pack(OVIS)
    _, t = _shard(tmp_path, pack, "ovis", pad_rows=32, from_start=True, n_reals=(9, 40))
    want = []
    for ids_len, n_real in zip(t["student_len"].tolist(), (9, 40)):
        want += list(range(START, n_real)) + kept_pad_rows(n_real, ids_len, 32)
    assert t["target_pos"].tolist() == want
    assert int(t["target_len"].sum()) == len(want)


def test_the_linear_start_reads_the_rows_from_the_start_row(tmp_path):
    pack = get_pack(KREA2)
    m = torch.randn(IN, 2 * WIDTH, generator=torch.Generator().manual_seed(7))

    class Linear(_Teacher):
        def targets(self, samples, ids, vis):
            return [TargetRows(rows=_Student().hidden(torch.tensor(row), None) @ m,
                               sup_start=START) for row in ids]

    ctx = _ctx(pack)
    ctx.teacher = Linear(pack)
    samples = _samples(pack, n_reals=(9, 30, 41, 57, 70))
    path = tmp_path / "lin.safetensors"
    write_shard(path, build_shard(ctx, samples, _Report(), lambda f: None,
                                  [len(s.ids) for s in samples], 0, True), {"fingerprint": "f"})
    weight, _bias = linear_fit([path])
    assert torch.allclose(weight, m.T, atol=0.05)


def test_fingerprint_status_and_disk_name_the_rows_from_the_start_row(tmp_path, monkeypatch):
    for name in ("student_identity", "teacher_identity", "tokenizer_identity"):
        monkeypatch.setattr(precompute, name, lambda *a, **k: "x")
    monkeypatch.setattr(precompute, "project_vision_sha", lambda *a: None)
    monkeypatch.setattr(precompute, "shard_size", lambda *a: 4)

    def inputs(project):
        project.settings.precompute = SimpleNamespace(mock_teacher=False, student_dtype="auto")
        return precompute.PRECOMPUTE_TRAIN.inputs(project, {"corpus": "c"}, None)

    assert inputs(_project(KREA2, tmp_path))["stored_rows"] == "from the start row"
    assert inputs(_project(OVIS, tmp_path, pad_weight="one"))["stored_rows"] == (
        "from the start row, 32 pad rows per sample")
    assert "stored_rows" not in inputs(_project(KREA2, tmp_path, prefix_rows="in"))

    from gguf_trainer.store.results import shards_recompute_note

    folder = tmp_path / "shards" / "val"
    folder.mkdir(parents=True)
    write_shard(folder / "val-00000.safetensors", {"x": torch.zeros(1)}, {"fingerprint": "f"})
    project = _project(KREA2, tmp_path)
    project.paths = SimpleNamespace(shard_dir=lambda split: tmp_path / "shards" / split)
    assert shards_recompute_note(project) == (
        "the shards hold every target row but the recipe (train.pad_weight row, "
        "train.prefix_rows out, train.stats_rows loss) stores the target rows from the start "
        "row on: the next start recomputes them (and trains again)")

    krea2, lingbot = get_pack(KREA2), get_pack(LINGBOT)
    assert krea2.shard_bytes(0, True) < krea2.bytes_per_sample * 0.7  # 94 rows -> 60 targets
    assert lingbot.shard_bytes(0, True) < lingbot.bytes_per_sample * 0.6  # 210 -> 70
    assert get_pack(FLUX3).shard_bytes(1, True) == get_pack(FLUX3).shard_bytes(1)  # start 0
    assert disk_space.shard_bytes_per_sample(_project(KREA2, None)) == krea2.shard_bytes(0, True)
    assert disk_space.shard_bytes_per_sample(
        _project(KREA2, None, prefix_rows="in")) == krea2.bytes_per_sample
