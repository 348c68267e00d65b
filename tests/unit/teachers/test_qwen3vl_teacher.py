"""The MageFlow pack's real teacher on a tiny real Qwen3-VL (the transformers class, seeded
random weights, the real Qwen tokenizer): the engine's template counts and splice positions,
raw merger rows from the vision tower, the text stack over the template with those rows
spliced (checked against transformers' own pieces), batching that does not leak, the refusals,
and the ridge fit of vision_proj."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from gguf_trainer.base.errors import UserError
from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.engine.qwen_vl_images import patchify, preprocess_image, vision_tokens
from gguf_trainer.model.student import load_tokenizer
from gguf_trainer.model.vision import fit_vision_proj, image_runs, load_teacher_table
from gguf_trainer.packs import get_pack
from gguf_trainer.teachers import qwen3vl
from gguf_trainer.teachers.base import VisionSegment
from gguf_trainer.tiny.qwen3vl import HIDDEN, copy_tiny_qwen3vl

PACK = get_pack("qwen3vl_mageflow")


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    return copy_tiny_qwen3vl(tmp_path_factory.mktemp("qwen3vl") / "Qwen3-VL-tiny")


@pytest.fixture(scope="module")
def teacher(snapshot):
    t = qwen3vl.load_qwen3vl_teacher(snapshot, "cpu", "cpu", student_pieces=PACK.student_pieces,
                                     template=PACK.teacher_template())
    yield t
    t.close()


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pics")
    rng = np.random.default_rng(0)
    out = []
    for i, (h, w) in enumerate(((100, 150), (64, 64), (300, 200))):
        path = folder / f"p{i}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
        out.append(path)
    return out


def test_templates_have_the_engines_counts_with_the_real_tokenizer(qwen_tokenizer_dir):
    counts = qwen3vl.check_templates(load_tokenizer(qwen_tokenizer_dir), PACK.teacher_template())
    assert counts["edit prefix"] == 64 and counts["text-to-image prefix"] == 34
    assert all(counts[f"image {i} header"] == 6 for i in range(1, 10))


def test_a_tokenizer_with_other_counts_is_refused_naming_the_template():
    def words(text, add_special_tokens=False):  # a whitespace tokenizer: every count differs
        return {"input_ids": list(range(len(text.split())))}

    with pytest.raises(UserError, match="edit prefix is .* tokens .* hard-codes 64"):
        qwen3vl.check_templates(words, PACK.teacher_template())


def test_splice_positions_are_70_then_plus_1_n_6(qwen_tokenizer_dir):
    assert qwen3vl.splice_starts([144], PACK.teacher_template()) == [70]
    assert qwen3vl.splice_starts([12, 30, 4], PACK.teacher_template()) == [
        70,
        70 + 1 + 12 + 6,
        70 + 1 + 12 + 6 + 1 + 30 + 6,
    ]
    tok = load_tokenizer(qwen_tokenizer_dir)
    counts = [12, 30]
    ids = _ids(tok, Sample("put the cat from Image 1 into Image 2", ("a", "b")), counts)
    assert image_runs(ids, qwen3vl.IMAGE_PAD_ID) == [(70, 12), (89, 30)]
    qwen3vl.check_splices(ids, counts, PACK.teacher_template())
    with pytest.raises(UserError, match="not at row 70"):
        qwen3vl.check_splices(ids[1:], counts, PACK.teacher_template())


def test_vision_rows_are_the_raw_merger_output(teacher, snapshot, pictures):
    from transformers import Qwen3VLModel

    rows = teacher.vision(pictures)
    assert [tuple(r.shape) for r in rows] == [
        (vision_tokens(100, 150), HIDDEN),
        (4, HIDDEN),
        (54, HIDDEN),
    ]
    ref = Qwen3VLModel.from_pretrained(str(snapshot), dtype=torch.float32).eval()
    for path, got in zip(pictures, rows):
        px, grid = patchify(preprocess_image(path))
        with torch.no_grad():
            out = ref.get_image_features(torch.from_numpy(px), torch.tensor([grid]))
        assert torch.allclose(got, out.pooler_output[0], atol=1e-5)  # main merger, no deepstack
        assert got.shape[0] == grid[1] * grid[2] // 4


def _ids(tok, sample, counts=()):
    """The engine's student ids of the sample's template with `counts` vision rows per image."""
    return PACK.student_ids(engine_bpe(tok).encode, sample, list(counts))


def test_targets_are_the_final_norm_states_with_images_spliced(teacher, snapshot, pictures):
    """Against transformers' pieces: embeddings with the merger rows scattered over the image
    pads, the text model with every M-RoPE axis at the token's position, no deepstack."""
    from transformers import Qwen3VLModel

    ref = Qwen3VLModel.from_pretrained(str(snapshot), dtype=torch.float32).eval()
    tok = teacher.tokenizer
    rows = teacher.vision(pictures[:2])
    edit = Sample("put the square from Image 1 into Image 2", tuple(pictures[:2]))
    text = Sample("a red fox in the snow")
    ids = [_ids(tok, edit, [r.shape[0] for r in rows]), _ids(tok, text)]
    segs = [
        [VisionSegment(s, r) for (s, _), r in zip(image_runs(ids[0], qwen3vl.IMAGE_PAD_ID), rows)],
        [],
    ]
    out = teacher.targets([edit, text], ids, segs)
    assert [o.sup_start for o in out] == [64, 34]
    assert [tuple(o.rows.shape) for o in out] == [(len(ids[0]), HIDDEN), (len(ids[1]), HIDDEN)]
    with torch.no_grad():
        x = torch.tensor([ids[0]])
        emb = ref.get_input_embeddings()(x)
        emb[x == qwen3vl.IMAGE_PAD_ID] = torch.cat(rows)
        pos = torch.arange(x.shape[1]).view(1, 1, -1).expand(3, 1, -1)
        want = ref.language_model(inputs_embeds=emb, position_ids=pos).last_hidden_state[0]
        # text-only: HF's own path
        plain = ref(input_ids=torch.tensor([ids[1]])).last_hidden_state[0]
    assert torch.allclose(out[0].rows, want, atol=1e-4)
    assert torch.allclose(out[1].rows, plain, atol=1e-4)
    # one at a time gives the same rows: right padding does not leak into real rows
    alone = teacher.targets([text], [ids[1]], [[]])[0].rows
    assert torch.allclose(alone, out[1].rows, atol=1e-5)
    # the image rows matter
    other = teacher.targets(
        [edit], [ids[0]], [[VisionSegment(s.start, torch.zeros_like(s.rows)) for s in segs[0]]]
    )
    assert not torch.allclose(other[0].rows[70:], out[0].rows[70:], atol=1e-3)


def test_ids_the_teacher_does_not_share_are_refused(teacher):
    tok = teacher.tokenizer
    sample = Sample("make it night")
    ids = _ids(tok, sample)
    with pytest.raises(UserError, match="different ids"):
        teacher.targets([sample], [ids[:-1] + [7]], [[]])


def test_snapshot_checks_from_headers(snapshot, tmp_path):
    report = qwen3vl.check_snapshot(snapshot)
    assert report.text_hidden == report.vis_dim == HIDDEN and report.vocab == 151936
    assert report.gib("cpu") == pytest.approx(2 * report.gib("gpu"))
    assert PACK.teacher_gib({"teacher": snapshot}, "cpu") == pytest.approx(report.gib("cpu"))
    bad = tmp_path / "bad"
    shutil.copytree(snapshot, bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen3"}))
    with pytest.raises(UserError, match="not a Qwen3-VL config"):
        qwen3vl.check_snapshot(bad)
    (bad / "config.json").write_text(json.dumps(cfg))
    (bad / "model.safetensors").write_bytes((bad / "model.safetensors").read_bytes()[:5000])
    with pytest.raises(UserError, match="cut short|not a complete"):
        qwen3vl.check_snapshot(bad)
    with pytest.raises(UserError, match="needs a CUDA device"):
        qwen3vl.load_qwen3vl_teacher(
            snapshot,
            "cpu",
            "gpu",
            student_pieces=PACK.student_pieces,
            template=PACK.teacher_template(),
        )


def test_the_ridge_fit_recovers_a_known_linear_map(snapshot):
    """vision_proj's fit over the shared vocabulary: with student rows an exact linear image of
    the teacher's real (tiny) table, the fitted map is that map."""
    table = load_teacher_table(snapshot)
    assert table.shape == (151936, HIDDEN)
    a = torch.randn(32, HIDDEN, generator=torch.Generator().manual_seed(0))
    weight, fit = fit_vision_proj(table, table @ a.T)
    assert weight.shape == (32, HIDDEN)
    assert torch.allclose(weight, a, atol=1e-3)
    assert fit["cos_mean"] > 0.9999 and fit["rel_mse"] < 1e-6 and fit["shared_vocab"] == 151936


def test_gpu_benchmark_script_runs_quick(capsys):
    """The prepared GPU benchmark, on the tiny dims on the CPU: the script itself works."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_qwen3vl_gpu.py"
    spec = importlib.util.spec_from_file_location("bench_qwen3vl_gpu", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.main(["--quick"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    assert result["gpu"]["samples"] == 12 and result["gpu"]["tokens"] > 12 * 34
    assert result["offload"].startswith("skipped")


def test_offload_placement_streams_the_text_stack_and_keeps_the_rows(teacher, snapshot, pictures):
    """The offload placement (accelerate cpu_offload on the text stack, the embedding table a
    plain RAM module), exercised with the CPU as the execution device: the text weights leave
    the module (meta), the table stays, and the rows are the resident teacher's."""
    from transformers import Qwen3VLModel

    model = Qwen3VLModel.from_pretrained(str(snapshot), dtype=torch.float32).eval()
    qwen3vl.place(model.language_model, model.visual, torch.device("cpu"), "offload")
    assert model.language_model.layers[0].mlp.up_proj.weight.device.type == "meta"
    assert model.language_model.embed_tokens.weight.device.type == "cpu"
    streamed = qwen3vl.Qwen3VLTeacher(
        model, teacher.tokenizer, "cpu", "offload", PACK.student_pieces, PACK.teacher_template()
    )
    rows = teacher.vision(pictures[:1])
    sample = Sample("make it night", tuple(pictures[:1]))
    ids = _ids(teacher.tokenizer, sample, [rows[0].shape[0]])
    segs = [[VisionSegment(70, rows[0])]]
    want = teacher.targets([sample], [ids], segs)[0].rows
    got = streamed.targets([sample], [ids], segs)[0].rows
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(streamed.vision(pictures[:1])[0], rows[0], atol=1e-5)


def test_health_line_has_the_reference_and_the_vision_hint():
    lagging = PACK.health_line({"cos_slice": 0.70, "cos_vis": 0.55, "cos_txt": 0.95})
    assert "cos_slice 0.7000" in lagging and "0.915 = vision 0.80 / text 0.98" in lagging
    assert "vis_in or the width is the limiter" in lagging
    even = PACK.health_line({"cos_slice": 0.91, "cos_vis": 0.80, "cos_txt": 0.98})
    assert "limiter" not in even and "cos_vis 0.8000" in even
    assert PACK.health_line({"cos": 0.5}) is None


def test_vision_batches_by_the_token_cap_give_the_same_rows(teacher, pictures, monkeypatch):
    whole = teacher.vision(pictures)
    monkeypatch.setitem(qwen3vl.VIS_TOKENS_PER_BATCH, "cpu", 5)  # one picture per tower call
    calls = []  # pictures per tower call (teachers/qwen3vl.run_tower)
    hook = teacher.visual.register_forward_pre_hook(
        lambda _m, _args, kwargs: calls.append(len(kwargs["grid_thw"])), with_kwargs=True
    )
    try:
        split = teacher.vision(pictures)
    finally:
        hook.remove()
    assert calls == [1, 1, 1]
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(whole, split))


def test_a_snapshot_whose_tokenizer_breaks_the_template_is_refused_at_load(snapshot, tmp_path):
    """Without `<|im_start|>` as one added token, the edit prefix is no longer 64 tokens: the
    load refuses before any weight is read, naming the template."""
    bad = tmp_path / "snap"
    shutil.copytree(snapshot, bad)
    tok = json.loads((bad / "tokenizer.json").read_text(encoding="utf-8"))
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] != "<|im_start|>"]
    (bad / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    cfg = json.loads((bad / "tokenizer_config.json").read_text(encoding="utf-8"))
    cfg["added_tokens_decoder"] = {
        k: v
        for k, v in cfg.get("added_tokens_decoder", {}).items()
        if v["content"] != "<|im_start|>"
    }
    cfg["additional_special_tokens"] = [
        t for t in cfg.get("additional_special_tokens", []) if t != "<|im_start|>"
    ]
    (bad / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    with pytest.raises(UserError, match="MageFlow edit prefix is [0-9]+ tokens .* hard-codes 64"):
        qwen3vl.load_qwen3vl_teacher(
            bad, "cpu", "cpu", student_pieces=PACK.student_pieces, template=PACK.teacher_template()
        )


def test_every_copy_of_the_tiny_snapshot_is_the_same_bytes(snapshot, tmp_path):
    """The demo's weights are built from a fixed seed at copy time: same files, same identity."""
    again = copy_tiny_qwen3vl(tmp_path / "again")
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (again / name).read_bytes() == (snapshot / name).read_bytes(), name


def test_the_disk_preflight_estimates_the_reference_mix(tmp_path, monkeypatch):
    """~2.4 MB per image sample, ~0.43 MB per text sample; the full default mix needs ~170 GB,
    and a disk with 1 GB free is refused before any shard, with both numbers."""
    from gguf_trainer.machine import disk_space
    from gguf_trainer.packs.qwen3vl_mageflow import IMAGE_SAMPLE_BYTES, TEXT_SAMPLE_BYTES
    from gguf_trainer.stages import precompute_inputs
    from gguf_trainer.store.project import create_project, load_project

    assert 2.3e6 < IMAGE_SAMPLE_BYTES < 2.5e6 and 0.4e6 < TEXT_SAMPLE_BYTES < 0.45e6
    monkeypatch.setattr("gguf_trainer.base.paths.PROJECTS_ROOT", tmp_path / "projects")
    root = tmp_path / "projects" / "mf"
    create_project(root, "qwen3vl_mageflow")
    proj = load_project(root)
    need = disk_space.precompute_need_bytes(proj)
    assert 150e9 < need < 200e9
    monkeypatch.setattr(disk_space, "free_bytes", lambda path: 10**9)
    with pytest.raises(UserError, match=r"needs 1\d\d\.\d\d GB more .* only 1\.00 GB"):
        precompute_inputs.disk_preflight(proj, "val")
