"""`gguf-trainer demo --pack t5xxl_chroma|umt5xxl_wan` train against tiny REAL teachers of their
architecture (transformers T5 / UMT5 classes, random weights; the UMT5 with a 256384-piece
tokenizer) in a subprocess, like a user runs them. The export is a 512-query seeded resampler
with the family's seed table that `inspect` reads, and the engine's forward of it
(tests/engine_reference.py, its own reader and math) equals load_gguf's to 1e-5 on the student's
real hidden states and the pack's window ids. `gguf-trainer new --pack ID` creates each project."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from engine_reference import engine_forward
from pipeline_helpers import cli_at_home, run_demo

from gguf_trainer.data.samples import Sample
from gguf_trainer.data.shards import load_verified, shard_files
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.model.adapters import load_gguf
from gguf_trainer.model.student import load_student
from gguf_trainer.teachers import t5

pytestmark = pytest.mark.slow

PACKS = {"t5xxl_chroma": 32128, "umt5xxl_wan": 256384}  # pack -> seed table rows
PAD_ROWS = {"t5xxl_chroma": 1, "umt5xxl_wan": 0}  # pad slots the DiT reads (chroma_t5_mask_pad)


@pytest.fixture(scope="module", params=list(PACKS))
def demo(request, tmp_path_factory):
    out = run_demo(tmp_path_factory.mktemp(request.param), request.param, timeout=1500)
    out["pack"] = request.param
    return out


def test_demo_trains_and_says_there_is_no_reference(demo):
    proj = demo["project"]
    assert proj.settings.pack == demo["pack"] and proj.settings.precompute.mock_teacher is False
    ev = json.loads(proj.paths.eval_json.read_text())
    base = ev["baseline"]["baseline_cos"]
    print(f"demo --pack {demo['pack']} --steps 40 (tiny real teacher): val cos {ev['val_cos']:.4f} "
          f"vs mean baseline {base:.4f}")
    assert ev["mock"] is False and ev["val_cos"] > base
    assert ev["health"].startswith("n/a")
    assert "--llm-adapter" in demo["stdout"]


def test_shards_hold_the_window_ids_and_the_rows_the_dit_reads(demo):
    proj = demo["project"]
    shard = load_verified(shard_files(proj.paths.shard_dir("val"))[0])
    windows = shard["seed_ids"]
    assert windows.shape[1] == 512
    assert int(windows.max()) < PACKS[demo["pack"]]
    for ids, n_rows in zip(windows.tolist(), shard["target_len"].tolist()):
        assert ids[t5.real_length(ids) - 1] == 1  # EOS closes the real slots
        assert n_rows == min(t5.real_length(ids) + PAD_ROWS[demo["pack"]], 512)


def test_the_engine_runs_the_export_as_load_gguf_does(demo):
    proj = demo["project"]
    out = cli_at_home("inspect", "--json", proj.final_gguf, home=demo["home"], timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["kind"] == "seeded_resampler" and report["problems"] == []
    assert report["geometry"]["num_queries"] == 512
    assert report["geometry"]["t5_vocab"] == PACKS[demo["pack"]]
    adapter = load_gguf(proj.final_gguf)
    student = load_student(proj.material_path("student"), proj.material_path("student_tokenizer"))
    teacher = proj.pack.load_teacher({"teacher": proj.material_path("teacher")},
                                     type("Plan", (), {"mode": "cpu", "cpu_gib": 0.0}), "cpu")
    encode = engine_bpe(student.tokenizer).encode
    try:
        for prompt in ["close-up portrait of a young lady", "a red fox in the snow, golden hour"]:
            ids = torch.tensor([proj.pack.student_ids(encode, Sample(prompt))])
            with torch.no_grad():
                hidden = student.hidden(ids, torch.ones_like(ids, dtype=torch.bool)).float()
                seeds = torch.tensor([teacher.seed_ids(prompt)])
                got = adapter(hidden, None, seeds)[0].numpy()
            ref = engine_forward(proj.final_gguf, hidden[0].numpy(), seed_ids=seeds[0].numpy())
            rel = float(np.abs(got - ref).max() / np.abs(ref).max())
            print(f"{demo['pack']}: engine vs load_gguf rel {rel:.2e} on {prompt!r}")
            assert ref.shape == (512, adapter.config.out_dim) and rel <= 1e-5
    finally:
        teacher.close()


def test_new_creates_a_project_of_the_pack(demo, tmp_path):
    out = cli_at_home("new", tmp_path / "p", "--pack", demo["pack"], home=demo["home"], timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    settings = json.loads((tmp_path / "p" / "project.json").read_text())
    assert settings["pack"] == demo["pack"]
