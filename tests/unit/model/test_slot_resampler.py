"""The slot-resampler kind (qwen35_bridge): the engine's tensor inventory, padded batches equal to
single-prompt runs, the PCA seed, export with the teacher's vocabulary, load_gguf, inspect, and
the file's forward against an independent NumPy reading of llm_adapter.hpp (engine_reference)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from adapter_cases import randomize
from engine_reference import slot_forward

from gguf_trainer.model.adapter_file import read_adapter, trainer_kind
from gguf_trainer.model.adapter_report import inspect_main
from gguf_trainer.model.adapters import (
    AdapterConfig,
    build_adapter,
    load_gguf,
    start_output,
    trainable_parameters,
)
from gguf_trainer.model.export import write_adapter_gguf
from gguf_trainer.model.slot_resampler import PAD_SLOT, pca_seed, set_seed_table

IN, WIDTH, DEPTH, OUT, SLOTS, VOCAB, RANK, VIS = 32, 128, 2, 48, 12, 60, 8, 24
BANK, BANK_DIM = 5, 40
CFG = AdapterConfig("qwen35_bridge", IN, OUT, WIDTH, DEPTH, num_queries=SLOTS, seed_vocab=VOCAB,
                    seed_rank=RANK, vis_dim=VIS)
BANKED = AdapterConfig(**{**CFG.to_dict(), "n_bank": BANK, "bank_dim": BANK_DIM,
                          "bank_align": True})
TOKENIZER = {"tokens": [f"t{i}" for i in range(VOCAB)], "merges": ["t 1", "t1 0"], "pre": "qwen35"}


def test_state_dict_is_what_the_engine_declares():
    """llm_adapter.hpp 756-784 (the module docstring's table), torch shapes = ne reversed."""
    m = build_adapter(BANKED)
    got = {k: tuple(v.shape) for k, v in m.state_dict().items() if not k.startswith("blocks.")}
    assert got == {
        "slot_query": (SLOTS, WIDTH), "bank_query": (BANK, WIDTH), "bank_in.weight": (WIDTH, IN),
        "seed_embed.weight": (VOCAB, RANK), "seed_proj.weight": (WIDTH, RANK),
        "vis_q.weight": (WIDTH, VIS), "in_proj.weight": (WIDTH, IN), "in_proj.bias": (WIDTH,),
        "vis_in.weight": (WIDTH, VIS), "ln_out.weight": (WIDTH,), "ln_out.bias": (WIDTH,),
        "out_bank.weight": (BANK_DIM, WIDTH), "out_bank.bias": (BANK_DIM,),
        "out_proj.weight": (OUT, WIDTH), "out_proj.bias": (OUT,),
    }
    blocks = {k.split(".", 2)[2] for k in m.state_dict() if k.startswith("blocks.1.")}
    assert blocks >= {"ln_self.weight", "self_attn.q.weight", "ln_q.bias", "ln_kv.weight",
                      "cross_attn.o.bias", "ln_mlp.weight", "mlp.0.weight", "mlp.2.bias"}
    no_bank = build_adapter(CFG).state_dict()
    assert not any(k.startswith(("bank_", "out_bank")) for k in no_bank)
    trained = {id(p) for p in trainable_parameters(m)}
    assert id(m.seed_embed.weight) not in trained and id(m.seed_proj.weight) in trained


def test_config_problems():
    assert CFG.validate() == [] and BANKED.validate() == []
    bad = AdapterConfig(**{**CFG.to_dict(), "seed_rank": 0, "vis_dim": 0, "bank_dim": 8})
    problems = bad.validate()
    assert len(problems) == 3, problems
    assert AdapterConfig(**{**CFG.to_dict(), "bank_align": True}).validate()
    assert AdapterConfig(**{**CFG.to_dict(), "kind": "resampler", "n_bank": 2}).validate()


def _batch(g, lengths, slots):
    b, L, S = len(lengths), max(lengths), max(slots) + 3
    hidden = torch.randn(b, L, IN, generator=g)  # garbage in the pads on purpose
    mask = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]
    ids = torch.randint(0, VOCAB, (b, S), generator=g)
    ids[torch.arange(S)[None, :] >= torch.tensor(slots)[:, None]] = PAD_SLOT
    return hidden, mask, ids


@pytest.mark.parametrize("cfg", [CFG, BANKED], ids=["slots", "bank"])
def test_padded_batch_equals_single_prompt_runs(cfg):
    torch.manual_seed(0)
    m = randomize(build_adapter(cfg)).eval()
    g = torch.Generator().manual_seed(2)
    lengths, slots = [5, 9, 1], [7, 3, 11]
    hidden, mask, ids = _batch(g, lengths, slots)
    bank_h = torch.randn(3, BANK, IN, generator=g) if cfg.n_bank else None
    with torch.no_grad():
        out = m(hidden, mask, seed_ids=ids)
        assert out.shape == (3, max(slots), OUT)
        for i, (n, p) in enumerate(zip(lengths, slots)):
            alone = m(hidden[i : i + 1, :n], seed_ids=ids[i : i + 1, :p])[0]
            torch.testing.assert_close(out[i, :p], alone, rtol=1e-5, atol=1e-5)
        if cfg.n_bank:
            bank = m(hidden, mask, seed_ids=ids, want_bank=True, bank_hidden=bank_h)
            assert bank.shape == (3, BANK, BANK_DIM)
            for i, (n, p) in enumerate(zip(lengths, slots)):
                alone = m(hidden[i : i + 1, :n], seed_ids=ids[i : i + 1, :p], want_bank=True,
                          bank_hidden=bank_h[i : i + 1])[0]
                torch.testing.assert_close(bank[i], alone, rtol=1e-5, atol=1e-5)
        rows = ids[:, : max(slots)] >= 0
        torch.testing.assert_close(m(hidden, mask, seed_ids=ids, rows=rows), out[rows])


def test_argument_errors():
    m = build_adapter(CFG)
    h = torch.randn(1, 3, IN)
    with pytest.raises(ValueError, match="seed_ids"):
        m(h)
    with pytest.raises(ValueError, match="no bank"):
        m(h, seed_ids=torch.zeros(1, 2, dtype=torch.long), want_bank=True)
    with pytest.raises(ValueError, match="max_slots"):
        m(h, seed_ids=torch.zeros(1, SLOTS + 1, dtype=torch.long))


def test_start_output_predicts_the_mean():
    m = build_adapter(CFG)
    mean = torch.randn(OUT)
    start_output(m, mean)
    out = m(torch.randn(2, 4, IN), seed_ids=torch.randint(0, VOCAB, (2, 6)))
    assert torch.equal(out, mean.expand_as(out))


def test_pca_seed_is_the_centred_table_on_its_principal_directions():
    g = torch.Generator().manual_seed(5)
    table = torch.randn(300, 6, generator=g) @ torch.randn(6, 20, generator=g) + 3.0
    seed = pca_seed(table, 4, chunk=64)  # several chunks
    assert seed.shape == (300, 4) and seed.dtype == torch.float32
    assert abs(float(seed.pow(2).mean().sqrt()) - 1.0) < 1e-5
    centred = (table - table.mean(0)).double()
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    want = centred @ vh[:4].T
    want = want * torch.sign(vh[:4].T.gather(0, vh[:4].T.abs().argmax(0, keepdim=True)))
    want = want / want.pow(2).mean().sqrt()
    torch.testing.assert_close(seed.double(), want, rtol=1e-4, atol=1e-4)
    gram = seed.T.double() @ seed.double()
    assert (gram - torch.diag(torch.diag(gram))).abs().max() < 1e-3 * gram.diag().max()
    with pytest.raises(ValueError):
        pca_seed(table, 21)


@pytest.mark.parametrize("cfg", [CFG, BANKED], ids=["slots", "bank"])
def test_export_load_inspect_and_the_engine_forward(cfg, tmp_path):
    torch.manual_seed(0)
    m = randomize(build_adapter(cfg)).eval()
    set_seed_table(m, pca_seed(torch.randn(VOCAB, 16), RANK))
    path = tmp_path / "pig_bridge-f16.gguf"
    write_adapter_gguf(path, m.state_dict(), cfg, metadata={"adapter.pack": "qwen35_bridge"},
                       tokenizer=TOKENIZER)
    view = read_adapter(path)
    assert view.kind == "qwen35_bridge" and trainer_kind(view) == "qwen35_bridge"
    assert view.problems == [] and view.notes == []
    assert view.tensors["adapter.slot_query"][1] == "f32"
    assert view.tensors["adapter.seed_embed.weight"] == ((RANK, VOCAB), "f16")
    out = io.StringIO()
    assert inspect_main(str(path), True, out) == 0
    report = json.loads(out.getvalue())
    assert report["kind"] == "qwen35_bridge" and report["problems"] == []
    assert report["families"][0] == "MOSS-Image"
    assert ("FLUX.3 Klein (bank head)" in report["families"]) == bool(cfg.n_bank)
    loaded = load_gguf(path)
    assert loaded.config == cfg
    assert loaded.metadata["tokenizer.ggml.tokens"] == TOKENIZER["tokens"]
    assert loaded.metadata["tokenizer.ggml.merges"] == TOKENIZER["merges"]
    assert loaded.metadata["tokenizer.ggml.pre"] == "qwen35"
    g = torch.Generator().manual_seed(9)
    h = torch.randn(1, 6, IN, generator=g)
    ids = torch.randint(0, VOCAB, (1, 9), generator=g)
    with torch.no_grad():
        got = loaded(h, seed_ids=ids)[0].double().numpy()
    want = slot_forward(str(path), h[0].numpy(), ids[0].numpy())
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    if cfg.n_bank:
        bh = torch.randn(1, BANK, IN, generator=g)
        with torch.no_grad():
            got = loaded(h, seed_ids=ids, want_bank=True, bank_hidden=bh)[0].double().numpy()
        want = slot_forward(str(path), h[0].numpy(), ids[0].numpy(), want_bank=True,
                            bank_hidden=bh[0].numpy())
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_a_file_without_its_vocabulary_is_refused(tmp_path):
    with pytest.raises(ValueError, match="vocabulary"):  # the export refuses before writing
        write_adapter_gguf(tmp_path / "a.gguf", build_adapter(CFG).state_dict(), CFG, metadata={})
    assert not (tmp_path / "a.gguf").exists()
    import gguf

    path = tmp_path / "b.gguf"  # what another tool might write: the Qwen2 pre-tokenizer
    w = gguf.GGUFWriter(path, "pig")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(TOKENIZER["tokens"])
    w.add_token_merges(TOKENIZER["merges"])
    for k, v in build_adapter(CFG).state_dict().items():
        w.add_tensor("adapter." + k, v.float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    view = read_adapter(path)
    assert view.kind == "qwen35_bridge" and any("'qwen2'" in p for p in view.refusals)
