"""Shards store only what training reads: a `train.pad_weight` "one" recipe stores K evenly spaced
pad rows per sample (data/recipe.py stored_pad_rows, the pack's `pad_rows_stored`), FLUX.3's one
pad row is exact (its pads are one row repeated), every other recipe — a project from before the
recipe keys among them — stores every row as before, the precompute fingerprint and `status`
name the change, and the disk pre-flight follows the stored rows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gguf_trainer.data.dit_rows import DitFigures, SetMeans
from gguf_trainer.data.recipe import (
    Recipe,
    RowFit,
    kept_pad_rows,
    legacy_recipe,
    recipe_stats,
    stored_pad_rows,
)
from gguf_trainer.data.shards import Shard, collate, dims, write_shard
from gguf_trainer.engine.qwen_ids import PAD_ID
from gguf_trainer.machine import disk_space
from gguf_trainer.packs import get_pack
from gguf_trainer.stages import precompute
from gguf_trainer.stages.precompute_shard import _Sample, build_shard
from gguf_trainer.stages.train import compute_loss
from gguf_trainer.store.project_schema import TrainSettings
from gguf_trainer.teachers.base import TargetRows

IN, WIDTH = 8, 4
FLUX3, SEFI, ZIMAGE = "qwen3vl_flux3", "qwen3vl_sefi", "qwen3_zimage"


def recipe_of(pack, **over) -> Recipe:
    train = {k.split(".", 1)[1]: v for k, v in pack.all_defaults.items()
             if k.startswith("train.")}
    return Recipe.from_settings(TrainSettings(**{**train, **over}), pack)


# ---------------------------------------------------------------- which rows


def test_kept_pads_are_the_midpoints_of_k_equal_runs():
    assert kept_pad_rows(10, 110, 4) == [22, 47, 72, 97]
    assert kept_pad_rows(10, 110, 1) == [60]
    assert kept_pad_rows(10, 13, 32) == [10, 11, 12]  # fewer pads than K: all of them
    assert kept_pad_rows(10, 10, 1) == []


def test_only_a_recipe_weighing_pads_as_one_row_stores_fewer():
    flux3, sefi, zimage = get_pack(FLUX3), get_pack(SEFI), get_pack(ZIMAGE)
    assert flux3.pad_rows_stored == 1  # every pad at rope position 1: one row repeated
    assert sefi.pad_rows_stored == 32  # pads at their own positions differ by position
    assert stored_pad_rows(recipe_of(flux3), flux3) == 1  # FLUX.3's shipped recipe
    assert stored_pad_rows(recipe_of(sefi, pad_weight="one"), sefi) == 32
    assert stored_pad_rows(recipe_of(sefi, pad_weight="row"), sefi) == 0
    assert stored_pad_rows(legacy_recipe(flux3, 0.03), flux3) == 0  # a project from before
    assert stored_pad_rows(recipe_of(zimage, pad_weight="one"), zimage) == 0  # no pads


# ---------------------------------------------------------------- build_shard


class _Student:
    tokenizer = None

    def hidden(self, ids, keep, splices=(), position_ids=None):
        return torch.sin(ids[..., None].float() * torch.arange(1, IN + 1) / 7.0)


class _Teacher:
    """FLUX.3's pads: every pad row the same (one rope position, pad keys masked)."""

    def __init__(self, pack):
        self.pack = pack

    def targets(self, samples, ids, vis):
        out = []
        for row in ids:
            n = self.pack.padding.real_length(row)
            g = torch.Generator().manual_seed(len(row) * 131 + n)
            rows = torch.randn(len(row), 2 * WIDTH, generator=g) + 2.0
            rows[n:] = torch.linspace(-3.0, 3.0, 2 * WIDTH) + 0.1 * n  # the one pad row
            out.append(TargetRows(rows=rows, sup_start=0))
        return out


def _ctx(pack):
    budgets = SimpleNamespace(student_batch=8, student_tok_budget=10_000, teacher_batch=8,
                              tok_budget=10_000)
    return SimpleNamespace(pack=pack, teacher=_Teacher(pack), student=_Student(),
                           budgets=budgets, vision_proj=None, device=torch.device("cpu"))


class _Report:
    def stop_requested(self):
        return False


def _samples(pack, n_reals=(5, 23, 81)):
    out = []
    for k, n in enumerate(n_reals):
        ids = pack.padding.apply([100 + k] * 3 + [200 + j for j in range(n - 3)])
        out.append(_Sample(k, None, ids, []))
    return out


def _shard(tmp_path, pack, pad_rows, name):
    samples = _samples(pack)
    tensors = build_shard(_ctx(pack), samples, _Report(), lambda f: None,
                          [len(s.ids) for s in samples], pad_rows)
    path = tmp_path / f"{name}.safetensors"
    write_shard(path, tensors, {"fingerprint": "f"})
    return path, tensors


def test_every_row_is_stored_as_before_without_k(tmp_path):
    pack = get_pack(FLUX3)
    _, t = _shard(tmp_path, pack, 0, "all")
    assert "target_pos" not in t
    assert torch.equal(t["target_len"], t["student_len"])
    assert [n % 80 for n in t["student_len"].tolist()] == [0, 0, 0]


def test_flux3_stores_one_pad_row_and_trains_and_scores_as_on_every_pad(tmp_path):
    """K=1 is exact where the pads are one row repeated: the recipe's loss, its statistics and
    eval's pads figure read the same from the sparse shard as from the full one."""
    pack = get_pack(FLUX3)
    full_path, full = _shard(tmp_path, pack, 0, "full")
    part_path, part = _shard(tmp_path, pack, 1, "part")
    assert part["target_len"].tolist() == [6, 24, 82]  # real rows + one pad each
    assert part["target_rows"].shape[0] < full["target_rows"].shape[0] / 2
    assert dims(part_path) == dims(full_path)
    a, b = Shard(full_path), Shard(part_path)
    for i in range(a.n):
        keep = b.target_keep(i)
        assert keep.shape == a.target_keep(i).shape
        assert int((~keep).sum()) == int(a.target(i).shape[0]) - int(part["target_len"][i])
        assert torch.equal(b.target(i)[keep], a.target(i)[keep])

    recipe = recipe_of(pack)
    stats_a, scales_a = recipe_stats([full_path], recipe, 2)
    stats_b, _ = recipe_stats([part_path], recipe, 2)
    assert torch.allclose(stats_a.mu, stats_b.mu, atol=1e-5)
    assert torch.allclose(stats_a.sigma_f, stats_b.sigma_f, atol=1e-5)

    def loss(shard):
        batch = collate(shard, [0, 1, 2], 0)
        g = torch.Generator().manual_seed(5)
        # a prediction that is the same on every pad row of a sample, as the adapter's is for
        # FLUX.3's identical pad inputs
        pred = torch.randn(batch.target.shape, generator=g)
        for j, n in enumerate(batch.n_real.tolist()):
            pred[j, n:] = pred[j, n]
        fit = RowFit.for_batch(batch, recipe, scales_a, 2)
        value, _ = compute_loss(pred[batch.row_mask], batch, stats_a, recipe.standardized, 0.5,
                                fit)
        return float(value), batch, pred

    la, batch_a, pred_a = loss(a)
    lb, batch_b, pred_b = loss(b)
    assert lb == pytest.approx(la, rel=1e-5)

    def pads_figure(shard_path, batch, pred):
        means = SetMeans.of([shard_path], 8)
        figs = DitFigures(stats_a.mu, means, 2, (1, 2))
        figs.update(batch, pred)
        return figs.result()["sets"]["pads"]["all"]

    fa, fb = pads_figure(full_path, batch_a, pred_a), pads_figure(part_path, batch_b, pred_b)
    assert fb["rows"] == 3 and fa["rows"] > 3
    assert fb["rel_mse"] == pytest.approx(fa["rel_mse"], rel=1e-5)
    assert fb["cos"] == pytest.approx(fa["cos"], rel=1e-5)


# ---------------------------------------------------------------- fingerprint, status, disk


def _project(pack_id, tmp_path, **train):
    pack = get_pack(pack_id)
    values = {k.split(".", 1)[1]: v for k, v in pack.all_defaults.items()
              if k.startswith("train.")}
    settings = SimpleNamespace(train=TrainSettings(**{**values, **train}))
    return SimpleNamespace(pack=pack, settings=settings)


def test_the_fingerprint_names_the_stored_rows_only_when_fewer(tmp_path, monkeypatch):
    for name in ("student_identity", "teacher_identity", "tokenizer_identity"):
        monkeypatch.setattr(precompute, name, lambda *a, **k: "x")
    monkeypatch.setattr(precompute, "project_vision_sha", lambda *a: None)
    monkeypatch.setattr(precompute, "shard_size", lambda *a: 4)
    stage = precompute.PRECOMPUTE_TRAIN

    def inputs(project):
        project.settings.precompute = SimpleNamespace(mock_teacher=False, student_dtype="auto")
        return stage.inputs(project, {"corpus": "c"}, None)

    assert inputs(_project(FLUX3, tmp_path))["stored_rows"] == "1 pad row per sample"
    assert "stored_rows" not in inputs(_project(FLUX3, tmp_path, pad_weight="row"))
    legacy = _project(FLUX3, tmp_path, target_space="pack", cosine="row",
                      sigma_floor_mode="absolute", pad_weight="row", prefix_rows="in",
                      stats_rows="all", sink="none")
    assert "stored_rows" not in inputs(legacy)  # an old project keeps its fingerprint
    assert inputs(_project(SEFI, tmp_path, pad_weight="one"))["stored_rows"] == (
        "32 pad rows per sample")


def test_status_says_why_the_shards_are_recomputed(tmp_path):
    from gguf_trainer.store.results import shards_recompute_note

    folder = tmp_path / "shards" / "val"
    folder.mkdir(parents=True)
    write_shard(folder / "val-00000.safetensors", {"x": torch.zeros(1)}, {"fingerprint": "f"})
    project = _project(FLUX3, tmp_path)
    project.paths = SimpleNamespace(shard_dir=lambda split: tmp_path / "shards" / split)
    note = shards_recompute_note(project)
    assert note == ("the shards hold every target row but the recipe (train.pad_weight one, "
                    "train.prefix_rows out, train.stats_rows loss) stores the real rows and 1 pad "
                    "row per sample: the next start recomputes them (and trains again)")
    project.settings.train = project.settings.train.model_copy(update={"pad_weight": "row"})
    assert shards_recompute_note(project) is None


def test_the_disk_pre_flight_follows_the_stored_rows():
    sefi, flux3, zimage = get_pack(SEFI), get_pack(FLUX3), get_pack(ZIMAGE)
    assert sefi.shard_bytes(0) == sefi.bytes_per_sample
    assert sefi.shard_bytes(32) < sefi.bytes_per_sample / 4  # 1,024 target rows -> 70 + 32
    assert flux3.shard_bytes(1) < flux3.bytes_per_sample
    assert zimage.shard_bytes(1) == zimage.bytes_per_sample  # no pads: nothing to drop

    def per_sample(pack_id, **train):
        return disk_space.shard_bytes_per_sample(_project(pack_id, None, **train))

    assert per_sample(SEFI) == sefi.bytes_per_sample  # SeFi's shipped recipe: a row each
    assert per_sample(SEFI, pad_weight="one") == sefi.shard_bytes(32)
    assert per_sample(FLUX3) == flux3.shard_bytes(1)


def test_old_shards_read_as_every_row(tmp_path):
    """A shard without target_pos (every shard before) is read exactly as before."""
    pack = get_pack(FLUX3)
    path, t = _shard(tmp_path, pack, 0, "old")
    s = Shard(path)
    assert s.pos is None and not s.selects_rows
    assert torch.equal(s.target(1), t["target_rows"][int(t["target_len"][0]):][
        : int(t["target_len"][1])])
    assert PAD_ID in t["student_ids"].tolist()


def test_the_linear_start_pairs_each_stored_row_with_its_students_state(tmp_path):
    """linear_fit (the ridge start of a token-aligned skip) reads a sparse shard's stored rows
    beside the student states of their template rows: a teacher linear in the student's states
    is recovered."""
    from gguf_trainer.data.shards import linear_fit

    pack = get_pack(FLUX3)
    m = torch.randn(IN, 2 * WIDTH, generator=torch.Generator().manual_seed(7))

    class Linear(_Teacher):
        def targets(self, samples, ids, vis):
            return [TargetRows(rows=_Student().hidden(torch.tensor(row), None) @ m, sup_start=0)
                    for row in ids]

    ctx = _ctx(pack)
    ctx.teacher = Linear(pack)
    samples = _samples(pack, n_reals=(9, 30, 41, 57, 70))
    path = tmp_path / "lin.safetensors"
    write_shard(path, build_shard(ctx, samples, _Report(), lambda f: None,
                                  [len(s.ids) for s in samples], 1), {"fingerprint": "f"})
    weight, _bias = linear_fit([path])
    assert torch.allclose(weight, m.T, atol=0.05)
