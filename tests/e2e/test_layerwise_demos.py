"""`gguf-trainer demo --pack qwen3vl_fibo2`, the layerwise kind's demo (with edits), trains
against a tiny REAL teacher of its architecture (transformers Qwen3-VL, random weights, as deep
as its deepest tap) in a subprocess, like a user runs it; the other layerwise families are
checked in-process by test_families.py. The export is a layerwise file that `inspect`
reads with the family's tap count and names the family; the engine's forward of it
(tests/engine_reference.py, its own reader, the conditioner's stack check) equals load_gguf's to
1e-5 on the student's states of the family's padded template; eval.json has a figure per tap;
the shards hold one row per template id, pads included. `gguf-trainer new --pack ID` works.
Fibo 2.0's demo also edits (the synthetic pictures of the MageFlow demo in one- and two-image
samples): its pictures reach the teacher's full Qwen3-VL path and the student through the fitted
vision_proj, and its export is the only one with vision_proj + vis_in beside layer_map."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from engine_reference import conditioner_stack, engine_forward
from pipeline_helpers import cli_at_home, run_demo

from gguf_trainer.data.samples import Sample
from gguf_trainer.data.shards import Shard, load_verified, shard_files
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.model.adapters import load_gguf
from gguf_trainer.model.student import load_student
from gguf_trainer.model.vision import image_runs

pytestmark = pytest.mark.slow

PACKS = ("qwen3vl_fibo2",)  # the other five layerwise families: test_families.py
FAMILY = {"qwen3vl_fibo2": "Fibo 2.0"}


@pytest.fixture(scope="module", params=PACKS)
def demo(request, tmp_path_factory):
    out = run_demo(tmp_path_factory.mktemp(request.param), request.param, steps=20, timeout=1500)
    out["pack"] = request.param
    return out


def pack_pads(proj) -> bool:
    return bool(proj.pack.padding.pads)


def test_demo_trains_with_a_figure_per_tap(demo):
    proj = demo["project"]
    assert proj.settings.pack == demo["pack"] and proj.settings.precompute.mock_teacher is False
    ev = json.loads(proj.paths.eval_json.read_text())
    taps = list(proj.pack.taps)
    print(
        f"demo --pack {demo['pack']} --steps 20: val cos {ev['val_cos']:.4f} vs mean baseline "
        f"{ev['baseline']['baseline_cos']:.4f}; per tap {ev['per_tap']['cos']}"
    )
    assert ev["mock"] is False and ev["health"].startswith("n/a")
    assert ev["per_tap"]["taps"] == taps and len(ev["per_tap"]["cos"]) == len(taps)
    assert all(c is not None and -1 <= c <= 1 for c in ev["per_tap"]["cos"])
    # the lead: the token rows' centred cosine per tap, the pads apart where the family pads
    lead = ev["lead"]["sets"]
    assert lead["tokens"]["all"]["rows"] > 0 and len(lead["tokens"]["all"]["per_tap"]) == len(taps)
    assert ("pads" in lead) == pack_pads(proj)
    assert "--llm-adapter" in demo["stdout"]


def test_shards_hold_every_template_row_and_the_pads_training_reads(demo):
    """Every template row's student state; every target row, but where the recipe weighs a
    sample's pads as one row (FLUX.3's shipped recipe): its real rows and K evenly spaced pads
    (data/recipe.py stored_pad_rows), at their template rows (target_pos)."""
    from gguf_trainer.data.recipe import Recipe, kept_pad_rows, stored_pad_rows

    proj = demo["project"]
    pack = proj.pack
    shard = load_verified(shard_files(proj.paths.shard_dir("val"))[0])
    k = stored_pad_rows(Recipe.from_settings(proj.settings.train, pack), pack)
    assert k == (1 if pack.padding.multiple else 0)
    if k:
        at, pos = 0, shard["target_pos"].tolist()
        for i, (n_ids, n_rows) in enumerate(zip(shard["student_len"].tolist(),
                                               shard["target_len"].tolist())):
            ids = shard["student_ids"][sum(shard["student_len"][:i].tolist()):][:n_ids].tolist()
            n_real = pack.padding.real_length(ids)
            assert pos[at:at + n_rows] == list(range(n_real)) + kept_pad_rows(n_real, n_ids, k)
            at += n_rows
        assert len(pos) == shard["target_rows"].shape[0]
    else:
        assert torch.equal(shard["student_len"], shard["target_len"])
        assert "target_pos" not in shard
    assert shard["target_rows"].shape[1] == len(pack.taps) * 16  # the tiny teacher's width
    assert set(shard["sup_start"].tolist()) == {pack.start}
    for n in shard["student_len"].tolist():
        if pack.padding.min_length:
            assert n >= pack.padding.min_length
        if pack.padding.multiple:
            assert n % pack.padding.multiple == 0


def test_the_engine_runs_the_export_as_load_gguf_does(demo):
    proj = demo["project"]
    pack = proj.pack
    out = cli_at_home("inspect", "--json", proj.final_gguf, home=demo["home"], timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["trainer_kind"] == "layerwise" and report["problems"] == []
    assert report["taps"] == list(pack.taps) and FAMILY[demo["pack"]] in report["families"]
    assert report["geometry"]["n_out_layers"] == len(pack.taps)
    adapter = load_gguf(proj.final_gguf)
    student = load_student(proj.material_path("student"), proj.material_path("student_tokenizer"))
    encode = engine_bpe(student.tokenizer).encode
    for prompt in ["close-up portrait of a young lady", "a red fox in the snow, golden hour"]:
        ids = pack.student_ids(encode, Sample(prompt))
        n = pack.padding.real_length(ids)
        x = torch.tensor([ids])
        keep = (torch.arange(len(ids)) < n)[None]
        at = pack.padding.positions(ids)
        with torch.no_grad():
            hidden = student.hidden(
                x, keep, position_ids=None if at is None else torch.tensor([at])
            )
            got = adapter(hidden)[0].numpy()
        ref = conditioner_stack(proj.final_gguf, hidden[0].numpy(), set(pack.taps))
        rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        print(f"{demo['pack']}: engine vs load_gguf rel {rel:.2e} on {prompt!r} ({len(ids)} rows)")
        assert ref.shape == (len(ids), adapter.config.out_dim) and rel <= 1e-5


def _val_edit_sample(proj):
    for f in shard_files(proj.paths.shard_dir("val")):
        shard = Shard(f)
        for i, n in enumerate(shard.t["vis_len"].tolist()):
            if n:
                rows, pos = shard.vision(i)
                return shard, i, rows.float(), pos.long()
    raise AssertionError("no val sample with images")


def test_only_fibo2_exports_vision_and_the_engine_runs_its_edits_as_load_gguf(demo):
    """Fibo 2.0 (fibo2.hpp 217-221): layer_map + vision_proj + vis_in; a val edit sample's
    stored student states (vision_proj rows spliced) and raw vision rows (at the image runs)
    through the engine's forward equal load_gguf's, vis_in in use. Every other layerwise
    family's export is text-only."""
    proj = demo["project"]
    adapter = load_gguf(proj.final_gguf)
    names = set(adapter.state_dict())
    if demo["pack"] != "qwen3vl_fibo2":
        assert not proj.pack.vis_dim and not {"vision_proj.weight", "vis_in.weight"} & names
        return
    assert {"vision_proj.weight", "vis_in.weight", "layer_map"} <= names
    assert adapter.config.kind == "layerwise" and adapter.config.vis_dim == 16  # tiny merger
    shard, i, rows, pos = _val_edit_sample(proj)
    ids = shard.t["student_ids"][shard.s_off[i] : shard.s_off[i + 1]].tolist()
    assert [p for s, n in image_runs(ids, proj.pack.image_pad_id) for p in range(s, s + n)] == (
        pos.tolist()
    )
    hidden = shard.student(i).float()
    vis = torch.zeros(hidden.shape[0], rows.shape[1])
    vis[pos] = rows
    ref = engine_forward(str(proj.final_gguf), hidden.numpy(), vis=vis.numpy())
    with torch.no_grad():
        got = adapter(hidden[None], vis=vis[None])[0].double().numpy()
    rel = float(np.abs(got - ref).max() / np.abs(ref).max())
    print(f"qwen3vl_fibo2: engine vs load_gguf rel {rel:.2e} on an edit sample ({len(ids)} rows, "
          f"{rows.shape[0]} vision rows)")
    assert ref.shape == (len(ids), 15 * 16) and rel <= 1e-5
    blind = engine_forward(str(proj.final_gguf), hidden.numpy(), vis=None)
    assert np.abs(blind[pos.numpy()] - ref[pos.numpy()]).max() > 1e-3 * np.abs(ref).max()
    ev = json.loads(proj.paths.eval_json.read_text())
    assert ev["metrics"].get("cos_vis") is not None  # edit samples reached eval


def test_new_creates_a_project_of_the_pack(demo, tmp_path):
    out = cli_at_home("new", tmp_path / "p", "--pack", demo["pack"], home=demo["home"], timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    settings = json.loads((tmp_path / "p" / "project.json").read_text())
    assert settings["pack"] == demo["pack"]
