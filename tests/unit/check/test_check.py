"""`gguf-trainer check`: an exported adapter against a ggk SD_DUMP_COND dump. The "engine" dump
is written by the independent NumPy forward in tests/engine_reference.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from engine_reference import engine_forward

from gguf_trainer.base.errors import UserError
from gguf_trainer.check import (
    check_main,
    check_seed_ids,
    compare,
    format_check,
    read_dump,
    run_check,
    verdict_line,
)
from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.model.adapters import AdapterConfig, build_adapter
from gguf_trainer.model.export import write_adapter_gguf
from gguf_trainer.model.student import load_student
from gguf_trainer.packs import get_pack

PROMPT = "a sheep in sunglasses"
HIDDEN = 64  # the tiny student's hidden size
# the tiny student reads it as 4 tokens like PROMPT: only the T5 ids tell the two dumps apart
OTHER = "a goat in sunglasses"


def _write_adapter(path, cfg: AdapterConfig, pack: str, seed: int = 0):
    torch.manual_seed(seed)
    module = build_adapter(cfg)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn_like(p))  # away from the init so rows differ per query
    write_adapter_gguf(path, module.state_dict(), cfg, metadata={"adapter.pack": pack})
    return path


@pytest.fixture(scope="module")
def student(tiny_materials):
    return load_student(tiny_materials["student"], tiny_materials["tokenizer"])


def _engine_dump(folder, adapter, student, pack: str, prompt: str, seed_ids=None):
    """What ggk writes for one prompt: adapter_out.bin (+ tokens.txt or t5_ids.txt)."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = get_pack(pack).student_ids(engine_bpe(student.tokenizer).encode, Sample(prompt))
    x = torch.tensor([ids])
    hidden = student.hidden(x, torch.ones_like(x))[0].numpy()
    out = engine_forward(adapter, hidden, seed_ids=seed_ids).astype("<f4")
    out.tofile(folder / "adapter_out.bin")
    hidden.astype("<f4").tofile(folder / "qwen_hidden.bin")
    if seed_ids is None:
        (folder / "tokens.txt").write_text("\n".join(map(str, ids)) + "\n")
    else:
        (folder / "t5_ids.txt").write_text("\n".join(map(str, seed_ids)) + "\n")
    return out


@pytest.fixture(scope="module")
def llada_case(tmp_path_factory, student):
    root = tmp_path_factory.mktemp("check")
    cfg = AdapterConfig("resampler", HIDDEN, 2560, 64, 1, num_queries=256)
    adapter = _write_adapter(root / "pig_llada_adapter-f16.gguf", cfg, "llada_image")
    ref = _engine_dump(root / "dump", adapter, student, "llada_image", PROMPT)
    return root, adapter, ref


def test_matching_dump_is_healthy(llada_case, tiny_materials):
    root, adapter, _ = llada_case
    res = run_check(
        adapter, tiny_materials["student"], root / "dump", PROMPT, tiny_materials["tokenizer"]
    )
    print(
        f"check vs independent forward: cos {res['cos']:.7f} centred {res['cos_centered']:.7f} "
        f"rel_mse {res['rel_mse']:.3g}"
    )
    assert res["pack"] == "llada_image" and res["rows"] == 256 and res["tokens_checked"]
    assert res["cos_centered"] >= 0.9999 and res["cos"] >= 0.9999 and res["rel_mse"] < 1e-4
    assert res["verdict"].startswith("healthy")
    assert res["student_cos"] > 0.99999  # the same student as the engine's states


def test_wrong_dump_is_broken(llada_case, tiny_materials, tmp_path):
    _, adapter, ref = llada_case
    bad = tmp_path / "bad"
    bad.mkdir()
    ref[::-1].copy().tofile(bad / "context.bin")  # rows of the wrong queries: a scrambled target
    res = run_check(adapter, tiny_materials["student"], bad, PROMPT, tiny_materials["tokenizer"])
    print(f"check vs a wrong dump: centred {res['cos_centered']:.4f}")
    assert res["cos_centered"] < 0.5 and res["verdict"].startswith("broken")
    assert "broken-RoPE" in res["verdict"] and not res["tokens_checked"]


def test_cli_body_prints_figures_and_json(llada_case, tiny_materials, capsys):
    root, adapter, _ = llada_case
    args = (adapter, tiny_materials["student"], root / "dump", PROMPT, tiny_materials["tokenizer"])
    assert check_main(*args) == 0
    text = capsys.readouterr().out
    assert "centred cosine" in text and "rel_mse" in text and "verdict:  healthy" in text
    assert "student:  cosine 1.0" in text
    assert check_main(*args, as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["cos_centered"] >= 0.9999


def test_bad_inputs_are_one_sentence(llada_case, tiny_materials, tmp_path):
    root, adapter, ref = llada_case
    s, tok = tiny_materials["student"], tiny_materials["tokenizer"]
    with pytest.raises(UserError, match="the student's tokenization of this prompt"):
        run_check(adapter, s, root / "dump", PROMPT + " at night", tok)
    with pytest.raises(UserError, match="holds none of context.bin"):
        run_check(adapter, s, tmp_path, PROMPT, tok)
    odd = tmp_path / "odd.bin"
    ref[:, :-1].copy().tofile(odd)
    with pytest.raises(UserError, match="not a whole number of f32 rows of 2560"):
        run_check(adapter, s, odd, PROMPT, tok)
    short = tmp_path / "short"
    short.mkdir()
    ref[:100].copy().tofile(short / "adapter_out.bin")
    with pytest.raises(UserError, match="has 100 rows but the adapter makes 256"):
        run_check(adapter, s, short, PROMPT, tok)


def test_pixart_counts_only_real_slots(tmp_path, student, tiny_materials):
    cfg = AdapterConfig("seeded_resampler", HIDDEN, 48, 64, 1, num_queries=12, seed_vocab=40)
    adapter = _write_adapter(tmp_path / "pig_t5_adapter-f16.gguf", cfg, "t5xxl_pixart", seed=3)
    seeds = [5, 9, 17, 1] + [0] * 8
    ref = _engine_dump(tmp_path / "dump", adapter, student, "t5xxl_pixart", PROMPT, seeds)
    ref[4:] = 1e3  # pad slots: the DiT masks them, so the check must too
    ref.tofile(tmp_path / "dump" / "adapter_out.bin")
    res = run_check(
        adapter, tiny_materials["student"], tmp_path / "dump", PROMPT, tiny_materials["tokenizer"]
    )
    assert res["pack"] == "t5xxl_pixart" and res["rows"] == 4 and res["cos"] >= 0.9999
    (tmp_path / "dump" / "t5_ids.txt").unlink()
    with pytest.raises(UserError, match="needs the engine's seed ids"):
        run_check(
            adapter,
            tiny_materials["student"],
            tmp_path / "dump",
            PROMPT,
            tiny_materials["tokenizer"],
        )


@pytest.mark.parametrize("pack", ["t5xxl_chroma", "umt5xxl_wan"])
def test_t5clip_families_compare_the_rows_their_dit_reads(pack, tmp_path, student, tiny_materials):
    """The engine's rule for each T5 family: Chroma's DiT reads the real slots and one pad
    (chroma_t5_mask_pad 1: modify_mask_to_attend_padding, conditioner.hpp 1396-1410, 1533), Wan's
    pads are zeroed (zero_out_masked, 1485-1489; gk-diffuser.cpp 7207): `check` compares exactly
    those rows, names the family and judges no quality (no reference run: a port check against
    the engine's adapter_out.bin, n/a against another dump)."""
    s, tok = tiny_materials["student"], tiny_materials["tokenizer"]
    cfg = AdapterConfig("seeded_resampler", HIDDEN, 48, 64, 1, num_queries=12, seed_vocab=40)
    adapter = _write_adapter(tmp_path / "adapter-f16.gguf", cfg, pack, seed=5)
    seeds = [5, 9, 17, 1] + [0] * 8
    ref = _engine_dump(tmp_path / "dump", adapter, student, pack, PROMPT, seeds)
    read = 5 if pack == "t5xxl_chroma" else 4  # the real slots (+ the first pad for Chroma)
    assert get_pack(pack).check_rows(seeds) == [True] * read + [False] * (12 - read)
    wrong = ref.copy()
    wrong[read:] = 1e3  # rows the DiT never reads: the check must not count them
    wrong.tofile(tmp_path / "dump" / "adapter_out.bin")
    res = run_check(adapter, s, tmp_path / "dump", PROMPT, tok)
    assert res["pack"] == pack and res["rows"] == read and res["cos"] >= 0.9999
    assert res["verdict"].startswith("port check") and res["thresholds"] is None
    assert res["t5_ids_checked"] is False  # said, as for PixArt, without a T5 tokenizer
    wrong[read - 1] = 1e3  # a row the DiT reads (Chroma: the pad; Wan: EOS) is counted
    wrong.tofile(tmp_path / "dump" / "adapter_out.bin")
    assert run_check(adapter, s, tmp_path / "dump", PROMPT, tok)["cos"] < 0.99
    (tmp_path / "dump" / "adapter_out.bin").rename(tmp_path / "dump" / "context.bin")
    assert run_check(adapter, s, tmp_path / "dump", PROMPT, tok)["verdict"].startswith("n/a")
    (tmp_path / "dump" / "t5_ids.txt").unlink()
    with pytest.raises(UserError, match="needs the engine's seed ids"):
        run_check(adapter, s, tmp_path / "dump", PROMPT, tok)


def test_chroma_reads_no_pad_when_the_prompt_fills_the_window():
    """No pad left (a prompt cut to the window, EOS last): Chroma's DiT reads the real slots."""
    chroma = get_pack("t5xxl_chroma")
    assert chroma.check_rows([5, 9, 17, 1]) == [True] * 4
    assert chroma.check_rows([5, 1, 0, 0]) == [True, True, True, False]


def _pixart_case(tmp_path, student, prompt=PROMPT):
    """A tiny PixArt adapter and the engine's dump of `prompt`, seeded with the demo T5's ids."""
    from gguf_trainer.teachers.t5 import SeedTokenizer
    from gguf_trainer.tiny.t5_tiny import DEMO_DIR

    cfg = AdapterConfig("seeded_resampler", HIDDEN, 48, 64, 1, num_queries=120, seed_vocab=240)
    adapter = _write_adapter(tmp_path / "pig_t5_adapter-f16.gguf", cfg, "t5xxl_pixart", seed=4)
    seeds = SeedTokenizer(DEMO_DIR / "spiece.model", 120).seed_ids(prompt)
    _engine_dump(tmp_path / "dump", adapter, student, "t5xxl_pixart", prompt, seeds)
    return adapter, tmp_path / "dump", DEMO_DIR / "spiece.model"


def test_pixart_figure_is_a_port_check_and_refuses_other_dumps(tmp_path, student, tiny_materials):
    """A PixArt dump is the engine's run of this adapter: the figure is a port check. A dump of
    another prompt (t5_ids.txt, checked with --t5-model; qwen_hidden.bin's row count), of the
    CFG negative pass, or with a window of the wrong length is refused with one sentence."""
    s, tok = tiny_materials["student"], tiny_materials["tokenizer"]
    adapter, dump, spiece = _pixart_case(tmp_path, student)
    res = run_check(adapter, s, dump, PROMPT, tok, t5_model=spiece)
    assert res["cos"] >= 0.9999 and res["verdict"].startswith("port check")
    assert "not that the adapter is good" in res["verdict"]
    assert res["t5_ids_checked"] is True and "--t5-model" not in format_check(res)
    unchecked = run_check(adapter, s, dump, PROMPT, tok)  # without --t5-model: said, not silent
    assert unchecked["t5_ids_checked"] is False
    assert "t5 ids:   t5_ids.txt not compared with this prompt's (pass --t5-model" in \
        format_check(unchecked)
    # another prompt of the same student length: only the T5 ids tell
    with pytest.raises(UserError, match="not this prompt's T5 ids"):
        run_check(adapter, s, dump, "a sheep in raincoats", tok, t5_model=spiece)
    # another student length: qwen_hidden.bin's rows are refused, not skipped
    with pytest.raises(UserError, match="qwen_hidden.bin has 4 student rows but this prompt is 7"):
        run_check(adapter, s, dump, PROMPT + " at the beach", tok)
    ids = (dump / "t5_ids.txt").read_text().split()
    (dump / "t5_ids.txt").write_text("\n".join(ids[:100]) + "\n")
    with pytest.raises(UserError, match="holds 100 ids but this adapter reads a 120-slot window"):
        run_check(adapter, s, dump, PROMPT, tok)
    empty = [3, 1] + [0] * 118  # the real T5's "" (the piece "▁" + EOS): the CFG negative pass
    (dump / "t5_ids.txt").write_text("\n".join(map(str, empty)) + "\n")
    with pytest.raises(UserError, match="--cfg-scale 1"):
        run_check(adapter, s, dump, PROMPT, tok)


def test_compare_centres_by_the_dumps_own_mean():
    g = np.random.default_rng(0)
    ref = 100.0 + g.normal(size=(256, 32))  # a large shared offset, like LLaDA's rows
    pred = np.full_like(ref, 100.0)  # the mean alone: plain cosine ~1, centred ~0
    res = compare(pred + 1e-3 * g.normal(size=ref.shape), ref)
    assert res["cos"] > 0.99 and abs(res["cos_centered"]) < 0.1
    assert verdict_line("llada_image", res).startswith("broken")
    assert verdict_line("llada_image", {"cos_centered": 0.94}).startswith("weak")
    assert read_dump.__doc__


def test_cli_check_command(llada_case, tiny_materials, capsys):
    from gguf_trainer.cli import main

    root, adapter, _ = llada_case
    base = ["check", "--adapter", str(adapter), "--student", str(tiny_materials["student"]),
            "--prompt", PROMPT]
    code = main([*base, "--dump", str(root / "dump"), "--tokenizer",
                 str(tiny_materials["tokenizer"]), "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["verdict"].startswith("healthy")
    assert main([*base, "--dump", str(root / "nothing")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_pixart_seed_ids_outside_the_seed_table_are_a_sentence(tmp_path, student, tiny_materials):
    """A t5_ids.txt of another T5 vocabulary (UMT5's 256384 ids, a negative id) cannot be this
    adapter's dump: one sentence, not an IndexError inside the seed embedding."""
    s, tok = tiny_materials["student"], tiny_materials["tokenizer"]
    adapter, dump, _spiece = _pixart_case(tmp_path, student)
    ids = [int(i) for i in (dump / "t5_ids.txt").read_text().split()]
    for bad in (250000, -3):
        (dump / "t5_ids.txt").write_text("\n".join(map(str, [bad] + ids[1:])) + "\n")
        with pytest.raises(UserError, match=f"holds the id {bad}, outside this adapter's "
                                            "240-row seed table"):
            run_check(adapter, s, dump, PROMPT, tok)


def _pixart_project(tmp_path, tiny_materials, teacher: bool = True, pack: str = "t5xxl_pixart"):
    """The tiny PixArt demo project: the tiny student, and (teacher=True) the demo's T5 snapshot
    linked as its teacher material."""
    from gguf_trainer.store.project import create_project, load_project

    overrides = {
        "materials.student.path": str(tiny_materials["student"]),
        "materials.student_tokenizer.path": str(tiny_materials["tokenizer"]),
        "export.output_dir": str(tmp_path / "out"),
    }
    if teacher:
        linked = get_pack(pack).demo_materials(tmp_path / "teacher")["teacher"]
        overrides["materials.teacher.path"] = str(linked)
    create_project(tmp_path / "project", pack, overrides=overrides)
    return load_project(tmp_path / "project")


def test_check_with_project_compares_t5_ids_through_its_teacher(
    tmp_path, student, tiny_materials, capsys
):
    """`check --project DIR` takes the project's linked teacher tokenizer: a dump of another
    prompt of the same student length and T5 window is refused (without it, only the figure
    would drop), the prompt's own dump passes and says which tokenizer compared it."""
    from gguf_trainer.cli import main

    s, tok = tiny_materials["student"], tiny_materials["tokenizer"]
    adapter, dump, _spiece = _pixart_case(tmp_path, student)
    project = _pixart_project(tmp_path, tiny_materials)
    assert run_check(adapter, s, dump, OTHER, tok)["t5_ids_checked"] is False  # not refused
    base = ["check", "--adapter", str(adapter), "--student", str(s), "--dump", str(dump),
            "--tokenizer", str(tok), "--project", str(project.dir)]
    assert main([*base, "--prompt", OTHER]) == 1
    assert "the dump's t5_ids.txt is not this prompt's T5 ids" in capsys.readouterr().err
    assert main([*base, "--prompt", PROMPT]) == 0
    text = capsys.readouterr().out
    spiece = project.material_path("teacher") / "spiece.model"
    assert f"t5 ids:   t5_ids.txt is this prompt's ({spiece})" in text
    assert "not compared" not in text and "verdict:  port check" in text
    assert main([*base, "--prompt", PROMPT, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["t5_ids_checked"] is True and res["t5_model"] == str(spiece)


def test_check_project_without_a_teacher_says_why_and_t5_model_overrides(
    tmp_path, student, tiny_materials
):
    s, tok = tiny_materials["student"], tiny_materials["tokenizer"]
    adapter, dump, spiece = _pixart_case(tmp_path, student)
    project = _pixart_project(tmp_path, tiny_materials, teacher=False)
    res = run_check(adapter, s, dump, OTHER, tok, project=project)
    assert res["t5_ids_checked"] is False
    assert ("t5 ids:   t5_ids.txt not compared with this prompt's (the project's teacher "
            "tokenizer is not found: materials.teacher.path is not set; link the teacher or pass "
            "--t5-model)") in format_check(res)
    with pytest.raises(UserError, match="not this prompt's T5 ids"):  # --t5-model still serves
        run_check(adapter, s, dump, OTHER, tok, t5_model=spiece, project=project)
    # --t5-model overrides the project's: a file that is no sentencepiece model is one sentence
    bogus = tmp_path / "bogus.model"
    bogus.write_bytes(b"not a model")
    with pytest.raises(UserError, match="bogus.model is not a sentencepiece model"):
        run_check(adapter, s, dump, PROMPT, tok, t5_model=bogus, project=project)


def test_check_refuses_a_project_of_another_pack(tmp_path, student, tiny_materials):
    s, tok = tiny_materials["student"], tiny_materials["tokenizer"]
    adapter, dump, _spiece = _pixart_case(tmp_path, student)
    chroma = _pixart_project(tmp_path, tiny_materials, pack="t5xxl_chroma")
    with pytest.raises(UserError, match="trained by the t5xxl_pixart pack but the project .* "
                                        "is t5xxl_chroma"):
        run_check(adapter, s, dump, PROMPT, tok, project=chroma)


def test_seed_tokenizer_follows_each_t5_packs_teacher_layout(tmp_path):
    """materials.seed_tokenizer: PixArt and Chroma read the snapshot's spiece.model, Wan the
    diffusers layout's tokenizer/spiece.model (or a flat folder's), LLaDA none."""
    from gguf_trainer.materials.materials import seed_tokenizer
    from gguf_trainer.store.project import create_project, load_project

    def project(pack, teacher=None):
        over = {"materials.teacher.path": str(teacher)} if teacher else {}
        create_project(tmp_path / pack / "p", pack, overrides=over)
        return load_project(tmp_path / pack / "p")

    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "spiece.model").write_bytes(b"x")
    diffusers = tmp_path / "wan"
    (diffusers / "text_encoder").mkdir(parents=True)
    (diffusers / "tokenizer").mkdir()
    (diffusers / "tokenizer" / "spiece.model").write_bytes(b"x")
    assert seed_tokenizer(project("t5xxl_pixart", flat)) == (flat / "spiece.model", "")
    assert seed_tokenizer(project("t5xxl_chroma", flat)) == (flat / "spiece.model", "")
    assert seed_tokenizer(project("umt5xxl_wan", diffusers)) == (
        diffusers / "tokenizer" / "spiece.model", "")
    assert seed_tokenizer(project("llada_image")) == (None, "")
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "t5xxl_pixart" / "p" / "project.json").unlink()
    assert seed_tokenizer(project("t5xxl_pixart", empty)) == (
        None, f"{empty / 'spiece.model'} does not exist")
    (tmp_path / "t5xxl_pixart" / "p" / "project.json").unlink()
    gone = tmp_path / "gone"
    assert seed_tokenizer(project("t5xxl_pixart", gone)) == (
        None, f"the teacher {gone} does not exist")


def test_render_check_compares_t5_ids_through_the_project(tmp_path, student, tiny_materials):
    """A render's figure (and the GUI's Output render) runs `check` with the render's project,
    so a PixArt dump of another prompt is named, not given a figure."""
    import shutil

    from gguf_trainer.render import RenderPlan, Run
    from gguf_trainer.runner.render_job import _figures

    adapter, dump, _spiece = _pixart_case(tmp_path, student)
    project = _pixart_project(tmp_path, tiny_materials)
    project.final_gguf.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(adapter, project.final_gguf)
    plan = RenderPlan(runs=[Run("adapter", ["ggk"], "adapter.png", dump.name)])
    fig, note = _figures(project, PROMPT, dump.parent, plan)
    assert fig is not None and fig["t5_ids_checked"] is True and fig["cos"] >= 0.9999, note
    fig, note = _figures(project, OTHER, dump.parent, plan)
    assert fig is None and "not this prompt's T5 ids" in note


def test_the_empty_prompt_rule_knows_t5_from_other_vocabularies():
    window = 8
    t5_empty = [3, 1] + [0] * (window - 2)
    with pytest.raises(UserError, match="--cfg-scale 1"):  # T5 v1.1: "" is ▁ EOS
        check_seed_ids(t5_empty, window, "a cat", vocab=32128)
    # UMT5's ▁ is not id 3: without its tokenizer the rule cannot say, so it does not refuse
    check_seed_ids(t5_empty, window, "a cat", vocab=256384)


def _exported(project, adapter):
    """The project with `adapter` as its export (what `status` names and a render runs)."""
    import shutil

    project.final_gguf.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(adapter, project.final_gguf)
    return project.final_gguf


def test_check_project_alone_takes_its_export_student_and_tokenizer(
    tmp_path, student, tiny_materials, capsys
):
    """`check --project DIR --dump D --prompt P` runs the project's export with its linked
    student and tokenizer: the same figures as the command spelled out in full (the default
    Qwen BPE config would not even load the tiny student)."""
    from gguf_trainer.cli import main

    s, tok = tiny_materials["student"], tiny_materials["tokenizer"]
    adapter, dump, _spiece = _pixart_case(tmp_path, student)
    project = _pixart_project(tmp_path, tiny_materials)
    final = _exported(project, adapter)
    short = ["check", "--project", str(project.dir), "--dump", str(dump), "--prompt", PROMPT]
    assert main([*short, "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main([*short, "--adapter", str(adapter), "--student", str(s), "--tokenizer", str(tok),
                 "--json"]) == 0
    spelled = json.loads(capsys.readouterr().out)
    assert alone["adapter"] == str(final) and spelled["adapter"] == str(adapter)
    for key in ("rows", "cos", "cos_centered", "rel_mse", "student_cos", "student_tokens",
                "t5_ids_checked", "verdict"):
        assert alone[key] == spelled[key], key
    assert alone["cos"] >= 0.9999 and alone["t5_ids_checked"] is True
    assert main(short[:-1] + [OTHER]) == 1  # the project's teacher still checks t5_ids.txt
    assert "not this prompt's T5 ids" in capsys.readouterr().err


def test_check_project_defaults_say_what_is_missing_and_flags_win(
    tmp_path, student, tiny_materials, capsys
):
    """No export yet, no student or tokenizer linked: one sentence naming the fix and the flag
    (exit 1); an explicit flag always wins over the project's."""
    from gguf_trainer.base.exit_codes import EXIT_USER
    from gguf_trainer.cli import main
    from gguf_trainer.render import RenderPlan, Run
    from gguf_trainer.runner.render_job import _figures
    from gguf_trainer.store.project import update_settings

    s, tok = tiny_materials["student"], tiny_materials["tokenizer"]
    adapter, dump, _spiece = _pixart_case(tmp_path, student)
    project = _pixart_project(tmp_path, tiny_materials)
    short = ["check", "--project", str(project.dir), "--dump", str(dump), "--prompt", PROMPT]

    def refused(argv, *words):
        assert main(argv) == EXIT_USER
        err = capsys.readouterr().err
        assert all(w in err for w in words) and "Traceback" not in err, err
        assert err.strip().count("\n") == 0, err

    refused(short, f"the project {project.dir} has no exported adapter yet",
            "run it first", "or pass --adapter FILE")
    # the GUI's render figure resolves the same way
    plan = RenderPlan(runs=[Run("adapter", ["ggk"], "adapter.png", dump.name)])
    fig, note = _figures(project, PROMPT, dump.parent, plan)
    assert fig is None and "has no exported adapter yet" in note
    refused(["check", "--dump", str(dump), "--prompt", PROMPT],
            "pass --adapter FILE, or --project DIR")
    # an explicit --adapter wins over the project's (missing) export
    assert main([*short, "--adapter", str(adapter), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["adapter"] == str(adapter)

    _exported(project, adapter)
    other = _write_adapter(tmp_path / "other-f16.gguf", AdapterConfig(
        "seeded_resampler", HIDDEN, 48, 64, 1, num_queries=120, seed_vocab=240),
        "t5xxl_pixart", seed=9)
    assert main([*short, "--adapter", str(other), "--json"]) == 0  # wins over the export
    res = json.loads(capsys.readouterr().out)
    assert res["adapter"] == str(other) and res["cos"] < 0.99

    gone = tmp_path / "gone"
    update_settings(project.dir, {"materials.student.path": str(gone / "pig_clip-f16.gguf"),
                                  "materials.student_tokenizer.path": str(gone)})
    refused(short, "the student GGUF is missing", "does not exist",
            f"gguf-trainer link --project {project.dir} student PATH", "or pass --student FILE")
    refused([*short, "--student", str(s)], "the student tokenizer is missing",
            "has no tokenizer.json", "or pass --tokenizer DIR")
    assert main([*short, "--student", str(s), "--tokenizer", str(tok)]) == 0
    assert "verdict:  port check" in capsys.readouterr().out


def test_an_8_gib_context_bin_is_refused_before_it_is_read(llada_case, tiny_materials, tmp_path):
    """Issue 29 item 5: bounded by the rows x width the adapter makes (256 x 2560 f32)."""
    _, adapter, _ = llada_case
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "context.bin", "wb") as f:
        f.truncate(8 << 30)  # sparse: read whole it would end in MemoryError
    with pytest.raises(UserError, match=r"context.bin is 8,589,934,592 bytes, more than a dump of "
                                        r"256 rows of 2560 f32 values"):
        run_check(adapter, tiny_materials["student"], big, PROMPT, tiny_materials["tokenizer"])
