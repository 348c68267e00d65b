"""`gguf-trainer render` of a real PixArt export with its cosine through `check`, against dumps
made by the engine's own code (a render's figure must be the engine's, not this tool's word).

ggk writes no teacher dump for PixArt (its T5 branch dumps nothing, engine-contract §4b), so the
render's figure is `check`: this tool's forward of the exported GGUF against the engine's
`adapter_out.bin`. Here the `ggk` on PATH is engine_ggk.py: the T5 window and the student ids
come from the engine's PixArtT5Embedder (probe.cpp) and `adapter_out.bin` from ggk 0.9.7's
LLMAdapter::AdapterRunner (adapter_probe.cpp) running the file the tiny PixArt demo exported.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
from engine_build import build
from pipeline_helpers import cli_at_home, run_pipeline

from gguf_trainer.check import read_ids
from gguf_trainer.demo import prepare_demo
from gguf_trainer.materials.materials import seed_tokenizer
from gguf_trainer.model.adapters import load_gguf
from gguf_trainer.store.project import load_project

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ENGINE_GGK = Path(__file__).with_name("engine_ggk.py")
PIXART_FILES = ("pixart-nvfp4.gguf", "pig_pixart_vae_fp16-f16.gguf", "t5xxl_fp16.safetensors")
PROMPTS = (
    "a red fox in fresh snow, watercolor",
    # past the 120-slot window: the engine cuts it and puts EOS last
    ", ".join(f"a {c} lantern over a quiet harbour at dusk" for c in (
        "amber", "cobalt", "crimson", "emerald", "ivory", "scarlet", "silver", "violet",
        "golden", "teal", "copper", "indigo", "olive", "maroon", "saffron", "cerulean")),
)


@pytest.fixture
def engine_ggk(tmp_path, monkeypatch):
    """engine_ggk.py installed as `ggk` on PATH, with the built drivers it calls."""
    probe = build(log=print)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ggk = bin_dir / "ggk"
    ggk.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(ENGINE_GGK))} "$@"\n'
    )
    ggk.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ENGINE_PROBE", str(probe))
    monkeypatch.setenv("ENGINE_ADAPTER_PROBE", str(probe.parent / "adapter_probe"))
    models = tmp_path / "ggk-models"
    models.mkdir()
    for name in PIXART_FILES:  # the model files the pack's commands name (engine_ggk reads none)
        (models / name).write_bytes(b"x")
    return models


def test_pixart_render_cosine_through_check_on_a_real_export(tmp_path, monkeypatch, engine_ggk):
    home = tmp_path / "home"
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(home))
    monkeypatch.setenv("HOME", str(home))
    root = prepare_demo("t5xxl_pixart", dest=tmp_path / "demo", steps=6)
    assert run_pipeline(root) == "done"
    project = load_project(root)
    export = project.final_gguf
    window = load_gguf(export).config.num_queries
    monkeypatch.setenv("STAND_IN_TOKENIZER", str(project.material_path("student_tokenizer")))
    # The demo's tiny teacher tokenizes with its own small spiece.model, the engine here with its
    # built-in T5 vocabulary, so check's comparison of the two (check --project, which a render
    # runs) would rightly refuse every dump. With a real teacher they are the same vocabulary;
    # here the spiece.model steps aside and check says it compared no ids.
    spm, _ = seed_tokenizer(project)
    spm.rename(spm.with_name("spiece.model.aside"))
    for seed, prompt in enumerate(PROMPTS):
        res = cli_at_home("render", "--project", root, "--prompt", prompt, "--seed", seed,
                          "--models", engine_ggk, "--wait", home=home)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        folder = max((root / "renders").glob(f"*-s{seed}"))
        record = json.loads((folder / "render.json").read_text())
        fig, note = record["figures"], record["figures_note"]
        assert fig is not None, note
        assert note.startswith("check: the adapter in PyTorch vs the engine's adapter dump"), note
        # the teacher half ran ggk's T5 path (no dump); the adapter's dump came from the CFG-1 pass
        adapter = record["halves"]["adapter"]
        cond = shlex.split(adapter["cond_command"])
        assert cond[cond.index("--cfg-scale") + 1] == "1" and cond[cond.index("-p") + 1] == prompt
        assert not any((folder / "teacher-dump").iterdir())
        dump = folder / "adapter-dump"
        t5_ids = read_ids(dump / "t5_ids.txt")
        assert len(t5_ids) == window and 1 in t5_ids and t5_ids[:2] != [3, 1]
        real = sum(i != 0 for i in t5_ids)
        engine_rows = np.fromfile(dump / "adapter_out.bin", "<f4").reshape(window, -1)
        assert fig["pack"] == "t5xxl_pixart" and fig["rows"] == real
        assert fig["student_cos"] == pytest.approx(1.0, abs=1e-6)  # the engine's student ids
        assert fig["tokens_checked"] is False  # PixArt writes t5_ids.txt, not tokens.txt
        assert fig["t5_ids_checked"] is False and "does not exist" in fig["t5_ids_why_not"]
        print(
            f"render of {len(prompt)} chars: {real} real slots of {window} x "
            f"{engine_rows.shape[1]}; cos {fig['cos']:.8f}, rel_mse {fig['rel_mse']:.3g}"
        )
        assert fig["cos"] >= 1 - 1e-5 and fig["rel_mse"] <= 1e-8
        assert "port check" in fig["verdict"]
        assert f"all rows {fig['cos']:.4f}" in res.stdout  # after the lead (tokens, pads)
