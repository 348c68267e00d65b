"""The Qwen3.5 bridge with reference images (MOSS-Image edits), mock teacher, in process: the
corpus keeps the samples' images (the MageFlow demo corpus: 40 text + 40 image samples, a few
with two), precompute stores each image's rows at its `<|image_pad|>` slots of the MOSS
template (vis_pos names teacher slots; the seed ids there are 248056), training reads them
(cos_vis / cos_txt over the slot rows, vis_in and vis_q trained), and the export's forward in
the engine's own layout (vis + vis_slot, conditioner.hpp 4401-4418) is the checkpoint's in
training's compact one (vis + vis_at). A run stopped mid-training resumes to the same file bit
for bit. A bridge project without references stores the text-only shard as before (no vision
tensor)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from pipeline_helpers import adapter_tensors, assert_same_tensors, make_project, run_pipeline

from gguf_trainer.data.shards import Shard, collate, shard_files
from gguf_trainer.model.adapters import AdapterConfig, build_adapter, load_gguf
from gguf_trainer.store.project import load_project
from gguf_trainer.tiny.mageflow_demo import write_demo_corpus
from gguf_trainer.tiny.prompts import demo_prompts

pytestmark = pytest.mark.slow

IMAGE_PAD_ID = 248056
SETTINGS = {"corpus.n_train": 48, "corpus.n_val": 16, "train.seed_rank": 16, "train.steps": 30,
            "train.val_every": 10, "train.lr": 3e-3, "train.warmup": 3}
TEXT_ONLY_KEYS = {"student_rows", "student_ids", "student_len", "target_rows", "target_len",
                  "sample_index", "moment_sum", "moment_sq", "moment_n", "seed_ids"}


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_materials):
    tmp = tmp_path_factory.mktemp("bridge_refs")
    corpus = write_demo_corpus(tmp / "materials", demo_prompts(40))
    root = tmp / "proj"
    make_project(root, "qwen35_bridge", {**tiny_materials, "prompts": corpus}, **SETTINGS)
    assert run_pipeline(root) == "done"
    return load_project(root)


def _image_sample(run, split="val"):
    shard = Shard(shard_files(run.paths.shard_dir(split))[0])
    i = next(k for k, n in enumerate(shard.t["vis_len"].tolist()) if n)
    return shard, i


def test_shards_hold_each_reference_at_its_image_pad_slots(run):
    from gguf_trainer.engine.qwen35_bpe import PREFIX, SUFFIX, EngineQwen35BPE
    from gguf_trainer.engine.qwen35_refs import image_slot_starts
    from gguf_trainer.tiny.qwen35 import qwen35_vocabulary

    bpe = EngineQwen35BPE(*qwen35_vocabulary())
    n_images = 0
    for path in shard_files(run.paths.shard_dir("train")):
        shard = Shard(path)
        assert shard.t["vis_rows"].shape[1] == 4096  # the mmproj's width (the mock's rows)
        for i in range(shard.n):
            rows, pos = shard.vision(i)
            seed = shard.t["seed_ids"][i]
            n_slots = int((seed >= 0).sum())
            assert int(shard.t["target_len"][i]) == n_slots  # one target row per slot
            if not rows.shape[0]:
                assert IMAGE_PAD_ID not in seed.tolist()
                continue
            n_images += 1
            assert seed[pos.long()].eq(IMAGE_PAD_ID).all()  # every row sits on a pad slot
            assert int(seed.eq(IMAGE_PAD_ID).sum()) == rows.shape[0]  # and every pad has one
            # the runs start where the engine counts them (conditioner.hpp 4336-4343)
            runs = np.split(pos.numpy(), np.where(np.diff(pos.numpy()) != 1)[0] + 1)
            counts = [len(r) for r in runs]
            ids = seed[:n_slots].tolist()
            assert [int(r[0]) for r in runs] == image_slot_starts(bpe.encode, counts)
            tail = bpe.encode(SUFFIX)  # the template's tail, after the prompt's text
            assert ids[-len(tail):] == tail and ids[:3] == bpe.encode(PREFIX)
    assert n_images > 10


def test_training_reads_the_references(run):
    ev = json.loads(run.paths.eval_json.read_text())
    m = ev["metrics"]
    assert {"cos_vis", "cos_txt"} <= set(m)  # the slot rows under the pictures and the rest
    print(f"eval: cos {m['cos']:.4f}, cos_vis {m['cos_vis']:.4f}, cos_txt {m['cos_txt']:.4f}, "
          f"baseline {ev.get('baseline_cos')}")
    assert ev["roundtrip_cos"] > 0.999
    ck = torch.load(run.paths.checkpoints / "best.pt", weights_only=False)
    cfg = AdapterConfig.from_dict(ck["config"])
    assert cfg.vis_dim == 4096  # from the shards' header
    torch.manual_seed(run.settings.train.seed)
    init = build_adapter(cfg)
    for name in ("vis_in.weight", "vis_q.weight"):
        moved = float((ck["model"][name] - init.state_dict()[name]).abs().max())
        assert moved > 1e-3, f"{name} did not train (max change {moved})"


def test_export_in_the_engines_layout_is_the_checkpoints(run):
    """load_gguf's forward fed as the engine feeds it (vis [V, vis_dim], vis_slot [P, vis_dim]
    zeros off the image slots) equals the checkpoint's forward on the shard's batch (vis_at),
    un-whitened; and the pictures change it."""
    shard, i = _image_sample(run)
    batch = collate(shard, [i], 0)
    assert batch.vis_at is not None and int(batch.vis_at.sum()) == batch.vis.shape[1]
    ck = torch.load(run.paths.checkpoints / "last.pt", weights_only=False)
    raw = build_adapter(AdapterConfig.from_dict(ck["config"]))
    raw.load_state_dict(ck["model"])
    model = load_gguf(run.final_gguf)
    rows, pos = shard.vision(i)
    n_slots = int((batch.seed_ids >= 0).sum())
    vis_slot = torch.zeros(1, n_slots, rows.shape[1])
    vis_slot[0, pos.long()] = rows.float()
    with torch.no_grad():
        want = raw(batch.hidden, mask=batch.mask, seed_ids=batch.seed_ids,
                   **batch.vision_kwargs()) * ck["sigma_f"] + ck["mu"]
        got = model(batch.hidden, seed_ids=batch.seed_ids, vis=rows.float()[None],
                    vis_slot=vis_slot)
        blind = model(batch.hidden, seed_ids=batch.seed_ids)
    rel = float((got - want).norm() / want.norm())
    print(f"export (engine layout) vs checkpoint (vis_at): rel {rel:.2e}")
    assert rel < 5e-3  # f16 weights
    assert float((blind - got).norm() / got.norm()) > 10 * rel


def test_a_stopped_run_with_references_resumes_bit_identically(run, tmp_path, tiny_materials):
    corpus = write_demo_corpus(tmp_path / "materials", demo_prompts(40))
    root = tmp_path / "p"
    make_project(root, "qwen35_bridge", {**tiny_materials, "prompts": corpus}, **SETTINGS)
    stop = lambda step, row, r: step == 14 and "loss" in row and r.request_stop()
    assert run_pipeline(root, on_metrics=stop) == "stopped"
    assert run_pipeline(root) == "done"
    assert_same_tensors(adapter_tensors(load_project(root).final_gguf),
                        adapter_tensors(run.final_gguf))


def test_a_bridge_without_references_stores_the_text_only_shard(tmp_path, tiny_materials):
    root = tmp_path / "p"
    make_project(root, "qwen35_bridge", tiny_materials, **{**SETTINGS, "train.steps": 2})
    assert run_pipeline(root, only=["corpus", "precompute_val", "precompute_train"]) == "done"
    for path in shard_files(load_project(root).paths.shard_dir("train")):
        assert set(Shard(path).t) == TEXT_ONLY_KEYS
