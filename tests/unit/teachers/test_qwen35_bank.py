"""teachers/qwen35_bank.py: the FLUX.3 bank's ids follow the engine's rule (conditioner.hpp
4426-4448), and on a tiny REAL Qwen3-VL the bank rows are what the FLUX.3 pack's own tap teacher
gives for the same template (real rows, and the pad row = every pad row)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.packs import get_pack
from gguf_trainer.teachers.qwen35_bank import (
    PADDING,
    PREFIX_IDS,
    SUFFIX_IDS,
    TAPS,
    BankTeacher,
    bank_ids,
    check_n_bank,
    dit_rows,
)


def test_bank_ids_are_the_engines():
    ids, n_body = bank_ids([5, 6, 7], "a b c", 80)
    assert ids == [*PREFIX_IDS, 5, 6, 7, *SUFFIX_IDS] and n_body == 3
    ids, n_body = bank_ids([151643], "", 80)  # empty prompt: no body (the student's pad)
    assert ids == [*PREFIX_IDS, *SUFFIX_IDS] and n_body == 0
    ids, n_body = bank_ids(list(range(100)), "long", 80)  # cut to the room: 80 - 8
    assert n_body == 72 and len(ids) == 80
    assert dit_rows(8, 240) == 80 and dit_rows(81, 240) == 160 and dit_rows(80, 80) == 80
    with pytest.raises(ValueError):
        check_n_bank(100)


def test_prefix_and_suffix_ids_are_the_students(qwen_tokenizer_dir):
    from gguf_trainer.model.student import load_tokenizer

    enc = engine_bpe(load_tokenizer(qwen_tokenizer_dir)).encode
    assert tuple(enc("<|im_start|>user\n")) == PREFIX_IDS
    assert tuple(enc("<|im_end|>\n<|im_start|>assistant\n")) == SUFFIX_IDS


def test_bank_rows_are_the_flux3_teachers_rows(tiny_tap_teacher):
    from gguf_trainer.teachers.qwen_taps import TapLayout, load_tap_teacher

    root = tiny_tap_teacher("qwen3_vl", max(TAPS))
    flux3 = get_pack("qwen3vl_flux3")
    full = load_tap_teacher(root, "cpu", student_pieces=flux3.student_pieces,
                            layout=flux3.tap_layout(), mode="cpu")
    bank = BankTeacher(load_tap_teacher(root, "cpu", student_pieces=None,
                                        layout=TapLayout(taps=TAPS, padding=PADDING), mode="cpu"),
                       n_bank=160)
    bank.check_template()
    texts = ["a sheep in sunglasses", "", "two red apples on a wooden table, morning light"]
    samples = [SimpleNamespace(text=t, images=()) for t in texts]
    student = [full._encode(t) if t else [151643] for t in texts]
    got = bank.rows(samples, student)
    want = full.targets(samples, [PADDING.apply(bank_ids(s, t, 160)[0])
                                  for s, t in zip(student, texts)])
    for g, w, s, t in zip(got, want, student, texts):
        n_real = len(PREFIX_IDS) + (len(s) if t else 0) + len(SUFFIX_IDS)
        assert g.n_real == n_real and g.rows.shape == (n_real + 1, 8 * full.hidden)
        assert w.rows.shape[0] == 80
        assert torch.allclose(g.rows[:n_real], w.rows[:n_real], atol=1e-5)
        for pad in range(n_real, 80):  # one pad state: every pad row of the 4B
            assert torch.allclose(g.rows[n_real], w.rows[pad], atol=1e-5)
