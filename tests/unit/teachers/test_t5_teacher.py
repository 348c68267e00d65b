"""The PixArt pack's real T5 teacher on the shipped tiny snapshot: seed ids by the engine's
unigram rule (against sentencepiece where they agree, and where they must not), batched ==
per-prompt, the header-only snapshot check and its bad inputs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import TINY_MARKER
from gguf_trainer.machine.hardware import Hardware
from gguf_trainer.teachers import t5
from gguf_trainer.tiny.t5_tiny import DEMO_DIR, TINY_T5_CONFIG

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


def test_seed_ids_are_the_engines_pieces_then_eos_then_pads(sp):
    tok = t5.SeedTokenizer(DEMO_DIR / "spiece.model", window=120)
    # plain ASCII: the engine agrees with sentencepiece
    for text in [p for p in PROMPTS if p == p.strip() and p]:
        pieces = sp.encode(text)
        ids = tok.seed_ids(text)
        assert len(ids) == 120
        if len(pieces) < 120:  # fits: every piece, EOS, then pads
            assert ids == pieces + [1] + [0] * (119 - len(pieces))
        else:  # cut: the first 119 pieces, EOS forced into the last slot, no pad
            assert ids[:119] == pieces[:119] and ids[119] == 1 and 0 not in ids
    assert tok.seed_ids("a  red   fox") == tok.seed_ids("a red fox")  # the engine collapses spaces
    assert t5.real_length(tok.seed_ids("a red fox")) == len(sp.encode("a red fox")) + 1


def test_seeds_follow_the_engines_unigram_not_sentencepiece(sp):
    """t5_unigram_tokenizer.cpp: "" is the piece "▁" + EOS (PixArt's default negative prompt,
    run on every CFG step; sentencepiece gives EOS alone); no NFKC (full-width letters stay
    unknown); each unknown character is its own <unk> (sentencepiece merges the run); each
    weight chunk is encoded on its own, so "(red:1.2) fox" gains a "▁" per chunk."""
    tok = t5.SeedTokenizer(DEMO_DIR / "spiece.model", window=120)
    meta = sp.piece_to_id("\u2581")
    assert tok.seed_ids("") == [meta, 1] + [0] * 118 and sp.encode("") == []
    assert tok.pieces("猫猫") == [meta, 2, 2] and sp.encode("猫猫") == [meta, 2]
    assert tok.pieces("ｆｕｌｌ") == [meta, 2, 2, 2, 2] != sp.encode("ｆｕｌｌ")
    assert tok.pieces("a (red:1.2) fox") == tok.pieces("a ") + tok.pieces("red") + tok.pieces(
        " fox"
    )
    assert tok.pieces(" lead") == [meta] + tok.pieces("lead")  # a leading space is its own "▁"
    # a trailing one is dropped
    assert tok.pieces("lead  ") == tok.pieces("lead") == sp.encode("lead")


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
        # one prompt, all 120 slots
        ref = t5.encode_windows(teacher.model, [window], "cpu", trim=False)[0]
        assert got.rows.shape == (t5.real_length(window), TINY_T5_CONFIG["d_model"]) == ref.shape
        assert got.seed_ids == window
        worst = max(worst, (got.rows - ref).abs().max().item() / ref.abs().max().item())
    print(
        f"batched vs per-prompt full window (fp32 CPU, {len(PROMPTS)} mixed lengths): max |Δ| / "
        f"max |ref| = {worst:.3g}"
    )
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
    code = (
        "import sys; from gguf_trainer.teachers import t5; from "
        "gguf_trainer.tiny.t5_tiny import DEMO_DIR;"
        "r = t5.check_snapshot(DEMO_DIR); print(r.summary());"
        "assert 'torch' not in sys.modules and 'transformers' not in "
        "sys.modules, 'weights were loaded'"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
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
    (snapshot / t5.WEIGHTS_INDEX).write_text(
        json.dumps(
            {
                "weight_map": {
                    "shared.weight": "model-00001-of-00002.safetensors",
                    "encoder.final_layer_norm.weight": "model-00002-of-00002.safetensors",
                }
            }
        )
    )
    with pytest.raises(UserError, match="model-00001-of-00002.safetensors is missing"):
        t5.check_snapshot(snapshot)
    (snapshot / t5.WEIGHTS_INDEX).unlink()
    with pytest.raises(UserError, match="no model.safetensors"):
        t5.check_snapshot(snapshot)


def test_snapshot_whose_weights_do_not_match_its_config(snapshot):
    config = json.loads((snapshot / "config.json").read_text())
    (snapshot / "config.json").write_text(json.dumps({**config, "d_ff": 96}))
    with pytest.raises(
        UserError,
        match=(r"DenseReluDense.wi_0.weight has shape \[128, 64\] "
               r"but config.json implies \[96, 64\]"),
    ):
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
    from gguf_trainer.tiny.t5_tiny import build_tiny_t5

    rebuilt = build_tiny_t5(tmp_path / "t5")
    shipped = sorted(p.name for p in DEMO_DIR.iterdir())
    assert shipped == sorted(p.name for p in rebuilt.iterdir())
    for name in shipped:
        assert (rebuilt / name).read_bytes() == (DEMO_DIR / name).read_bytes(), name
    assert sum((DEMO_DIR / n).stat().st_size for n in shipped) < 300_000
    assert TINY_MARKER in shipped  # eval: health "n/a" for this teacher


def test_the_shipped_data_is_package_data():
    import tomllib

    cfg = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    globs = cfg["tool"]["setuptools"]["package-data"]["gguf_trainer.packs"]
    assert any(Path("demo_materials/t5xxl_pixart/spiece.model").match(g) for g in globs)


def test_gpu_benchmark_script_runs_quick(capsys):
    import importlib.util

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_t5_gpu.py"
    spec = importlib.util.spec_from_file_location("bench_t5_gpu", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.main(["--quick", "--prompts", "32"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    assert result["modes"]["gpu"]["real_rows"] == sum(
        map(
            bench.real_len,
            bench.prompt_windows(32, bench.TINY["vocab_size"], bench.random.Random(bench.SEED)),
        )
    )
    assert result["batched_vs_single"]["max_rel"] <= 1e-6  # fp32 on the CPU; bf16 is read on a GPU


def test_ram_preflight_before_any_weight_loads():
    need = t5.encoder_gib(t5.check_snapshot(DEMO_DIR).n_params, "cpu")
    with pytest.raises(
        UserError, match=r"needs 0\.0 GiB of RAM in teacher mode cpu \(fp32 on the CPU\)"
    ):
        t5.load_t5_teacher(DEMO_DIR, "cpu", "cpu", ram_limit_gib=need / 2)


# ----------------------------------------------------------------- the pack's hooks and numbers

XXL_CONFIG = {
    "model_type": "t5",
    "d_model": 4096,
    "d_kv": 64,
    "num_heads": 64,
    "d_ff": 10240,
    "num_layers": 24,
    "vocab_size": 32128,
    "feed_forward_proj": "gated-gelu",
    "relative_attention_num_buckets": 32,
}


@pytest.fixture(scope="module")
def xxl_snapshot(tmp_path_factory):
    """A T5-XXL-shaped snapshot whose weight file is sparse: a real safetensors header naming
    every encoder tensor at its real shape, and 9.5 GB of holes (no disk used, nothing to load)."""
    root = tmp_path_factory.mktemp("t5xxl")
    (root / "config.json").write_text(json.dumps(XXL_CONFIG))
    shutil.copy(DEMO_DIR / "spiece.model", root / "spiece.model")
    table, offset = {}, 0
    for name, shape in t5.expected_encoder_tensors(XXL_CONFIG).items():
        size = 2 * int(torch.Size(shape).numel())
        table[name] = {
            "dtype": "BF16",
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    header = json.dumps(table).encode()
    with open(root / "model.safetensors", "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(8 + len(header) + offset)
    return root


def test_check_of_a_full_size_snapshot_reads_only_headers(xxl_snapshot):
    from gguf_trainer.packs import get_pack

    pack = get_pack("t5xxl_pixart")
    summary = pack.check_teacher({"teacher": xxl_snapshot})
    assert summary.startswith(
        "T5 encoder: 24 blocks, d_model 4096, 4.76B parameters (BF16, 8.87 GiB)"
    ), summary
    # the planner's figure: the pack's declared need matches the header's, bf16 with a card, fp32
    # without
    assert pack.teacher_gib({"teacher": xxl_snapshot}, "cuda") == pytest.approx(
        pack.teacher_memory_gib, abs=0.05
    )
    assert pack.teacher_gib({"teacher": xxl_snapshot}, "cpu") == pytest.approx(2 * 8.87, abs=0.01)


CARD_24 = Hardware(
    has_cuda=True, gpu_total_gib=24, gpu_free_gib=23, cpu_total_gib=64, cpu_available_gib=48
)
CARD_6 = Hardware(
    has_cuda=True, gpu_total_gib=6, gpu_free_gib=5.5, cpu_total_gib=32, cpu_available_gib=20
)
CARD_6_SMALL_RAM = Hardware(
    has_cuda=True, gpu_total_gib=6, gpu_free_gib=5.5, cpu_total_gib=16, cpu_available_gib=8
)
NO_CARD = Hardware(has_cuda=False, cpu_total_gib=32, cpu_available_gib=24)
NO_CARD_SMALL_RAM = Hardware(has_cuda=False, cpu_total_gib=16, cpu_available_gib=12)


@pytest.mark.parametrize(
    "machine,mode,refusal",
    [
        (CARD_24, "gpu", None),  # 8.9 GiB of weights + headroom fits a 24 GiB card: resident
        (
            CARD_6,
            "offload",
            None,
        ),  # a 6 GiB card streams the blocks; the weights sit in 20 GiB of RAM
        (CARD_6_SMALL_RAM, "offload", r"needs 8\.9 GiB of RAM but only 8\.0 GiB"),
        (NO_CARD, "cpu", None),  # fp32 on the CPU: 17.7 GiB of 24
        (NO_CARD_SMALL_RAM, "cpu", r"needs 17\.7 GiB of RAM but only 12\.0 GiB"),
    ],
)
def test_mode_and_preflight_with_this_packs_numbers(xxl_snapshot, machine, mode, refusal):
    from gguf_trainer.machine.hardware import gpu_need_gib, plan_teacher, preflight
    from gguf_trainer.packs import get_pack
    from gguf_trainer.store.project_schema import PrecomputeSettings

    pack, hw = get_pack("t5xxl_pixart"), machine
    need = pack.teacher_gib({"teacher": xxl_snapshot}, "cuda" if hw.has_cuda else "cpu")
    if hw.has_cuda:
        assert 11 <= gpu_need_gib(need) <= 12.5  # the "~12 GiB budget" of a resident T5-XXL
    plan = plan_teacher(need, PrecomputeSettings(), hw)
    assert plan.mode == mode
    if refusal:
        with pytest.raises(UserError, match=refusal):
            preflight(need, plan, hw)
    else:
        preflight(need, plan, hw)


def test_a_user_forced_cpu_mode_on_a_card_machine_is_checked_in_fp32(xxl_snapshot):
    from gguf_trainer.machine.hardware import Plan
    from gguf_trainer.packs import get_pack

    plan = Plan(mode="cpu", budgets=None, cpu_gib=12.0)
    with pytest.raises(UserError, match=r"needs 17\.7 GiB of RAM in teacher mode cpu"):
        get_pack("t5xxl_pixart").load_teacher({"teacher": xxl_snapshot}, plan, "cpu")


def test_health_line_waits_for_2k_steps_and_names_the_reference():
    from gguf_trainer.packs import get_pack

    pack = get_pack("t5xxl_pixart")
    early = pack.health_line({"cos": 0.41, "trained_steps": 40})
    assert early.startswith("too early to judge at 40 steps") and "0.827 at 12.5k steps" in early
    assert pack.health_line({"cos": 0.55, "trained_steps": 2500}).startswith(
        "broken: cos 0.5500 < 0.6"
    )
    assert "seed or tokenizer path is broken" in pack.health_line(
        {"cos": 0.55, "trained_steps": 2500}
    )
    assert pack.health_line({"cos": 0.82, "trained_steps": 12500}).startswith("healthy")
    assert pack.health_line({"cos": 0.83, "trained_steps": 100}).startswith("healthy")
    assert any("f16 or q8_0" in n and "0.09" in n for n in pack.engine_notes)


def test_demo_materials_are_the_shipped_tiny_snapshot(tmp_path):
    from gguf_trainer.packs import get_pack

    files = get_pack("t5xxl_pixart").demo_materials(tmp_path)
    assert set(files) == {"teacher"}
    assert (files["teacher"] / "spiece.model").read_bytes() == (
        DEMO_DIR / "spiece.model"
    ).read_bytes()
    assert t5.check_snapshot(files["teacher"]).n_tensors == 21


def test_material_status_checks_the_teacher_from_its_headers(tmp_path, snapshot, tiny_materials):
    """`gguf-trainer materials` (and the GUI's material rows): a complete teacher folder is read
    from its headers; one holding the wrong weights says so in the sentence naming the file."""
    from gguf_trainer.runner.material_status import material_statuses
    from gguf_trainer.store.project import create_project

    root = tmp_path / "proj"
    create_project(
        root,
        "t5xxl_pixart",
        overrides={
            "materials": {
                "teacher": {"path": str(snapshot)},
                "student": {"path": str(tiny_materials["student"])},
                "student_tokenizer": {"path": str(tiny_materials["tokenizer"])},
            }
        },
    )
    teacher = next(r for r in material_statuses(root) if r["id"] == "teacher")
    assert teacher["state"] == "ready" and teacher["verified"] is True, teacher
    assert teacher["note"].startswith("T5 encoder: 2 blocks, d_model 64"), teacher
    config = json.loads((snapshot / "config.json").read_text())
    (snapshot / "config.json").write_text(json.dumps({**config, "d_model": 128}))
    teacher = next(r for r in material_statuses(root) if r["id"] == "teacher")
    assert teacher["state"] == "failed" and teacher["verified"] is False, teacher
    assert "config.json implies" in teacher["error"], teacher


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["gpu", "offload"])
def test_card_modes_match_the_cpu_teacher(mode, teacher):
    """On a CUDA machine: resident and streamed bf16 teachers give the fp32 CPU rows to bf16
    accuracy."""
    on_card = t5.load_t5_teacher(DEMO_DIR, "cuda", mode)
    try:
        for got, ref in zip(on_card.targets(PROMPTS), teacher.targets(PROMPTS)):
            assert got.seed_ids == ref.seed_ids and got.rows.device.type == "cpu"
            cos = torch.nn.functional.cosine_similarity(got.rows.float(), ref.rows, dim=-1)
            assert cos.min().item() > 0.99, (mode, cos.min().item())
    finally:
        on_card.close()
