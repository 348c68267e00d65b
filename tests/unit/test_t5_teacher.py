"""The PixArt pack's real T5 teacher on the shipped tiny snapshot: seed ids against
sentencepiece itself, batched == per-prompt, the header-only snapshot check and its bad inputs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from gguf_trainer.errors import UserError
from gguf_trainer.teachers import t5
from gguf_trainer.teachers.t5_tiny import DEMO_DIR, TINY_T5_CONFIG

PROMPTS = ["", "a red fox", "  close-up   portrait of a young lady  ",
           "a koi pond, watercolor, in fog, " * 4, "an old lighthouse at dawn",
           "zebra quokka axolotl", "a medieval castle, " * 30]


@pytest.fixture(scope="module")
def sp():
    return spm.SentencePieceProcessor(model_file=str(DEMO_DIR / "spiece.model"))


@pytest.fixture(scope="module")
def teacher():
    teacher = t5.load_t5_teacher(DEMO_DIR, "cpu", "cpu")
    yield teacher
    teacher.close()


@pytest.fixture
def snapshot(tmp_path):
    dest = tmp_path / "t5"
    shutil.copytree(DEMO_DIR, dest)
    return dest


def test_seed_ids_are_sentencepiece_ids_then_eos_then_pads(sp):
    tok = t5.SeedTokenizer(DEMO_DIR / "spiece.model", window=120)
    for text in PROMPTS:
        pieces = sp.encode(text)
        ids = tok.seed_ids(text)
        assert len(ids) == 120
        if len(pieces) < 120:  # fits: every piece, EOS, then pads
            assert ids == pieces + [1] + [0] * (119 - len(pieces))
        else:  # cut: the first 119 pieces, EOS forced into the last slot, no pad
            assert ids[:119] == pieces[:119] and ids[119] == 1 and 0 not in ids
    assert tok.seed_ids("") == [1] + [0] * 119  # an empty prompt is EOS alone
    assert tok.seed_ids("a  red   fox") == tok.seed_ids("a red fox")  # the engine collapses spaces
    assert t5.real_length(tok.seed_ids("a red fox")) == len(sp.encode("a red fox")) + 1


def test_window_is_one_the_engine_builds():
    assert len(t5.SeedTokenizer(DEMO_DIR / "spiece.model", window=300).seed_ids("a red fox")) == 300
    assert t5.window_ids([5] * 400, 300)[-1] == 1
    with pytest.raises(UserError, match="num_queries must equal it"):
        t5.check_window(77)


def test_batched_targets_equal_the_per_prompt_full_window(teacher):
    rows = teacher.targets(PROMPTS)
    worst = 0.0
    for text, got in zip(PROMPTS, rows):
        window = teacher.seed_ids(text)
        ref = t5.encode_windows(teacher.model, [window], "cpu", trim=False)[0]  # one prompt, all 120 slots
        assert got.rows.shape == (t5.real_length(window), TINY_T5_CONFIG["d_model"]) == ref.shape
        assert got.seed_ids == window
        worst = max(worst, (got.rows - ref).abs().max().item() / ref.abs().max().item())
    print(f"batched vs per-prompt full window (fp32 CPU, {len(PROMPTS)} mixed lengths): max |Δ| / max |ref| = {worst:.3g}")
    assert worst <= 1e-6
    assert teacher.lengths(PROMPTS) == [r.rows.shape[0] for r in rows]
    assert teacher.n_truncated >= 1  # the 30× castle prompt is over 120 slots


def test_targets_take_sample_records(teacher):
    class Record:
        text = "a red fox"

    by_text = teacher.targets(["a red fox"])[0].rows
    assert torch.equal(teacher.targets([{"text": "a red fox"}])[0].rows, by_text)
    assert torch.equal(teacher.targets([Record()])[0].rows, by_text)


def test_check_snapshot_reads_headers_only_and_finds_every_tensor():
    code = ("import sys; from gguf_trainer.teachers import t5; from gguf_trainer.teachers.t5_tiny import DEMO_DIR;"
            "r = t5.check_snapshot(DEMO_DIR); print(r.summary());"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'weights were loaded'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr
    report = t5.check_snapshot(DEMO_DIR)
    assert report.n_tensors == len(t5.expected_encoder_tensors(TINY_T5_CONFIG)) == 2 + 1 + 2 * 9
    assert report.dtypes == ["BF16"] and report.spm_pieces <= TINY_T5_CONFIG["vocab_size"]


def test_snapshot_without_spiece_model(snapshot):
    (snapshot / "spiece.model").unlink()
    with pytest.raises(UserError, match="spiece.model is missing"):
        t5.check_snapshot(snapshot)


def test_snapshot_with_a_missing_or_cut_weight_shard(snapshot):
    weights = snapshot / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 100])
    with pytest.raises(UserError, match="cut short.*download did not finish"):
        t5.check_snapshot(snapshot)
    weights.rename(snapshot / "model-00002-of-00002.safetensors")
    (snapshot / t5.WEIGHTS_INDEX).write_text(json.dumps(
        {"weight_map": {"shared.weight": "model-00001-of-00002.safetensors",
                        "encoder.final_layer_norm.weight": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(UserError, match="model-00001-of-00002.safetensors is missing"):
        t5.check_snapshot(snapshot)
    (snapshot / t5.WEIGHTS_INDEX).unlink()
    with pytest.raises(UserError, match="no model.safetensors"):
        t5.check_snapshot(snapshot)


def test_snapshot_whose_weights_do_not_match_its_config(snapshot):
    config = json.loads((snapshot / "config.json").read_text())
    (snapshot / "config.json").write_text(json.dumps({**config, "d_ff": 96}))
    with pytest.raises(UserError, match=r"DenseReluDense.wi_0.weight has shape \[128, 64\] but config.json implies \[96, 64\]"):
        t5.check_snapshot(snapshot)
    (snapshot / "config.json").write_text(json.dumps({**config, "num_layers": 3}))
    with pytest.raises(UserError, match="lack 9 encoder tensor"):
        t5.check_snapshot(snapshot)
    (snapshot / "config.json").write_text(json.dumps({**config, "model_type": "qwen3"}))
    with pytest.raises(UserError, match="does not describe a T5 encoder"):
        t5.check_snapshot(snapshot)


def test_not_a_t5_tokenizer(snapshot, sp):
    (snapshot / "spiece.model").write_bytes(b"not a model")
    with pytest.raises(UserError, match="not a sentencepiece model"):
        t5.check_snapshot(snapshot)


def test_offload_and_gpu_modes_need_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(UserError, match="needs a CUDA device"):
        t5.load_encoder(DEMO_DIR, "cpu", "offload")


def test_encoder_memory_by_mode():
    n = 4_762_310_656  # T5-XXL v1.1 encoder parameters (expected_encoder_tensors of its config)
    assert t5.encoder_gib(n, "gpu") == t5.encoder_gib(n, "offload") == pytest.approx(8.87, abs=0.01)
    assert t5.encoder_gib(n, "cpu") == pytest.approx(17.74, abs=0.01)  # fp32 off CUDA


def test_shipped_tiny_snapshot_is_what_the_builder_makes(tmp_path):
    from gguf_trainer.teachers.t5_tiny import build_tiny_t5

    rebuilt = build_tiny_t5(tmp_path / "t5")
    for name in ("config.json", "spiece.model", "model.safetensors"):
        assert (rebuilt / name).read_bytes() == (DEMO_DIR / name).read_bytes(), name
    assert sum((DEMO_DIR / n).stat().st_size for n in ("config.json", "spiece.model", "model.safetensors")) < 300_000


def test_the_shipped_data_is_package_data():
    import tomllib

    cfg = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    globs = cfg["tool"]["setuptools"]["package-data"]["gguf_trainer.packs"]
    assert any(Path("demo_materials/t5xxl_pixart/spiece.model").match(g) for g in globs)


def test_gpu_benchmark_script_runs_quick(capsys):
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_t5_gpu.py"
    spec = importlib.util.spec_from_file_location("bench_t5_gpu", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.main(["--quick", "--prompts", "32"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    assert result["modes"]["gpu"]["real_rows"] == sum(map(bench.real_len, bench.prompt_windows(
        32, bench.TINY["vocab_size"], bench.random.Random(bench.SEED))))
    assert result["batched_vs_single"]["max_rel"] <= 1e-6  # fp32 on the CPU; bf16 is read on a GPU


def test_ram_preflight_before_any_weight_loads():
    need = t5.encoder_gib(t5.check_snapshot(DEMO_DIR).n_params, "cpu")
    with pytest.raises(UserError, match=r"needs 0\.0 GiB of RAM in teacher mode cpu \(fp32 on the CPU\)"):
        t5.load_t5_teacher(DEMO_DIR, "cpu", "cpu", ram_limit_gib=need / 2)
