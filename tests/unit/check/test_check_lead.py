"""`check` and `render` lead with the centred cosine of the rows the DiT reads, tokens and pads
apart, each set centred on its own mean (check.lead_rows / lead_figures, render.figures_line)."""

from __future__ import annotations

import numpy as np
import pytest

from gguf_trainer import render
from gguf_trainer.check import format_check, lead_figures, lead_rows
from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.engine.qwen_ids import PAD_ID
from gguf_trainer.model.student import load_tokenizer
from gguf_trainer.packs import get_pack

PROMPT = "a sheep in sunglasses"


@pytest.fixture(scope="module")
def encode(tiny_materials):
    return engine_bpe(load_tokenizer(tiny_materials["tokenizer"])).encode


def test_tokens_start_after_the_shared_lead_and_stop_at_the_pads(encode):
    pack = get_pack("qwen3vl_flux3")
    ids = pack.student_ids(encode, Sample(PROMPT))
    n_real = pack.padding.real_length(ids)
    lead = len(pack.student_ids(encode, Sample("")) )  # an upper bound: prefix + suffix
    sets = lead_rows(pack, ids, encode)
    first = int(np.argmax(sets["tokens"]))
    assert 0 < first < lead  # the template's prefix (the sink row among it) is not a token row
    assert ids[first:n_real] and sets["tokens"][first:n_real].all()
    assert not sets["tokens"][n_real:].any()
    assert sets["pads"].sum() == len(ids) - n_real > 0 and ids[-1] == PAD_ID


def test_a_family_without_pads_has_tokens_only_and_drops_rows_before_its_start(encode):
    pack = get_pack("qwen3vl_krea2")  # 34 system rows before the DiT's start row
    ids = pack.student_ids(encode, Sample(PROMPT))
    sets = lead_rows(pack, ids, encode)
    assert set(sets) == {"tokens"}
    assert not sets["tokens"][: pack.start].any() and sets["tokens"][pack.start:].any()


def _rows(n=60, d=8, seed=0):
    g = np.random.default_rng(seed)
    ref = g.normal(size=(n, d)) + 3.0
    ref[0] = 0.0
    ref[0, 0] = 500.0  # a sink row
    return ref


def test_each_set_is_centred_on_its_own_mean():
    ref = _rows()
    sets = {"tokens": np.arange(60) >= 1, "pads": np.arange(60) >= 50}
    sets["tokens"] &= np.arange(60) < 50
    same = lead_figures(ref.copy(), ref, sets)
    assert same["tokens"]["cos_centered"] == pytest.approx(1.0)
    mean = np.tile(ref[sets["tokens"]].mean(0), (60, 1))
    lead = lead_figures(mean, ref, sets)
    assert lead["tokens"]["cos_centered"] == pytest.approx(0.0, abs=1e-9)
    assert lead["tokens"]["cos"] > 0.8  # the plain cosine of the mean stays high
    two = lead_figures(np.hstack([ref, mean]), np.hstack([ref, ref]), sets, taps=(4, 8))
    assert two["tokens"]["per_tap"] == pytest.approx([1.0, 0.0], abs=1e-9)


def test_check_prints_the_lead_first_and_render_leads_its_line():
    ref = _rows()
    sets = {"tokens": (np.arange(60) >= 1) & (np.arange(60) < 50), "pads": np.arange(60) >= 50}
    lead = lead_figures(ref.copy(), ref, sets)
    res = {"adapter": "a.gguf", "pack": "qwen3vl_flux3", "dump": "d", "rows": 60,
           "tokens_checked": True, "cos": 0.99, "cos_centered": 0.98, "rel_mse": 0.01,
           "worst_row_cos_centered": 0.9, "per_tap": None, "verdict": "n/a: x", "lead": lead}
    text = format_check(res).splitlines()
    assert text[2].startswith("tokens:   centred cosine 1.000000")
    assert text[3].startswith("pads:     centred cosine 1.000000")
    assert text[4].startswith("all rows: cosine 0.990000")
    line = render.figures_line({"cos": 0.99, "cos_centered": 0.98, "rel_mse": 0.01,
                                "lead": lead})
    assert line.startswith("tokens centred 1.0000 (rel_mse 0); pads centred 1.0000 (rel_mse 0)")
    assert line.endswith("all rows 0.9900 (centred 0.9800, rel_mse 0.01)")
    assert render.figures_line({"cos": 0.99, "cos_centered": 0.98, "rel_mse": 0.01}) == (
        "all rows 0.9900 (centred 0.9800, rel_mse 0.01)")  # a render.json from before


def test_render_dump_cosine_leads_with_the_sets(tmp_path):
    ref = _rows().astype("<f4")
    ids = list(range(60))
    wrong_sink = ref.copy()
    wrong_sink[0, 0] = -500.0  # only the sink row (not a token row) is wrong
    for name, rows in (("teacher", ref), ("adapter", wrong_sink)):
        folder = tmp_path / name
        folder.mkdir()
        rows.tofile(folder / (render.TEACHER_DUMP if name == "teacher" else render.ADAPTER_DUMP))
        (folder / "tokens.txt").write_text("\n".join(map(str, ids)) + "\n")
    sets_of = lambda got: {"tokens": np.arange(len(got)) >= 1}
    fig = render.dump_cosine(tmp_path / "teacher", tmp_path / "adapter", 8, sets_of)
    assert set(fig["lead"]) == {"tokens"} and fig["lead"]["tokens"]["rows"] == 59
    assert fig["lead"]["tokens"]["cos_centered"] == pytest.approx(1.0, abs=1e-6)
    assert fig["cos_centered"] < 0.99  # all rows, the sink among them
