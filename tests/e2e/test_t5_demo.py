"""`gguf-trainer demo --pack t5xxl_pixart` trains against the shipped tiny REAL T5 teacher
(random T5EncoderModel + a small sentencepiece model) through the real teacher code, in a
subprocess like a user runs it: the export is a seeded resampler with 120 queries that
`inspect` reads and `load_gguf` runs, the shards hold the engine's T5 window ids, the
adapter beats the mean baseline, and a changed `spiece.model` invalidates the shards."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from pipeline_helpers import cli_at_home

from gguf_trainer.data.samples import Sample, iter_samples
from gguf_trainer.data.shards import load_verified, shard_files
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.store import project as project_mod
from gguf_trainer.teachers.t5 import SeedTokenizer

pytestmark = pytest.mark.slow


def cli(*args, home: Path, timeout=480) -> subprocess.CompletedProcess:
    return cli_at_home(*args, home=home, timeout=timeout)


@pytest.fixture(scope="module")
def demo(pixart_demo):
    return pixart_demo  # the run's one PixArt demo (tests/conftest.py): tests copy before changing


def test_demo_trains_against_the_tiny_real_teacher(demo):
    proj = demo["project"]
    assert proj.settings.precompute.mock_teacher is False
    ev = json.loads(proj.paths.eval_json.read_text())
    base = ev["baseline"]["baseline_cos"]
    print(
        f"demo --pack t5xxl_pixart --steps 40 (tiny real T5): val cos {ev['val_cos']:.4f} vs mean "
        f"baseline {base:.4f}"
    )
    assert ev["mock"] is False and "note" not in ev
    assert ev["val_cos"] > base + 0.05  # learned the teacher beyond the per-dimension mean
    assert ev["roundtrip_cos"] > 0.999
    # the shipped tiny teacher carries GGUF_TRAINER_TINY: the reference figures are not for it
    assert ev["health"].startswith("n/a: a tiny demo teacher")
    assert ev["reference"]["val cos"] == 0.827
    # what the user reads at the end: the eval line with its health, the ggk command and the advice
    assert "n/a: a tiny demo teacher" in demo["stdout"] and "f16 or q8_0" in demo["stdout"]
    assert "--llm-adapter" in demo["stdout"]
    # no card here: the log states the CPU fact, not a card comparison with 0.0 GiB available
    log = proj.paths.pipeline_log.read_text()
    assert "no GPU: the teacher runs on the CPU in fp32" in log and "available there" not in log


def test_the_shards_hold_the_engine_t5_window_ids(demo):
    proj = demo["project"]
    tok = SeedTokenizer(proj.material_path("teacher") / "spiece.model", window=120)
    texts = [s.text for s in iter_samples(proj.paths.data / "val.jsonl")]
    shard = load_verified(shard_files(proj.paths.shard_dir("val"))[0])
    for index, ids, n_rows in zip(
        shard["sample_index"].tolist(), shard["seed_ids"].tolist(), shard["target_len"].tolist()
    ):
        assert ids == tok.seed_ids(texts[index])
        assert n_rows == sum(1 for i in ids if i)  # the real slots, EOS included, are stored
    assert shard["target_rows"].shape[1] == 64  # the tiny teacher's d_model, read from the shards


def test_inspect_reads_a_seeded_resampler_and_load_gguf_runs_it(demo):
    from gguf_trainer.model.adapters import load_gguf
    from gguf_trainer.model.student import load_student, pad_batch

    proj = demo["project"]
    out = cli("inspect", "--json", proj.final_gguf, home=demo["home"], timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["kind"] == "seeded_resampler"
    assert report["geometry"]["num_queries"] == 120 and report["geometry"]["t5_vocab"] == 32128
    adapter = load_gguf(proj.final_gguf)
    student = load_student(proj.material_path("student"), proj.material_path("student_tokenizer"))
    tok = SeedTokenizer(proj.material_path("teacher") / "spiece.model", window=120)
    prompts = ["close-up portrait of a young lady", ""]
    encode = engine_bpe(student.tokenizer).encode
    ids, keep = pad_batch([proj.pack.student_ids(encode, Sample(p)) for p in prompts])
    with torch.no_grad():
        rows = adapter(
            student.hidden(ids, keep).float(),
            keep,
            torch.tensor([tok.seed_ids(p) for p in prompts]),
        )
    assert rows.shape == (2, 120, 64) and torch.isfinite(rows).all()


def test_a_changed_spiece_model_invalidates_the_shards(demo, tmp_path):
    from gguf_trainer.runner.stages import stage_inputs, stage_objects, stale_stages
    from gguf_trainer.tiny.t5_tiny import train_tiny_spm

    root = tmp_path / "proj"
    shutil.copytree(demo["root"], root)
    teacher = tmp_path / "teacher"
    shutil.copytree(demo["project"].material_path("teacher"), teacher)
    project_mod.update_settings(root, {"materials.teacher.path": str(teacher)})
    proj = project_mod.load_project(root)
    # same files, same fingerprint
    assert stale_stages(proj, stage_objects(), stage_inputs(proj)) == {}
    (teacher / "spiece.model").write_bytes(train_tiny_spm(vocab_size=200))
    stale = stale_stages(proj, stage_objects(), stage_inputs(proj))
    shard_stages = [name for name in stale if name.startswith("precompute")]
    assert shard_stages and all("teacher" in stale[name] for name in shard_stages), stale


def test_a_300_slot_window_exports_300_queries(demo, tmp_path):
    """PixArt-Σ: `precompute.t5_window` 300 re-plans the shards (new contract, teacher limit) and
    the adapter (num_queries); the export holds a 300-row `query` that `inspect` reads, and the
    shards hold 300-slot seed windows. A small corpus keeps the run short."""
    from gguf_trainer.runner.stages import stage_inputs, stage_objects, stale_stages

    root = tmp_path / "sigma"
    shutil.copytree(demo["root"], root, ignore=shutil.ignore_patterns("output"))
    project_mod.update_settings(root, {"precompute.t5_window": 300})
    proj = project_mod.load_project(root)
    assert proj.pack.num_queries == proj.pack.max_len_teacher == 300
    inputs = stage_inputs(proj)
    stale = stale_stages(proj, stage_objects(), inputs)
    assert "corpus" not in stale and "train" in stale and inputs["train"]["num_queries"] == 300
    assert "(contract, max_len_teacher)" in stale["precompute_val"], stale
    project_mod.update_settings(
        root,
        {
            "corpus.n_train": 48,
            "corpus.n_val": 16,
            "train.steps": 10,
            "train.val_every": 10,
            "export.output_dir": str(root / "output"),
        },
    )
    out = cli("run", "--project", root, home=demo["home"])
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    proj = project_mod.load_project(root)
    shard = load_verified(shard_files(proj.paths.shard_dir("val"))[0])
    assert shard["seed_ids"].shape[1] == 300
    out = cli("inspect", "--json", proj.final_gguf, home=demo["home"], timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["kind"] == "seeded_resampler" and report["geometry"]["num_queries"] == 300
    assert report["problems"] == [], report["problems"]


def test_a_factorized_export_is_what_the_engine_runs(demo, tmp_path, capsys):
    """train.seed_rank r: the export writes the best rank-r factorization of the trained seed
    table (t5_embed_a + t5_embed_b, engine-families §4). The engine's forward of that file
    (tests/engine_reference.py) equals load_gguf's to 1e-5; its gap to the full-table export is
    reported beside the SVD error, and inspect shows the rank and the bytes saved."""
    import numpy as np
    from engine_reference import engine_forward

    from gguf_trainer.model.adapter_file import read_adapter
    from gguf_trainer.model.adapter_report import seed_table
    from gguf_trainer.model.adapters import load_gguf
    from gguf_trainer.model.student import load_student
    from gguf_trainer.stages.export import export_checkpoint

    root = tmp_path / "fz"
    shutil.copytree(demo["root"], root, ignore=shutil.ignore_patterns("output"))
    rank = 32
    project_mod.update_settings(root, {"train.seed_rank": rank})
    proj = project_mod.load_project(root)
    path = proj.final_gguf  # exports land only where and as the project writes them
    export_checkpoint(proj, "best", path, is_snapshot=False)
    view = read_adapter(path)
    assert (
        view.kind == "seeded_resampler_factorized" and view.embed_rank == rank and not view.problems
    )
    table = seed_table(view)
    assert table["saved_bytes"] > 0 and table["full_bytes"] == 32128 * view.width * 2
    err = float(view.metadata["adapter.seed_svd_rel_error"])
    assert 0 < err < 1
    out = cli("inspect", path, home=demo["home"], timeout=120)
    assert out.returncode == 0 and f"factorized, rank {rank}" in out.stdout, out.stdout + out.stderr
    adapter = load_gguf(path)
    student = load_student(proj.material_path("student"), proj.material_path("student_tokenizer"))
    tok = SeedTokenizer(proj.material_path("teacher") / "spiece.model", window=120)
    gaps = []
    for prompt in ["close-up portrait of a young lady", "a red fox in the snow, golden hour"]:
        ids = torch.tensor([proj.pack.student_ids(engine_bpe(student.tokenizer).encode,
                                                  Sample(prompt))])
        with torch.no_grad():
            hidden = student.hidden(ids, torch.ones_like(ids, dtype=torch.bool)).float()
        seeds = torch.tensor([tok.seed_ids(prompt)])
        ref = engine_forward(path, hidden[0].numpy(), seed_ids=seeds[0].numpy())
        with torch.no_grad():
            got = adapter(hidden, None, seeds)[0].numpy()
        rel = float(np.abs(got - ref).max() / np.abs(ref).max())
        assert rel <= 1e-5, rel
        full = engine_forward(
            demo["project"].final_gguf, hidden[0].numpy(), seed_ids=seeds[0].numpy()
        )
        gaps.append(float(np.linalg.norm(ref - full) / np.linalg.norm(full)))
    with capsys.disabled():
        print(
            f"\nfactorized PixArt demo export, rank {rank}: engine vs load_gguf <= 1e-5; "
            f"gap to the full-table export {max(gaps):.4g} (relative, over 120 slots); "
            f"SVD reconstruction error of the seed table {err:.4g}; "
            f"{table['saved_bytes'] / 1024**2:.1f} MiB saved"
        )
    assert max(gaps) > 0
