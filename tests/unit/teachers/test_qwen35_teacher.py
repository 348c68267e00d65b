"""The Qwen3.5 bridge teacher (teachers/qwen35.py) on the tiny real snapshot (tiny/qwen35.py):
its rows are transformers' own last hidden state (after the norm) of the engine's slot ids, a
padded batch gives each prompt's own rows (every layer is causal), the vocabulary read back from
tokenizer.json is the released one, the embedding table comes from the weight files alone, and a
snapshot whose tokenizer does not give Qwen3.5's template ids is refused with one sentence."""

from __future__ import annotations

import json

import pytest
import torch

from gguf_trainer.base.errors import UserError
from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.qwen35_bpe import moss_prompt
from gguf_trainer.teachers.qwen35 import (
    PAD_SLOT,
    embed_table,
    load_qwen35_teacher,
    read_vocabulary,
)
from gguf_trainer.tiny.qwen35 import copy_tiny_qwen35, qwen35_vocabulary


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return copy_tiny_qwen35(tmp_path_factory.mktemp("qwen35") / "Qwen3.5-tiny")


@pytest.fixture(scope="module")
def teacher(root):
    return load_qwen35_teacher(root, "cpu", max_slots=64, mode="cpu")


def test_rows_are_the_models_last_hidden_state_of_the_engines_ids(root, teacher):
    from transformers import AutoModel

    texts = ["a red fox in the snow", "", "一只戴墨镜的羊, watercolor, 35mm photo of a lighthouse"]
    samples = [Sample(t) for t in texts]
    out = teacher.targets(samples, [[1]] * 3)
    model = AutoModel.from_pretrained(str(root), dtype=torch.float32).eval()
    for s, r in zip(samples, out):
        ids = teacher.bpe.encode(moss_prompt(s.text))
        assert r.seed_ids[: len(ids)] == ids and set(r.seed_ids[len(ids) :]) == {PAD_SLOT}
        assert len(r.seed_ids) == 64 and r.rows.shape == (len(ids), 64)
        with torch.no_grad():
            want = model.language_model(input_ids=torch.tensor([ids])).last_hidden_state[0]
        torch.testing.assert_close(r.rows, want, rtol=1e-4, atol=1e-5)  # batched vs alone
    assert teacher.lengths(samples, [[1]] * 3) == [len(r.rows) for r in out]


def test_vocabulary_and_table_from_the_files(root):
    tokens, merges = read_vocabulary(root)
    want_tokens, want_merges = qwen35_vocabulary()
    assert tokens == list(want_tokens) and merges == list(want_merges)
    table = embed_table(root)
    assert table.shape == (248320, 64) and table.dtype == torch.float32


def test_a_foreign_tokenizer_is_refused(root, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    data = json.loads((bad / "tokenizer.json").read_text())
    for added in data["added_tokens"]:  # another model's ids for the specials
        added["id"] += 1
    (bad / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="Qwen3.5's ids"):
        load_qwen35_teacher(bad, "cpu", max_slots=64, mode="cpu")
    (bad / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    with pytest.raises(UserError, match="not Qwen3.5"):
        load_qwen35_teacher(bad, "cpu", max_slots=64, mode="cpu")
