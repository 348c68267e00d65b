"""`gguf-trainer demo --pack llada_image --steps 40` against the tiny REAL teacher (remote code,
MoE, the transformers-5 traps) in subprocesses, then what it made: a seedless resampler that
`inspect` reads as such, the SigVQ companion, an eval that beats the mean baseline, and `check`
against a dump written by an independent forward of the exported adapter. Then a user's path:
a freshly built snapshot in the released layout is linked, run with --trust-remote-code and
exported; one in the old layout is `failed` in `materials` and refused by `run` before any of
its code or weights load."""

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

from gguf_trainer.base.places import record_key
from gguf_trainer.check import run_check
from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.model.adapter_file import read_adapter
from gguf_trainer.model.student import load_student
from gguf_trainer.packs.llada_image import PACK

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
    print(
        f"demo eval: cos_centered {ev['val_cos']:.4f} vs mean baseline {base:.4f}; health "
        f"{ev['health']}"
    )
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
    src = (
        root
        / "materials"
        / "LLaDA-Image-Turbo-sigvq"
        / "sigvq"
        / "diffusion_pytorch_model.safetensors"
    )
    with safe_open(str(src), framework="pt") as st:
        names = set(st.keys())
    tensors = gguf.GGUFReader(dest).tensors
    assert {t.name for t in tensors} == names and len(tensors) == len(names)
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F16 for t in tensors)
    kinds = json.loads((root / "exports.json").read_text())["files"]
    assert kinds[record_key(dest, root)]["kind"] == "companion"


def test_check_against_an_independent_forward_and_a_wrong_dump(demo, tmp_path):
    root, _, _ = demo
    gguf_path = root / "output" / "pig_llada_adapter-f16.gguf"
    student_gguf = root / "materials" / "pig_clip-tiny-f16.gguf"
    tok = root / "materials" / "pig-clip-tokenizer"
    student = load_student(student_gguf, tok)
    ids = PACK.student_ids(engine_bpe(student.tokenizer).encode, Sample(PROMPT))
    x = torch.tensor([ids])
    hidden = student.hidden(x, torch.ones_like(x))[0].numpy()
    ref = engine_forward(gguf_path, hidden).astype("<f4")  # the engine-faithful NumPy forward
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    ref.tofile(good / "adapter_out.bin")
    (good / "tokens.txt").write_text("\n".join(map(str, ids)) + "\n")
    res = run_check(gguf_path, student_gguf, good, PROMPT, tok)
    print(
        f"check vs independent forward: centred {res['cos_centered']:.7f}, rel_mse "
        f"{res['rel_mse']:.3g}"
    )
    assert res["cos_centered"] >= 0.9999 and res["verdict"].startswith("healthy")
    rng = np.random.default_rng(0)
    ref[rng.permutation(len(ref))].tofile(bad / "adapter_out.bin")  # rows of the wrong queries
    res = run_check(gguf_path, student_gguf, bad, PROMPT, tok)
    print(f"check vs a wrong dump: centred {res['cos_centered']:.4f}")
    assert res["cos_centered"] < 0.5 and res["verdict"].startswith("broken")


# ---------------------------------------------------------------- link -> run -> export


def _released_layout_snapshot(dest):
    """A new tiny snapshot in the released layout (folders, config keys, weight names, a
    sharded text encoder with its index), other random weights than the shipped one."""
    import shutil

    from gguf_trainer.tiny.llada import CODE_FILES, SHIPPED, build_shipped

    (dest / "text_encoder").mkdir(parents=True)
    for name in CODE_FILES:
        shutil.copy(SHIPPED / "text_encoder" / name, dest / "text_encoder" / name)
    return build_shipped(PACK.format_prompt, dest, seed=11)


def _project(root, materials):
    """A llada_image project on the tiny student, demo-sized; no teacher path yet."""
    from gguf_trainer.demo import demo_overrides
    from gguf_trainer.store.project import create_project
    from gguf_trainer.tiny.prompts import demo_prompts
    from gguf_trainer.tiny.student import (
        tiny_qwen3_config,
        write_tiny_student,
        write_tiny_tokenizer_dir,
    )

    student = materials / "pig_clip-tiny-f16.gguf"
    tok = materials / "pig-clip-tokenizer"
    if not student.exists():
        write_tiny_student(student)
        write_tiny_tokenizer_dir(tok, tiny_qwen3_config())
        (materials / "prompts.txt").write_text("\n".join(demo_prompts()) + "\n")
    overrides = {
        **demo_overrides("llada_image", materials / "prompts.txt", 20),
        "corpus.n_train": 64,
        "corpus.n_val": 16,
        "precompute.shard_size": 32,
        "precompute.val_shard_size": 16,
        "precompute.mock_teacher": False,
        "train.val_every": 10,
        "export.export_sigvq": False,
        "export.output_dir": str(root / "output"),
        "materials": {"student": {"path": str(student)}, "student_tokenizer": {"path": str(tok)}},
    }
    create_project(root, "llada_image", overrides=overrides)
    return root


@pytest.fixture(scope="module")
def linked(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llada_linked")
    env = {
        "GGUF_TRAINER_HOME": str(tmp / "home"),
        "HF_HOME": str(tmp / "hf"),
        "HF_MODULES_CACHE": str(tmp / "modules"),
        "OMP_NUM_THREADS": "2",
    }
    return tmp, env, _released_layout_snapshot(tmp / "LLaDA-Image-Turbo")


def test_a_released_layout_snapshot_links_runs_and_exports(linked):
    tmp, env, snap = linked
    root = _project(tmp / "proj", tmp / "materials")
    res = cli("link", "--project", root, "teacher", snap, env=env, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == f"teacher: ready at {snap}", (
        res.stdout + res.stderr
    )
    rows = json.loads(cli("materials", "--project", root, "--json", env=env, timeout=120).stdout)
    row = next(r for r in rows if r["id"] == "teacher")
    assert (
        row["state"] == "ready"
        and row["verified"]
        and "TextProjection 2 layer(s) -> 2560" in row["note"]
    )
    res = cli("run", "--project", root, "--trust-remote-code", env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    log = (root / "pipeline.log").read_text()
    assert "repaired 1 RoPE table" in log  # the real remote-code backbone ran
    out = root / "output" / "pig_llada_adapter-f16.gguf"
    view = read_adapter(out)
    assert (
        view.kind == "resampler"
        and view.num_queries == 256
        and view.out_dim == 2560
        and not view.refusals
    )
    ev = json.loads((root / "eval.json").read_text())
    print(
        f"released-layout snapshot: cos_centered {ev['val_cos']:.4f} vs mean baseline "
        f"{ev['baseline']['baseline_cos_centered']:.4f}"
    )
    assert not ev["mock"] and ev["beats_baseline"]


def test_an_old_layout_snapshot_is_failed_and_refused_before_anything_loads(linked):
    import shutil

    tmp, env, snap = linked
    bad = shutil.copytree(snap, tmp / "old-layout")
    cfg = json.loads((bad / "text_projection" / "config.json").read_text())
    cfg = {k: v for k, v in cfg.items() if k not in ("num_hidden_layers", "norm_eps")}
    (bad / "text_projection" / "config.json").write_text(
        json.dumps({**cfg, "num_layers": 2, "rms_norm_eps": 1e-6})
    )
    root = _project(tmp / "proj_old", tmp / "materials")
    # transformers copies imported code here
    env = {**env, "HF_MODULES_CACHE": str(tmp / "modules_old")}
    res = cli("link", "--project", root, "teacher", bad, env=env, timeout=120)
    assert res.stdout.strip() == f"teacher: failed at {bad}", res.stdout + res.stderr
    sentence = (
        f"{bad / 'text_projection' / 'config.json'} uses keys ['num_layers', 'rms_norm_eps'] "
        "of an older gguf-trainer layout"
    )
    shown = cli("materials", "--project", root, env=env, timeout=120).stdout
    assert "failed" in shown and sentence in shown
    res = cli("run", "--project", root, "--trust-remote-code", env=env)
    assert res.returncode != 0 and sentence in res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    assert not list((tmp / "modules_old").rglob("modeling_llada2uni_moe.py"))  # its code never ran
