"""`gguf-trainer demo --pack ming_image`: a tiny REAL Ming-Image text encoder (teachers/ming.py's
Bailing MoE thinker + connector on small dimensions, the full 157184-row Ling table; tiny/ming.py)
in a subprocess, like a user runs it. The shards hold the engine's Ling slot ids (the pack's, on
the teacher's own tokenizer.json) and 256 caption rows + one direct row per slot; the adapter
beats the mean baseline; the export is a ming_image file `inspect --json` reports with no
problem, carrying that tokenizer.json, and `load_gguf` rebuilds it. The printed command is
Ming-Image's. (The engine's own graph on such a file: tests/engine/test_ming_adapter_engine.py.)"""

from __future__ import annotations

import json

import pytest
import torch
from pipeline_helpers import cli_at_home, run_demo

from gguf_trainer.data.shards import Shard, shard_files
from gguf_trainer.model.adapters import load_gguf

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return run_demo(tmp_path_factory.mktemp("ming"), "ming_image", steps=20, timeout=3000)


def test_demo_trains_and_prints_the_ming_command(demo):
    proj = demo["project"]
    assert proj.settings.precompute.mock_teacher is False
    ev = json.loads(proj.paths.eval_json.read_text())
    print(f"demo --pack ming_image --steps 20: val cos {ev['val_cos']:.4f} vs mean baseline "
          f"{ev['baseline']['baseline_cos']:.4f}")
    assert ev["val_cos"] > ev["baseline"]["baseline_cos"]
    assert "--llm-adapter" in demo["stdout"] and "ming-image-0.1-design" in demo["stdout"]


def test_shards_hold_the_engines_slot_ids_and_the_engines_rows(demo):
    proj = demo["project"]
    pack = proj.pack
    shard = Shard(shard_files(proj.paths.shard_dir("val"))[0])
    texts = [json.loads(line)["text"] for line in
             proj.paths.samples("val").read_text().splitlines() if line.strip()]
    seeds = shard.t["seed_ids"]
    assert seeds.shape[1] == pack.num_queries
    for i in range(min(shard.n, 8)):
        ids = [int(x) for x in seeds[i] if x >= 0]
        assert ids == pack.slot_ids_for_text(texts[int(shard.t["sample_index"][i])])
        rows = shard.target(i)
        assert rows.shape == (256 + len(ids), 192)  # caption rows, then one row per slot
        assert torch.all(rows[:256, 128:] == 0)  # caption rows zero-padded (2:3, like 2560:3840)


def test_export_is_a_ming_file_the_engine_reads(demo):
    from gguf_trainer.tiny.ming import ling_tokenizer_json

    proj = demo["project"]
    path = next(proj.paths.root.glob("output/*.gguf"))
    out = cli_at_home("inspect", "--json", path, home=demo["home"])
    report = json.loads(out.stdout)
    assert out.returncode == 0 and report["kind"] == "ming_image" and report["problems"] == []
    import gguf
    import numpy as np

    from gguf_trainer.model.ming_adapter import tokenizer_from_tensor

    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == "tokenizer_json")
    assert tokenizer_from_tensor(np.asarray(t.data)) == ling_tokenizer_json()
    model = load_gguf(path)
    assert model.metadata["adapter.pack"] == "ming_image"
    assert model.config.n_bank == 256 and model.config.bank_dim == 128
