"""MageFlow end to end with images (edits: the adapter reads vision rows the engine splices in
through vision_proj, so images must reach every stage): the image-aware mock teacher, sample
records with images, vision rows spliced into the student through the project's fitted
`vision_proj`, stored raw for `vis_in`, and an export the engine would run correctly.

One tiny pipeline run (module fixture), then one assertion family per test:
  * the GGUF's vision_proj is exactly the fitted map (f32), vis_in moved from its init;
  * eval.json reports cos_vis and cos_txt;
  * the shards' student states are the spliced ones (recomputed here with the real student);
  * the engine-faithful reference (tests/engine_reference.py) reproduces the adapter output
    with vision inputs, and the vision inputs change it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from engine_reference import engine_forward, vision_project
from pipeline_helpers import make_project, run_pipeline

from gguf_trainer.data.shards import Shard, shard_files
from gguf_trainer.model.adapter_file import read_adapter_arrays
from gguf_trainer.model.adapters import AdapterConfig, build_adapter, load_gguf
from gguf_trainer.model.vision import image_runs, load_vision_proj, read_inputs
from gguf_trainer.store.project import load_project
from gguf_trainer.tiny.mageflow_demo import write_demo_corpus
from gguf_trainer.tiny.prompts import demo_prompts

pytestmark = pytest.mark.slow

STEPS = 30


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_materials):
    tmp = tmp_path_factory.mktemp("mageflow")
    corpus = write_demo_corpus(tmp / "materials", demo_prompts(40))  # 40 text + 40 image samples
    root = tmp / "proj"
    make_project(root, "qwen3vl_mageflow", {**tiny_materials, "prompts": corpus},
                 **{"corpus.n_train": 48, "corpus.n_val": 16, "train.steps": STEPS,
                    "train.val_every": 10, "train.lr": 3e-3, "train.warmup": 3})
    assert run_pipeline(root) == "done"
    return load_project(root)


def test_export_ships_the_fitted_vision_proj_and_a_trained_vis_in(run):
    arrays = read_adapter_arrays(run.final_gguf)
    fitted = load_vision_proj(run.paths.vision_proj)
    assert read_inputs(run.paths.vision_proj)["method"].startswith("ridge")
    assert arrays["vision_proj.weight"].shape == tuple(fitted.shape)
    np.testing.assert_array_equal(arrays["vision_proj.weight"], fitted.numpy())  # f32, bit-exact
    ck = torch.load(run.paths.checkpoints / "best.pt", weights_only=True)
    cfg = AdapterConfig.from_dict(ck["config"])
    assert (cfg.in_dim, cfg.out_dim, cfg.vis_dim) == (64, 2560, 2560)  # from the shard headers
    torch.manual_seed(run.settings.train.seed)
    init = build_adapter(cfg).vis_in.weight.detach().numpy()
    moved = np.abs(arrays["vis_in.weight"] - init).max()
    assert moved > 1e-3, f"vis_in did not train (max change {moved})"


def test_eval_reports_the_vision_and_text_split(run):
    ev = json.loads(run.paths.eval_json.read_text())
    m = ev["metrics"]
    assert {"cos_vis", "cos_txt", "cos_slice"} <= set(m)
    assert all(-1.0 <= m[k] <= 1.0 for k in ("cos_vis", "cos_txt"))
    assert ev["roundtrip_cos"] > 0.999
    assert ev["beats_baseline"], ev


def _val_image_sample(run):
    shard = Shard(shard_files(run.paths.shard_dir("val"))[0])
    lens = shard.t["vis_len"].tolist()
    i = next(k for k, n in enumerate(lens) if n)
    rows, pos = shard.vision(i)
    return shard, i, rows.float(), pos.long()


def test_shard_student_states_have_the_images_spliced_in(run):
    from gguf_trainer.model.student import load_student, pad_batch

    shard, i, rows, pos = _val_image_sample(run)
    ids = shard.t["student_ids"][shard.s_off[i]: shard.s_off[i + 1]].tolist()
    runs = image_runs(ids, run.pack.image_pad_id)
    assert sum(n for _, n in runs) == rows.shape[0] and pos.tolist() == [
        p for s, n in runs for p in range(s, s + n)]
    student = load_student(run.material_path("student"), run.material_path("student_tokenizer"))
    w = load_vision_proj(run.paths.vision_proj)
    ids_t, keep = pad_batch([ids])
    splices, at = [], 0
    for s, n in runs:
        splices.append(
            (
                0,
                s,
                torch.from_numpy(
                    vision_project(
                        {"vision_proj.weight": w.double().numpy()}, rows[at : at + n].numpy()
                    )
                ).float(),
            )
        )
        at += n
    spliced = student.hidden(ids_t, keep, splices=splices)[0]
    plain = student.hidden(ids_t, keep)[0]
    stored = shard.student(i).float()
    assert torch.allclose(stored, spliced, atol=0.05, rtol=0.02)  # bf16 storage
    assert not torch.allclose(stored[pos], plain[pos], atol=0.05)  # the splice is what was stored


def test_engine_reference_reproduces_the_adapter_with_vision(run):
    shard, i, rows, pos = _val_image_sample(run)
    hidden = shard.student(i).float()
    vis = torch.zeros(hidden.shape[0], rows.shape[1])
    vis[pos] = rows
    ref = engine_forward(str(run.final_gguf), hidden.numpy(), vis=vis.numpy())
    module = load_gguf(run.final_gguf)
    with torch.no_grad():
        got = module(hidden[None], vis=vis[None])[0].double().numpy()
    scale = np.abs(ref).max()
    assert np.abs(got - ref).max() < 1e-4 * scale
    blind = engine_forward(str(run.final_gguf), hidden.numpy(), vis=None)
    assert np.abs(blind[pos.numpy()] - ref[pos.numpy()]).max() > 1e-3 * scale  # vis_in is used
