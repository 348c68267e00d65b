"""`gguf-trainer demo --pack qwen35_bridge`: a tiny REAL Qwen3.5 teacher (transformers `qwen3_5`,
hybrid Gated-DeltaNet + full attention, the full 248320-row vocabulary; tiny/qwen35.py) in a
subprocess, like a user runs it. The shards hold one target row per Qwen3.5 template token with
the engine's slot ids (the pack's, on the teacher's own tokenizer.json), the adapter beats the
mean baseline, and the export is a qwen35_bridge file `inspect --json` reports with no problem,
carrying the teacher's vocabulary, whose forward (tests/engine_reference.py, its own reader)
equals load_gguf's to 1e-5 on the shards' student states. The printed command is MOSS-Image's."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from engine_reference import slot_forward
from pipeline_helpers import cli_at_home, run_demo

from gguf_trainer.data.shards import Shard, shard_files
from gguf_trainer.model.adapters import load_gguf

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return run_demo(tmp_path_factory.mktemp("qwen35"), "qwen35_bridge", steps=20, timeout=2400)


def _adapter(proj):
    return next(proj.paths.root.glob("output/*.gguf"))


def test_demo_trains_and_prints_the_moss_command(demo):
    proj = demo["project"]
    assert proj.settings.precompute.mock_teacher is False
    ev = json.loads(proj.paths.eval_json.read_text())
    print(f"demo --pack qwen35_bridge --steps 20: val cos {ev['val_cos']:.4f} vs mean baseline "
          f"{ev['baseline']['baseline_cos']:.4f}")
    assert ev["val_cos"] > ev["baseline"]["baseline_cos"]
    assert "--llm-adapter" in demo["stdout"] and "--cfg-scale 7" in demo["stdout"]
    assert "moss-image DiT" in demo["stdout"]


def test_shards_hold_the_engines_slot_ids_and_one_row_each(demo):
    proj = demo["project"]
    pack = proj.pack
    files = shard_files(proj.paths.shard_dir("val"))
    shard = Shard(files[0])
    texts = [json.loads(line)["text"] for line in
             proj.paths.samples("val").read_text().splitlines() if line.strip()]
    seeds = shard.t["seed_ids"]
    assert seeds.shape[1] == pack.num_queries
    for i in range(min(shard.n, 8)):
        ids = [int(x) for x in seeds[i] if x >= 0]
        text = texts[int(shard.t["sample_index"][i])]
        assert ids == pack.slot_ids_for_text(text)
        assert shard.target(i).shape[0] == len(ids)  # one 64-wide row per template token


def test_export_is_a_bridge_the_engine_reads(demo):
    proj = demo["project"]
    path = _adapter(proj)
    out = cli_at_home("inspect", "--json", path, home=demo["home"])
    report = json.loads(out.stdout)
    assert out.returncode == 0 and report["kind"] == "qwen35_bridge" and report["problems"] == []
    assert report["slots"]["vocabulary"] == 248320 and report["slots"]["tokenizer_pre"] == "qwen35"
    model = load_gguf(path)
    assert model.metadata["adapter.pack"] == "qwen35_bridge"
    shard = Shard(shard_files(proj.paths.shard_dir("val"))[0])
    for i in range(3):
        hidden = shard.student(i).float()
        ids = [int(x) for x in shard.t["seed_ids"][i] if x >= 0]
        with torch.no_grad():
            got = model(hidden[None], seed_ids=torch.tensor([ids]))[0].double().numpy()
        want = slot_forward(str(path), hidden.numpy(), np.array(ids))
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_demo_trains_the_flux3_bank_beyond_its_mean(demo):
    """The demo sets train.bank_slots 80: the tiny real Qwen3-VL's 8-tap rows of the FLUX.3
    template are in the shards, the bank beats its mean baseline, the export carries it."""
    proj = demo["project"]
    shard = Shard(shard_files(proj.paths.shard_dir("train"))[0])
    assert int(shard.t["bank_slots"][0]) == 80 and shard.t["bank_rows"].shape[1] % 8 == 0
    rows = [json.loads(x) for x in proj.paths.metrics_jsonl.read_text().splitlines()]
    last = [r for r in rows if "val_bank_cos" in r][-1]
    print(f"demo bank: val cos {last['val_bank_cos']:.4f} vs mean baseline "
          f"{last['val_bank_baseline_cos']:.4f}")
    assert last["val_bank_cos"] > last["val_bank_baseline_cos"]
    model = load_gguf(_adapter(proj))
    cfg = model.config
    assert (cfg.n_bank, cfg.bank_align) == (80, True)
    assert cfg.bank_dim == shard.t["bank_rows"].shape[1]


def test_new_project_of_the_pack(tmp_path):
    out = cli_at_home("new", "--pack", "qwen35_bridge", tmp_path / "p", home=tmp_path / "home")
    assert out.returncode == 0, out.stdout + out.stderr
    settings = json.loads((tmp_path / "p" / "project.json").read_text())
    assert settings["pack"] == "qwen35_bridge" and settings["train"]["seed_rank"] == 384
