"""Ming-Image with reference images (edits), mock teacher (the tiny Ming text encoder with the
tiny Qwen2.5-VL tower + linear_proj, tiny/ming.py), in process: the corpus keeps the samples'
images (the MageFlow demo corpus), precompute stores the FIRST reference's tower rows at its
`<imagePatch>` run of the Ling template (the engine shows Ming's text encoder one reference,
conditioner.hpp 4059-4062) and the thinker reads them there, training reads them (cos_vis over
those slots' rows, vis_in and vis_q trained), and the exported file's forward in the engine's
layout (vis + vis_slot) is its forward in training's (vis + vis_at)."""

from __future__ import annotations

import json

import pytest
import torch
from pipeline_helpers import make_project, run_pipeline

from gguf_trainer.data.shards import Shard, collate, shard_files
from gguf_trainer.engine.ling_bpe import IMAGE_END, IMAGE_PATCH, IMAGE_START
from gguf_trainer.model.adapters import AdapterConfig, build_adapter, load_gguf
from gguf_trainer.store.project import load_project
from gguf_trainer.tiny.mageflow_demo import write_demo_corpus
from gguf_trainer.tiny.prompts import demo_prompts

pytestmark = pytest.mark.slow

SETTINGS = {"corpus.n_train": 32, "corpus.n_val": 8, "train.seed_rank": 16, "train.steps": 20,
            "train.val_every": 10, "train.lr": 3e-3, "train.warmup": 3}


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_materials):
    tmp = tmp_path_factory.mktemp("ming_refs")
    corpus = write_demo_corpus(tmp / "materials", demo_prompts(24))
    root = tmp / "proj"
    make_project(root, "ming_image", {**tiny_materials, "prompts": corpus}, **SETTINGS)
    assert run_pipeline(root) == "done"
    return load_project(root)


def test_shards_hold_the_first_reference_on_its_image_patch_run(run):
    n_images = 0
    for path in shard_files(run.paths.shard_dir("train")):
        shard = Shard(path)
        for i in range(shard.n):
            rows, pos = shard.vision(i)
            seed = shard.t["seed_ids"][i].tolist()
            n_slots = sum(1 for x in seed if x >= 0)
            assert int(shard.t["target_len"][i]) == 256 + n_slots  # caption rows, then slots
            if not rows.shape[0]:
                assert IMAGE_PATCH not in seed
                continue
            n_images += 1
            a, n = int(pos[0]), rows.shape[0]
            assert pos.tolist() == list(range(a, a + n))  # one reference, one run
            assert seed[a - 1] == IMAGE_START and seed[a : a + n] == [IMAGE_PATCH] * n
            assert seed[a + n] == IMAGE_END and seed.count(IMAGE_PATCH) == n
            assert torch.allclose(rows.float().norm(dim=1), torch.ones(n), atol=2e-2)  # L2 rows
    assert n_images > 5


def test_training_reads_the_reference(run):
    ev = json.loads(run.paths.eval_json.read_text())
    m = ev["metrics"]
    assert {"cos_vis", "cos_txt"} <= set(m)
    print(f"eval: cos {m['cos']:.4f}, cos_vis {m['cos_vis']:.4f}, cos_txt {m['cos_txt']:.4f}")
    ck = torch.load(run.paths.checkpoints / "best.pt", weights_only=False)
    cfg = AdapterConfig.from_dict(ck["config"])
    torch.manual_seed(run.settings.train.seed)
    init = build_adapter(cfg).state_dict()
    for name in ("vis_in.weight", "vis_q.weight"):
        moved = float((ck["model"][name] - init[name]).abs().max())
        assert moved > 1e-3, f"{name} did not train (max change {moved})"


def test_export_reads_the_reference_in_the_engines_layout(run):
    shard = Shard(shard_files(run.paths.shard_dir("val"))[0])
    i = next(k for k, n in enumerate(shard.t["vis_len"].tolist()) if n)
    batch = collate(shard, [i], 0)
    model = load_gguf(run.final_gguf)
    rows, pos = shard.vision(i)
    n_slots = int((batch.seed_ids >= 0).sum())
    vis_slot = torch.zeros(1, n_slots, rows.shape[1])
    vis_slot[0, pos.long()] = rows.float()
    with torch.no_grad():
        compact = model(batch.hidden, seed_ids=batch.seed_ids, **batch.vision_kwargs())
        engine = model(batch.hidden, seed_ids=batch.seed_ids, vis=rows.float()[None],
                       vis_slot=vis_slot)
        blind = model(batch.hidden, seed_ids=batch.seed_ids)
    rel = float((compact - engine).abs().max() / engine.abs().max())
    print(f"export: vis_at vs vis_slot layout rel {rel:.2e}")
    assert rel < 1e-5
    assert float((blind - engine).abs().max() / engine.abs().max()) > 1e-3
    assert batch.vis_mask[0, 256 + int(pos[0])] and not batch.vis_mask[0, int(pos[0])]
