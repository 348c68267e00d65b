"""The layerwise families: the engine's pads (template_padding.py), each pack's template pieces,
the tap teacher on tiny real Qwen3 / Qwen3-VL teachers (raw taps, ascending stack, pads masked
as keys, FLUX.3's pads at rope position 1, batched = per prompt), Fibo 2.0's normalisation, and
the export's refusal of another tap count."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_reference import FIBO2_TAPS, fibo2_bundles, tap_slices

from gguf_trainer.base.errors import UserError
from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.engine.qwen_ids import PAD_ID
from gguf_trainer.engine.template_ids import Piece, template_ids
from gguf_trainer.engine.template_padding import Padding
from gguf_trainer.model.student import load_tokenizer
from gguf_trainer.packs import get_pack, pack_ids
from gguf_trainer.teachers.qwen_taps import load_tap_teacher
from gguf_trainer.tiny import qwen_tokenizer_dir
from gguf_trainer.tiny.qwen_taps import HIDDEN

LAYERWISE = ("qwen3vl_krea2", "qwen3vl_flux3", "qwen3vl_fibo2", "qwen3vl_ideogram4", "qwen3vl_sefi",
             "qwen3_flux2_klein")
# ggk 0.9.7: (taps, start, min_length, multiple, max_length, pad position) per pack, read from
# conditioner.hpp 3295-3305, 3549-3561, 3562-3573, 3574-3585, 3383-3390 and fibo2.hpp 39-42,
# 316-326.
ENGINE = {
    "qwen3vl_krea2": ((2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35), 34, 0, 0, 0, None),
    "qwen3vl_flux3": ((4, 8, 12, 16, 20, 24, 28, 32), 0, 0, 80, 4096, 1),
    "qwen3vl_fibo2": (FIBO2_TAPS, 0, 0, 0, 4096, None),
    "qwen3vl_ideogram4": ((1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 34, 36), 0, 0, 0, 0, None),
    "qwen3vl_sefi": ((9, 18, 27), 0, 1024, 0, 0, None),
    "qwen3_flux2_klein": ((9, 18, 27), 0, 512, 0, 0, None),
}
PROMPTS = ("a sheep in sunglasses", "a (red:1.3) fox, [blurry] background", "", "x " * 90)


@pytest.fixture(scope="module")
def encode():
    return engine_bpe(load_tokenizer(qwen_tokenizer_dir())).encode


@pytest.fixture(scope="module")
def tiny(tiny_tap_teacher):
    return {arch: tiny_tap_teacher(arch, 36) for arch in ("qwen3", "qwen3_vl")}


def test_padding_is_pad_tokens():
    """tokenizer.cpp pad_tokens with FLUX.3's min_length (conditioner.hpp 2610-2615)."""
    flux3 = Padding(multiple=80, max_length=4096, pad_position=1)
    assert flux3.apply([5] * 3) == [5] * 3 + [PAD_ID] * 77
    assert flux3.apply([5] * 80) == [5] * 80
    assert flux3.apply([5] * 81) == [5] * 81 + [PAD_ID] * 79
    assert flux3.apply([5] * 4100) == [5] * 4096  # over max_length: cut, not padded
    klein = Padding(min_length=512)
    assert klein.apply([5] * 600) == [5] * 600  # longer than min_length: no pads, no cut
    ids = klein.apply([7, 8])
    assert len(ids) == 512 and klein.real_length(ids) == 2 and klein.positions(ids) is None
    assert flux3.positions(flux3.apply([7, 8])) == [0, 1] + [1] * 78
    assert Padding().apply([PAD_ID]) == [PAD_ID] and Padding().real_length([PAD_ID]) == 1


@pytest.mark.parametrize("pid", LAYERWISE)
def test_pack_declares_the_engine_family(pid, encode):
    pack = get_pack(pid)
    taps, start, min_length, multiple, max_length, pad_pos = ENGINE[pid]
    assert pid in pack_ids() and pack.adapter_kind == "layerwise"
    assert tuple(pack.taps) == taps and pack.start == start
    assert (pack.padding.min_length, pack.padding.multiple) == (min_length, multiple)
    assert (pack.padding.max_length, pack.padding.pad_position) == (max_length, pad_pos)
    assert pack.out_dim == len(taps) * pack.teacher_hidden
    assert pack.adapter_config(type("T", (), {"width": 128, "depth": 2})(), 1024).taps == taps
    assert "--llm {student} --llm-adapter {adapter}" in pack.engine_command_template
    for text in PROMPTS:
        ids = pack.student_ids(encode, Sample(text))
        joined = encode(pack.format_prompt(text))
        n = pack.padding.real_length(ids)
        if pack.one_piece:  # no prompt range: the joined template, weight syntax as text
            assert ids[:n] == joined
        else:
            pieces = [Piece(pack.prefix), Piece(text, prompt=True), Piece(pack.suffix)]
            assert ids[:n] == template_ids(encode, pieces)
        assert ids[n:] == [PAD_ID] * (len(ids) - n)
        if min_length:
            assert len(ids) == max(min_length, n)
        if multiple:
            assert len(ids) % multiple == 0 and len(ids) - n < multiple
    if start:  # Krea2: the engine drops the 34 prefix rows
        assert len(encode(pack.prefix)) == start


def test_krea2_prefix_and_file_name_are_the_engines():
    pack = get_pack("qwen3vl_krea2")
    assert pack.default_name == "qwen3vl_layerwise_adapter"  # conditioner.hpp 2824
    assert get_pack("qwen3vl_flux3").default_name == "qwen3vl_4b_it_adapter"  # 2829
    assert pack.prefix.startswith("<|im_start|>system\nDescribe the image by detailing")


def _hf_states(teacher, ids):
    x = torch.tensor([ids])
    with torch.no_grad():
        return teacher.text(input_ids=x, attention_mask=torch.ones_like(x),
                            output_hidden_states=True).hidden_states


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_vl"])
def test_taps_are_raw_layer_outputs_in_ascending_order(arch, tiny, encode):
    """tap k = decoder layer k's raw output (1-based); k = 36 = num_layers is before the final
    norm; no taps = the final norm (llm.hpp 1779-1815)."""
    pack = get_pack("qwen3vl_ideogram4")  # taps 1 .. 36, no pads
    teacher = load_tap_teacher(tiny[arch], "cpu", pack.student_pieces, pack.tap_layout())
    sample = Sample("a sheep in sunglasses")
    ids = pack.student_ids(encode, sample)
    rows = teacher.targets([sample], [ids])[0].rows
    assert rows.shape == (len(ids), 13 * HIDDEN)
    hs = _hf_states(teacher, ids)  # hs[k] = layer k's output for k < 36, hs[36] = the final norm
    taps = tap_slices(rows.numpy(), 13)
    for k, tap in zip(pack.taps, taps):
        if k < 36:
            assert np.allclose(tap, hs[k][0].numpy(), atol=1e-5), k
    raw_last = torch.from_numpy(taps[-1])
    assert not torch.allclose(raw_last, hs[36][0], atol=1e-3)  # before the norm ...
    # ... which gives hs[36]
    assert torch.allclose(teacher.text.norm(raw_last), hs[36][0], atol=1e-4)
    final = load_tap_teacher(tiny[arch], "cpu", pack.student_pieces,
                             type(pack.tap_layout())(taps=())).targets([sample], [ids])[0].rows
    assert torch.allclose(final, hs[36][0], atol=1e-5)


@pytest.mark.parametrize("pid", LAYERWISE)
def test_batched_is_per_prompt_and_pads_are_masked_keys(pid, tiny, encode):
    pack = get_pack(pid)
    arch = pack.teacher_arch
    teacher = load_tap_teacher(tiny[arch], "cpu", pack.student_pieces, pack.tap_layout())
    samples = [Sample(t) for t in PROMPTS]
    ids = [pack.student_ids(encode, s) for s in samples]
    batched = teacher.targets(samples, ids)
    for s, i, b in zip(samples, ids, batched):
        one = teacher.targets([s], [i])[0]
        assert one.rows.shape == (len(i), len(pack.taps) * HIDDEN)
        assert float((one.rows - b.rows).norm() / one.rows.norm()) < 1e-5
        assert b.sup_start == pack.start
    # the real rows do not see the pads (masked keys): the unpadded run gives the same rows
    i = ids[0]
    n = pack.padding.real_length(i)
    bare = teacher.run(torch.tensor([i[:n]]), torch.ones(1, n, dtype=torch.long),
                       torch.arange(n)[None])[0]
    assert float((bare - batched[0].rows[:n]).norm() / bare.norm()) < 1e-5
    pads = batched[0].rows[n:]
    if pack.padding.pad_position is not None:  # FLUX.3: every pad at position 1, the same state
        assert len(pads) > 1 and torch.allclose(pads, pads[:1].expand_as(pads), atol=1e-5)
    elif len(pads) > 1:  # elsewhere each pad has its own position
        assert not torch.allclose(pads[0], pads[-1], atol=1e-3)


def test_teacher_refuses_ids_that_are_not_the_students(tiny, encode):
    pack = get_pack("qwen3vl_krea2")
    teacher = load_tap_teacher(tiny["qwen3_vl"], "cpu", pack.student_pieces, pack.tap_layout())
    s = Sample("a fox")
    with pytest.raises(UserError, match="different ids"):
        teacher.targets([s], [encode(pack.format_prompt("a fox"))[:-1]])


def test_a_teacher_too_shallow_for_the_taps_is_refused(tiny_tap_teacher):
    root = tiny_tap_teacher("qwen3_vl", 20)
    pack = get_pack("qwen3vl_krea2")
    with pytest.raises(UserError, match="20 decoder layers but the family taps layer 35"):
        load_tap_teacher(root, "cpu", pack.student_pieces, pack.tap_layout(), family="Krea2")
    with pytest.raises(UserError, match="20 decoder layers"):
        pack.check_teacher({"teacher": root})


def test_fibo2_targets_are_the_raw_taps_the_engine_normalises_itself(tiny, encode):
    """fibo2.hpp 338: make_bundles runs on encode_prompt's output whether it came from the full
    teacher or from the adapter, and RMS-normalises each tap (167-195). So the adapter emits the
    raw stack, as the teacher produces it: the pack's targets are NOT normalised (or the engine
    would normalise twice... which is idempotent, but a normalised target throws away each tap's
    scale the engine never reads, and the raw stack is what the full teacher hands make_bundles)."""
    pack = get_pack("qwen3vl_fibo2")
    assert pack.out_dim == 38400  # fibo2.hpp 331-336: 15 x 2560
    teacher = load_tap_teacher(tiny["qwen3_vl"], "cpu", pack.student_pieces, pack.tap_layout())
    s = Sample("a sheep in sunglasses")
    rows = teacher.targets([s], [pack.student_ids(encode, s)])[0].rows.numpy()
    rms = [np.sqrt((t.astype(np.float64) ** 2).mean(-1)) for t in tap_slices(rows, 15)]
    assert not all(np.allclose(r, 1.0, atol=0.05) for r in rms)  # raw, not normalised
    bundles = fibo2_bundles(rows, HIDDEN)
    assert bundles.shape == (rows.shape[0], 18 * HIDDEN)
    for b in tap_slices(bundles, 18):  # what the DiT gets: every tap at unit RMS, bf16
        assert np.allclose(np.sqrt((b.astype(np.float64) ** 2).mean(-1)), 1.0, atol=1e-2)
    # a per-tap scale of the adapter's output is invisible to the DiT (up to the bf16 rounding)
    scaled = np.concatenate([t * (k + 1.5) for k, t in enumerate(tap_slices(rows, 15))], -1)
    assert np.allclose(fibo2_bundles(scaled, HIDDEN), bundles, atol=1e-2)


def test_fibo2_captions_are_the_engines():
    from gguf_trainer.engine.fibo2 import NULL_CAPTION, fibo2_caption

    assert fibo2_caption("") == NULL_CAPTION
    assert fibo2_caption("a sheep") == "a sheep"
    assert fibo2_caption("[1, 2]") == "[1, 2]"  # not an object: as typed
    got = fibo2_caption(
        '{"short_description": "a fox", "objects": [], "aesthetic_score": 7, '
        '"lighting": {"preference_score": 1, "kind": "soft"}, "context": ""}'
    )
    assert got == '{"short_description":"a fox","lighting":{"kind":"soft"}}'
    assert (
        fibo2_caption('{"short_description": "x", "text_render": []}')
        == '{"short_description":"x","text_render":[]}'
    )


def test_fibo2_captions_parse_and_dump_as_nlohmann_does():
    """What the engine's format_prompt gave for these (tests/engine, fibo2.hpp 88-151): a
    non-object structured caption that is empty is "{}", NaN / Infinity / numbers past a double /
    lone surrogates are no JSON (the text as typed), a BOM is skipped, an integer past uint64 is a
    double, and doubles are written as nlohmann writes them (exponent from 10^15 up)."""
    from gguf_trainer.engine.fibo2 import fibo2_caption

    assert fibo2_caption('{"structured_caption":null}') == "{}"
    assert fibo2_caption('{"structured_caption":[]}') == "{}"
    for text in ('{"a":NaN}', '{"x":1E400}', '{"lone":"\\ud800"}'):
        assert fibo2_caption(text) == text
    assert fibo2_caption('\ufeff{"bom":"yes"}') == '{"bom":"yes"}'
    assert fibo2_caption('{"huge":12345678901234567890123,"u64":18446744073709551615,"m":-0}') == (
        '{"huge":1.2345678901234568e+22,"u64":18446744073709551615,"m":0}')
    assert fibo2_caption('{"e15":1e15,"p":1234567890123456.0,"e14":1e14,"s":1e-05,"n":-0.0}') == (
        '{"e15":1e+15,"p":1.234567890123456e+15,"e14":100000000000000.0,"s":1e-05,"n":-0.0}')


def test_check_reads_a_layerwise_dump_and_reports_each_tap(tmp_path, tiny_materials, encode):
    """`gguf-trainer check` on a FLUX.3 dump (the whole padded template, n * D per row): the
    engine_reference run of the file matches, and a spoiled tap shows in its own figure only."""
    from engine_reference import engine_forward

    from gguf_trainer.check import format_check, run_check
    from gguf_trainer.model.adapters import build_adapter
    from gguf_trainer.model.export import write_adapter_gguf
    from gguf_trainer.model.student import load_student

    pack = get_pack("qwen3vl_flux3")
    student = load_student(tiny_materials["student"], tiny_materials["tokenizer"])
    cfg = pack.adapter_config(
        type("T", (), {"width": 64, "depth": 1})(), student.hidden_size, out_dim=8 * 16
    )
    torch.manual_seed(0)
    module = build_adapter(cfg)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn_like(p))
    adapter = tmp_path / "pig_qwen3vl_4b_it_adapter-f16.gguf"
    write_adapter_gguf(adapter, module.state_dict(), cfg, metadata={"adapter.pack": pack.id})
    prompt = "a sheep in sunglasses"
    ids = pack.student_ids(engine_bpe(student.tokenizer).encode, Sample(prompt))
    n = pack.padding.real_length(ids)
    assert len(ids) == 80 and n < 80
    x = torch.tensor([ids])
    keep = (torch.arange(80) < n).long()[None]
    pos = torch.tensor([list(range(n)) + [1] * (80 - n)])
    hidden = student.hidden(x, keep, position_ids=pos)[0].numpy()
    out = engine_forward(adapter, hidden).astype("<f4")
    dump = tmp_path / "dump"
    dump.mkdir()
    out.tofile(dump / "adapter_out.bin")
    hidden.astype("<f4").tofile(dump / "qwen_hidden.bin")
    (dump / "tokens.txt").write_text("\n".join(map(str, ids)) + "\n")
    res = run_check(adapter, tiny_materials["student"], dump, prompt, tiny_materials["tokenizer"])
    assert res["pack"] == "qwen3vl_flux3" and res["rows"] == 80 and res["tokens_checked"]
    assert res["cos"] > 0.99999 and res["student_cos"] > 0.99999
    assert res["per_tap"]["taps"] == [4, 8, 12, 16, 20, 24, 28, 32]
    assert all(c > 0.99999 for c in res["per_tap"]["cos"])
    assert res["verdict"].startswith("n/a") and "per tap:  L4 1.0000" in format_check(res)
    # the lead: the token rows and the pads apart, each centred on its own mean, per tap
    assert res["lead"]["tokens"]["cos_centered"] > 0.9999 and res["lead"]["pads"]["rows"] > 0
    assert res["lead"]["tokens"]["rows"] + res["lead"]["pads"]["rows"] < 80  # no shared lead
    assert format_check(res).splitlines()[2].startswith("tokens:   centred cosine 1.0000")
    spoiled = out.copy()
    spoiled[:, 3 * 16 : 4 * 16] = -spoiled[:, 3 * 16 : 4 * 16]  # tap 16 negated
    spoiled.tofile(dump / "adapter_out.bin")
    cos = run_check(adapter, tiny_materials["student"], dump, prompt, tiny_materials["tokenizer"])[
        "per_tap"
    ]["cos"]
    assert cos[3] < -0.99 and all(c > 0.99999 for k, c in enumerate(cos) if k != 3)


@pytest.mark.parametrize("pid", LAYERWISE)
def test_readme_has_the_family_row_and_the_exact_ggk_command(pid):
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    pack = get_pack(pid)
    from gguf_trainer.store.results import printed_command

    cmd = printed_command(pack)[0]  # as every place prints it
    assert f"| `{pid}` | `{cmd}`" in readme


def test_results_line_names_each_taps_cosine(tmp_path):
    """The results line (status, GUI Output, the demo's summary) carries eval.json's per-tap
    figures beside the whole stack's."""
    import json as _json

    from gguf_trainer.store.project import create_project, load_project
    from gguf_trainer.store.results import describe_results

    root = tmp_path / "p"
    create_project(root, "qwen3vl_sefi")
    proj = load_project(root)
    proj.paths.eval_json.write_text(
        _json.dumps(
            {
                "headline": "cos",
                "val_cos": 0.8,
                "baseline": {"baseline_cos": 0.5},
                "health": "n/a: x",
                "per_tap": {
                    "taps": [9, 18, 27],
                    "cos": [0.9, 0.8, 0.7],
                    "baseline_cos": [0.6, 0.5, 0.4],
                },
            }
        )
    )
    line = describe_results(root)["eval_line"]
    assert line.endswith("per tap: L9 0.900 (0.600), L18 0.800 (0.500), L27 0.700 (0.400)")


def test_export_refuses_a_stack_that_is_not_the_packs(tmp_path):
    """The engine aborts unless the adapter's tap count is the family's: a checkpoint whose taps
    are not the pack's is refused with a sentence before anything is written."""
    from gguf_trainer.model.adapters import AdapterConfig
    from gguf_trainer.stages.export import export_checkpoint
    from gguf_trainer.store.project import create_project, load_project

    root = tmp_path / "p"
    create_project(root, "qwen3vl_sefi")
    proj = load_project(root)
    cfg = AdapterConfig("layerwise", 64, 2 * 16, 64, 1, taps=(9, 18))
    ck = {"config": cfg.to_dict(), "step": 1, "planned_steps": 1, "model": {}}
    dest = tmp_path / "out.gguf"
    with pytest.raises(UserError, match=r"emits 2 taps \[9, 18\].*conditions on \[9, 18, 27\]"):
        export_checkpoint(proj, "last", dest, False, ck=ck)
    assert not dest.exists()


def test_preflight_need_is_the_text_stack_from_the_headers(tiny, tmp_path):
    """teacher_gib: the text stack's parameters (no tower, no LM head) x 4 bytes on a CPU, x 2
    on a card, read from the safetensors headers; a missing shard is a sentence."""
    import shutil

    from gguf_trainer.tiny.qwen_taps import build_tiny_tap_teacher

    pack = get_pack("qwen3vl_krea2")
    model, _ = build_tiny_tap_teacher("qwen3_vl", 36)
    n = sum(p.numel() for p in model.model.language_model.parameters())
    assert pack.teacher_gib({"teacher": tiny["qwen3_vl"]}, "cpu") == pytest.approx(n * 4 / 1024**3)
    assert pack.teacher_gib({"teacher": tiny["qwen3_vl"]}, "cuda") == pytest.approx(n * 2 / 1024**3)
    broken = tmp_path / "broken"
    shutil.copytree(tiny["qwen3_vl"], broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(UserError, match="no \\*.safetensors weights"):
        pack.teacher_gib({"teacher": broken}, "cpu")
