"""`gguf-trainer demo --pack qwen3_zimage`, the token-aligned text kind's demo, trains against a
tiny REAL teacher of its architecture (transformers Qwen3, random weights, as deep as the
family's tap) in a subprocess, like a user runs it (every other token-aligned family is checked
in-process by test_families.py). The export is a text-only token-aligned
file (no vision_proj / vis_in / layer_map) that `inspect` reads, and the engine's forward of it
(tests/engine_reference.py, its own reader and math) equals load_gguf's to 1e-5 on the student's
real hidden states of the family's template ids, pads included. `gguf-trainer new --pack ID`
creates its project."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from engine_reference import engine_forward
from pipeline_helpers import cli_at_home, run_demo

from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.model.adapters import load_gguf
from gguf_trainer.model.student import load_student

pytestmark = pytest.mark.slow

# One demo for the kind; qwen3_ovis, qwen3vl_minimax_h3 and the image families: test_families.py
PACKS = ("qwen3_zimage",)


@pytest.fixture(scope="module", params=PACKS)
def demo(request, tmp_path_factory):
    out = run_demo(tmp_path_factory.mktemp(request.param), request.param, steps=20, timeout=1500)
    out["pack"] = request.param
    return out


def test_demo_trains_and_says_there_is_no_reference(demo):
    proj = demo["project"]
    assert proj.settings.pack == demo["pack"] and proj.settings.precompute.mock_teacher is False
    ev = json.loads(proj.paths.eval_json.read_text())
    base = ev["baseline"]["baseline_cos"]
    print(f"demo --pack {demo['pack']} --steps 20 (tiny real teacher): val cos {ev['val_cos']:.4f} "
          f"vs mean baseline {base:.4f}")
    assert ev["mock"] is False and ev["val_cos"] > base
    assert ev["health"].startswith("n/a")
    assert "--llm-adapter" in demo["stdout"]


def test_the_export_is_text_only_and_the_engine_runs_it_as_load_gguf_does(demo):
    proj = demo["project"]
    out = cli_at_home("inspect", "--json", proj.final_gguf, home=demo["home"], timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["kind"] == "token_aligned" and report["problems"] == []
    # no vision, no layer_map
    assert report["trainer_kind"] == "token_aligned" and report["taps"] == []
    adapter = load_gguf(proj.final_gguf)
    assert adapter.config.kind == "token_aligned" and adapter.config.taps == ()
    assert not adapter.config.vis_dim
    student = load_student(proj.material_path("student"), proj.material_path("student_tokenizer"))
    encode = engine_bpe(student.tokenizer).encode
    pack = proj.pack
    for prompt in ["close-up portrait of a young lady", "a red fox in the snow, golden hour"]:
        ids = pack.student_ids(encode, Sample(prompt))
        n = pack.padding.real_length(ids)
        x = torch.tensor([ids])
        keep = torch.zeros_like(x, dtype=torch.bool)
        keep[0, :n] = True  # the pads are masked student keys (template_padding.py)
        with torch.no_grad():
            hidden = student.hidden(x, keep).float()
            got = adapter(hidden, None)[0].numpy()
        ref = engine_forward(proj.final_gguf, hidden[0].numpy())  # no mask: the engine passes none
        rel = float(np.abs(got - ref).max() / np.abs(ref).max())
        print(f"{demo['pack']}: engine vs load_gguf rel {rel:.2e} on {prompt!r} ({len(ids)} rows)")
        assert ref.shape == (len(ids), adapter.config.out_dim) and rel <= 1e-5


def test_new_creates_a_project_of_the_pack(demo, tmp_path):
    out = cli_at_home("new", tmp_path / "p", "--pack", demo["pack"], home=demo["home"], timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    settings = json.loads((tmp_path / "p" / "project.json").read_text())
    assert settings["pack"] == demo["pack"]
