"""The T5CLIPEmbedder families' teachers (ggk 0.9.7 conditioner.hpp:1193-1550): Chroma's T5 in the
engine's default mask mode (unmasked over the 512-slot window, the real slots + one pad read by
the DiT) and Wan's masked UMT5 with its 256384-piece vocabulary (pad rows zeroed by the engine).
The expected rows come from the transformers encoder classes run directly, not from t5.py."""

from __future__ import annotations

import pytest
import sentencepiece as spm
import torch
from transformers import T5EncoderModel, UMT5EncoderModel

from gguf_trainer.base.errors import UserError
from gguf_trainer.packs import get_pack
from gguf_trainer.packs.t5xxl_chroma import CHROMA_T5_MASK_PAD
from gguf_trainer.teachers import t5
from gguf_trainer.tiny.t5_tiny import DEMO_DIR
from gguf_trainer.tiny.umt5 import TINY_UMT5_CONFIG, UMT5_VOCAB, build_tiny_umt5

PROMPTS = ["a red fox in the snow, golden hour", "a bowl of ramen", "",
           "a medieval castle, " * 80]  # the last one is cut to the 512-slot window


@pytest.fixture(scope="module")
def umt5_root(tmp_path_factory):
    return build_tiny_umt5(tmp_path_factory.mktemp("umt5") / "umt5-tiny")


class _Plan:
    mode, cpu_gib = "cpu", 0.0


def umt5_layout(root):
    """(encoder folder, spiece.model) of a Wan teacher folder, as the pack reads it."""
    return get_pack("umt5xxl_wan").teacher_files({"teacher": root})


def test_the_window_check_accepts_512_for_the_t5clip_families_only():
    assert t5.check_window(512, t5.T5CLIP_WINDOWS) == 512
    with pytest.raises(UserError, match="use 120"):
        t5.check_window(512)  # PixArt's DiT takes 120 or 300 rows
    with pytest.raises(UserError, match="use 512"):
        t5.check_window(300, t5.T5CLIP_WINDOWS)
    for pid in ("t5xxl_chroma", "umt5xxl_wan"):
        pack = get_pack(pid)
        assert pack.num_queries == pack.max_len_teacher == 512 and pack.configured(None) is pack


def test_chroma_targets_are_the_unmasked_window_at_the_slots_the_dit_reads():
    """chroma_use_t5_mask false: every one of the 512 slots is a key, so the real rows depend on
    the pads; chroma_t5_mask_pad 1: one pad row is supervised too."""
    teacher = get_pack("t5xxl_chroma").load_teacher({"teacher": DEMO_DIR}, _Plan(), "cpu")
    model = T5EncoderModel.from_pretrained(str(DEMO_DIR), dtype=torch.float32).eval()
    try:
        rows = teacher.targets(PROMPTS)
        assert teacher.lengths(PROMPTS) == [512] * len(PROMPTS)
        for text, got in zip(PROMPTS, rows):
            ids = got.seed_ids
            assert len(ids) == 512 and ids == t5.window_ids(teacher.tokenizer.pieces(text), 512)
            n = min(t5.real_length(ids) + CHROMA_T5_MASK_PAD, 512)
            with torch.no_grad():
                ref = model(input_ids=torch.tensor([ids])).last_hidden_state[0, :n]  # no mask
                masked = model(
                    input_ids=torch.tensor([ids]),
                    attention_mask=torch.tensor([[int(i != 0) for i in ids]]),
                ).last_hidden_state[0, :n]
            assert got.rows.shape == ref.shape
            torch.testing.assert_close(got.rows, ref, rtol=1e-5, atol=1e-5)
            if n < 512:  # the mask mode is visible in the rows: pads are keys here
                assert (got.rows - masked).abs().max() > 1e-3
        assert rows[-1].rows.shape[0] == 512 and rows[-1].seed_ids[-1] == 1  # cut, EOS last, no pad
    finally:
        teacher.close()


def test_the_tiny_umt5_has_the_real_vocabulary_shape(umt5_root):
    encoder, spiece = umt5_layout(umt5_root)
    sp = spm.SentencePieceProcessor(model_file=str(spiece))
    assert sp.get_piece_size() == UMT5_VOCAB == TINY_UMT5_CONFIG["vocab_size"]
    assert (sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.unk_id()) == (0, 1, 2, 3)  # ggk's UMT5 ids
    report = t5.check_snapshot(encoder, vocab_limit=UMT5_VOCAB, spiece=spiece)
    assert report.config["model_type"] == "umt5" and report.spm_pieces == UMT5_VOCAB
    # UMT5 has a relative position bias in every block (T5 v1.1: block 0 only)
    names = t5.expected_encoder_tensors(report.config)
    assert all(
        f"encoder.block.{i}.layer.0.SelfAttention.relative_attention_bias.weight" in names
        for i in range(TINY_UMT5_CONFIG["num_layers"])
    )
    pack = get_pack("umt5xxl_wan")
    assert "256384" in pack.check_teacher({"teacher": umt5_root})
    assert 0 < pack.teacher_gib({"teacher": umt5_root}, "cpu") < 0.1


def test_wan_targets_are_the_masked_umt5_real_slots(umt5_root):
    teacher = get_pack("umt5xxl_wan").load_teacher({"teacher": umt5_root}, _Plan(), "cpu")
    encoder, _ = umt5_layout(umt5_root)
    model = UMT5EncoderModel.from_pretrained(str(encoder), dtype=torch.float32).eval()
    try:
        rows = teacher.targets(PROMPTS)
        ids_seen = set()
        for got in rows:
            ids = got.seed_ids
            n = t5.real_length(ids)
            ids_seen |= set(ids)
            with torch.no_grad():
                ref = model(
                    input_ids=torch.tensor([ids]),
                    attention_mask=torch.tensor([[int(i != 0) for i in ids]]),
                ).last_hidden_state[0, :n]
            assert got.rows.shape == ref.shape == (n, TINY_UMT5_CONFIG["d_model"])
            torch.testing.assert_close(got.rows, ref, rtol=1e-5, atol=1e-5)
        assert max(ids_seen) < UMT5_VOCAB and max(ids_seen) > 65535  # rows far into the table
        # the engine's UMT5 unknown is id 3 (t5_unigram_tokenizer.cpp:217-226), not T5's 2
        assert 3 in teacher.tokenizer.pieces("猫")
    finally:
        teacher.close()


def test_packs_say_what_they_train_for_and_have_no_reference():
    chroma, wan = get_pack("t5xxl_chroma"), get_pack("umt5xxl_wan")
    assert "gk-diffuser.cpp:4389-4391" in chroma.export_kv["adapter.engine_mask_mode"]
    assert "--chroma-enable-t5-mask" in chroma.hints["train"]
    assert wan.seed_vocab == UMT5_VOCAB and chroma.seed_vocab == 32128
    for pack in (chroma, wan):
        assert pack.health_line({"cos": 0.9, "trained_steps": 99999}).startswith(
            f"n/a: no published pig_clip + {pack.title} run to compare with; cos 0.9000"
        )
    assert "-M vid_gen" in wan.engine_command() and "--llm-adapter" in chroma.engine_command()
