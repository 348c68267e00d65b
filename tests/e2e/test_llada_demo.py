"""`gguf-trainer demo --pack llada_image --steps 40` against the tiny REAL teacher (remote code,
MoE, the transformers-5 traps) in subprocesses, then what it made: a seedless resampler that
`inspect` reads as such, the SigVQ companion, an eval that beats the mean baseline, and `check`
against a dump written by an independent forward of the exported adapter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch
from engine_reference import engine_forward

from gguf_trainer.adapter_file import read_adapter
from gguf_trainer.check import run_check
from gguf_trainer.packs.llada_image import PACK
from gguf_trainer.student import load_student, tokenize

pytestmark = pytest.mark.slow
PROMPT = "a red fox, oil painting, at sunset"


def cli(*args, env, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gguf_trainer.cli", *map(str, args)], check=False,
                          capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **env})


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llada_demo")
    env = {"GGUF_TRAINER_HOME": str(tmp / "home"), "HF_HOME": str(tmp / "hf"),
           "HF_MODULES_CACHE": str(tmp / "modules"), "OMP_NUM_THREADS": "2"}
    root = tmp / "demo_llada"
    res = cli("demo", "--pack", "llada_image", "--dir", root, "--steps", 40, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return root, res, env


def test_demo_trains_against_the_tiny_real_teacher(demo):
    root, res, _ = demo
    assert "trusted the remote code of the tiny LLaDA teacher" in res.stdout + res.stderr
    log = (root / "pipeline.log").read_text()
    assert "repaired 1 RoPE table" in log  # transformers 5 left it uninitialised: the trap is real
    ev = json.loads((root / "eval.json").read_text())
    base = ev["baseline"]["baseline_cos_centered"]
    print(f"demo eval: cos_centered {ev['val_cos']:.4f} vs mean baseline {base:.4f}; health {ev['health']}")
    assert not ev["mock"] and ev["headline"] == "cos_centered"
    assert ev["beats_baseline"] and ev["val_cos"] > base + 0.05
    assert ev["health"].startswith("n/a: a tiny demo teacher")


def test_export_is_a_seedless_resampler(demo):
    root, _, env = demo
    gguf_path = root / "output" / "pig_llada_adapter-f16.gguf"
    view = read_adapter(gguf_path)
    assert view.kind == "resampler" and view.t5_vocab == 0 and not view.refusals
    assert view.num_queries == 256 and view.out_dim == 2560
    out = cli("inspect", gguf_path, "--json", env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["kind"] == "resampler" and "0.5.7" in json.dumps(report)


def test_sigvq_companion_is_exported_and_recorded(demo):
    from safetensors import safe_open

    root, _, _ = demo
    dest = root / "output" / "pig_llada_sigvq-f16.gguf"
    src = root / "materials" / "LLaDA-Image-Turbo-sigvq" / "sigvq" / "diffusion_pytorch_model.safetensors"
    with safe_open(str(src), framework="pt") as st:
        names = set(st.keys())
    tensors = gguf.GGUFReader(dest).tensors
    assert {t.name for t in tensors} == names and len(tensors) == len(names)
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F16 for t in tensors)
    kinds = json.loads((root / "exports.json").read_text())["files"]
    assert kinds[str(dest.resolve())]["kind"] == "companion"


def test_check_against_an_independent_forward_and_a_wrong_dump(demo, tmp_path):
    root, _, _ = demo
    gguf_path = root / "output" / "pig_llada_adapter-f16.gguf"
    student_gguf = root / "materials" / "pig_clip-tiny-f16.gguf"
    tok = root / "materials" / "pig-clip-tokenizer"
    student = load_student(student_gguf, tok)
    ids = tokenize(student.tokenizer, [PACK.format_prompt(PROMPT)])[0]
    x = torch.tensor([ids])
    hidden = student.hidden(x, torch.ones_like(x))[0].numpy()
    ref = engine_forward(gguf_path, hidden).astype("<f4")  # the engine-faithful NumPy forward
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    ref.tofile(good / "adapter_out.bin")
    (good / "tokens.txt").write_text("\n".join(map(str, ids)) + "\n")
    res = run_check(gguf_path, student_gguf, good, PROMPT, tok)
    print(f"check vs independent forward: centred {res['cos_centered']:.7f}, rel_mse {res['rel_mse']:.3g}")
    assert res["cos_centered"] >= 0.9999 and res["verdict"].startswith("healthy")
    rng = np.random.default_rng(0)
    ref[rng.permutation(len(ref))].tofile(bad / "adapter_out.bin")  # rows of the wrong queries
    res = run_check(gguf_path, student_gguf, bad, PROMPT, tok)
    print(f"check vs a wrong dump: centred {res['cos_centered']:.4f}")
    assert res["cos_centered"] < 0.5 and res["verdict"].startswith("broken")
