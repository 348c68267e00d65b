"""`gguf-trainer demo --pack ID` for the token-aligned Qwen packs that take reference images
(Boogu Image and Qwen Image 2.1 edits, LingBot Video I2V images) train against a tiny REAL
Qwen3-VL with its vision tower (transformers, random weights; Qwen Image 2.1's with deepstack and
M-RoPE image positions) on the demo's synthetic images, in a subprocess as a user
runs it. The images reach the teacher by the family's size rule and splice rows, the student
through the fitted vision_proj; the export is token_aligned_vision, and the engine's forward of it
(tests/engine_reference.py, its own reader and math) equals load_gguf's to 1e-5 on a val edit
sample (images spliced, raw rows for vis_in), with vis_in in use. `gguf-trainer new --pack ID`
creates each project."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from engine_reference import engine_forward
from pipeline_helpers import cli_at_home, run_demo

from gguf_trainer.data.shards import Shard, shard_files
from gguf_trainer.model.adapters import load_gguf
from gguf_trainer.model.vision import image_runs

pytestmark = pytest.mark.slow

PACKS = ("qwen3vl_boogu", "qwen3vl_lingbot", "qwen3vl_qwen_image_2_1")


@pytest.fixture(scope="module", params=PACKS)
def demo(request, tmp_path_factory):
    out = run_demo(tmp_path_factory.mktemp(request.param), request.param, timeout=1500)
    out["pack"] = request.param
    return out


def test_demo_trains_on_edits_and_beats_the_mean(demo):
    proj = demo["project"]
    assert proj.settings.pack == demo["pack"] and proj.settings.precompute.mock_teacher is False
    ev = json.loads(proj.paths.eval_json.read_text())
    base = ev["baseline"]["baseline_cos"]
    print(f"demo --pack {demo['pack']} (tiny real Qwen3-VL, images): val cos "
          f"{ev['val_cos']:.4f} vs mean baseline {base:.4f}; "
          f"cos_slice {ev['metrics'].get('cos_slice')} vs "
          f"{ev['baseline'].get('baseline_cos_slice')}; cos_vis {ev['metrics'].get('cos_vis')}; "
          f"rows {ev['metrics']['rows']}")
    assert ev["mock"] is False and ev["val_cos"] > base
    if proj.pack.dit_reads_vision_rows:
        assert ev["metrics"].get("cos_vis") is not None  # edit samples reached eval
    else:  # Qwen Image 2.1: the DiT never reads the image slots, so no figure judges them
        assert "cos_vis" not in ev["metrics"]
    assert ev["health"].startswith("n/a")
    assert "--llm-adapter" in demo["stdout"]
    # the image packs' commands edit; ggk's video path hands LingBot's text encoder no reference
    # images (its note says where they do reach it)
    assert ("--ref-image pig.png" in demo["stdout"]) == (demo["pack"] != "qwen3vl_lingbot")


def _val_edit_sample(proj):
    for f in shard_files(proj.paths.shard_dir("val")):
        shard = Shard(f)
        for i, n in enumerate(shard.t["vis_len"].tolist()):
            if n:
                rows, pos = shard.vision(i)
                return shard, i, rows.float(), pos.long()
    raise AssertionError("no val sample with images")


def test_the_export_is_vision_and_the_engine_runs_it_as_load_gguf_does(demo):
    proj = demo["project"]
    out = cli_at_home("inspect", "--json", proj.final_gguf, home=demo["home"], timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    g = report["geometry"]  # the engine's kind is token_aligned, with the vision extension
    assert report["trainer_kind"] == "token_aligned_vision" and report["problems"] == []
    assert g["has_vision_proj"] and g["has_vis_in"] and g["vis_dim"] == g["out_dim"] == 64
    adapter = load_gguf(proj.final_gguf)
    assert adapter.config.kind == "token_aligned_vision" and adapter.config.vis_dim == 64
    shard, i, rows, pos = _val_edit_sample(proj)
    ids = shard.t["student_ids"][shard.s_off[i]: shard.s_off[i + 1]].tolist()
    runs = image_runs(ids, proj.pack.image_pad_id)
    assert [p for s, n in runs for p in range(s, s + n)] == pos.tolist()
    hidden = shard.student(i).float()  # the spliced student states, as the engine builds them
    vis = torch.zeros(hidden.shape[0], rows.shape[1])
    vis[pos] = rows
    ref = engine_forward(str(proj.final_gguf), hidden.numpy(), vis=vis.numpy())
    with torch.no_grad():
        got = adapter(hidden[None], vis=vis[None])[0].double().numpy()
    rel = float(np.abs(got - ref).max() / np.abs(ref).max())
    print(f"{demo['pack']}: engine vs load_gguf rel {rel:.2e} on an edit sample ({len(ids)} rows, "
          f"{rows.shape[0]} vision rows)")
    assert rel <= 1e-5
    blind = engine_forward(str(proj.final_gguf), hidden.numpy(), vis=None)
    # vis_in is used: the rows the DiT reads change without the raw vision input (the image
    # rows, or where the DiT replaces those (Qwen Image 2.1) the text rows attending to them)
    read = (pos.tolist() if proj.pack.dit_reads_vision_rows
            else [r for r in range(len(ids)) if r not in set(pos.tolist())])
    assert np.abs(blind[read] - ref[read]).max() > 1e-3 * np.abs(ref).max()


def test_new_creates_a_project_of_the_pack(demo, tmp_path):
    out = cli_at_home("new", tmp_path / "p", "--pack", demo["pack"], home=demo["home"], timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    settings = json.loads((tmp_path / "p" / "project.json").read_text())
    assert settings["pack"] == demo["pack"]
