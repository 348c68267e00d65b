"""The Ming-Image adapter kind (ming_image): the engine's tensor inventory, padded batches equal to
single-prompt runs, the engine's output layout, export with the Ling tokenizer.json as the
`tokenizer_json` tensor, load_gguf and inspect. The engine's own graph on the exported file is the
engine tier's (tests/engine/test_ming_adapter_engine.py)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from adapter_cases import randomize

from gguf_trainer.model.adapter_file import read_adapter, trainer_kind
from gguf_trainer.model.adapter_report import inspect_main
from gguf_trainer.model.adapters import AdapterConfig, build_adapter, load_gguf
from gguf_trainer.model.export import write_adapter_gguf
from gguf_trainer.model.ming_adapter import tokenizer_bytes_tensor, tokenizer_from_tensor
from gguf_trainer.model.slot_resampler import PAD_SLOT

IN, WIDTH, DEPTH, OUT, SLOTS, VOCAB, RANK, VIS, NCAP, CAP = 32, 128, 2, 48, 12, 60, 8, 24, 5, 40
CFG = AdapterConfig("ming_image", IN, OUT, WIDTH, DEPTH, num_queries=SLOTS, seed_vocab=VOCAB,
                    seed_rank=RANK, vis_dim=VIS, n_bank=NCAP, bank_dim=CAP)
TOKENIZER = json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "文": 1}, "merges": []},
                        "added_tokens": [{"id": 2, "content": "<role>"}]}, ensure_ascii=False)


def test_state_dict_is_what_the_engine_declares():
    """llm_adapter.hpp 536-557 (ming_adapter.py's table), torch shapes = ne reversed."""
    m = build_adapter(CFG)
    got = {k: tuple(v.shape) for k, v in m.state_dict().items() if not k.startswith("blocks.")}
    assert got == {
        "cap_query": (NCAP, WIDTH), "slot_query": (SLOTS, WIDTH),
        "seed_embed.weight": (VOCAB, RANK), "seed_proj.weight": (WIDTH, RANK),
        "vis_q.weight": (WIDTH, VIS), "in_proj.weight": (WIDTH, IN), "in_proj.bias": (WIDTH,),
        "vis_in.weight": (WIDTH, VIS), "ln_out.weight": (WIDTH,), "ln_out.bias": (WIDTH,),
        "out_cap.weight": (CAP, WIDTH), "out_cap.bias": (CAP,),
        "out_proj.weight": (OUT, WIDTH), "out_proj.bias": (OUT,),
    }
    assert not m.seed_embed.weight.requires_grad


def test_config_problems_are_sentences():
    bad = AdapterConfig(**{**CFG.to_dict(), "n_bank": 0, "bank_dim": 0})
    assert any("caption bank" in p for p in bad.validate())
    wide = AdapterConfig(**{**CFG.to_dict(), "bank_dim": OUT + 1})
    assert any("bank_dim must be <= out_dim" in p for p in wide.validate())
    assert CFG.validate() == []


def test_output_is_the_engines_layout_and_padding_is_exact():
    m = randomize(build_adapter(CFG)).eval()
    g = torch.Generator().manual_seed(2)
    h = [torch.randn(1, n, IN, generator=g) for n in (4, 7)]
    ids = [torch.tensor([[3, 9, 1]]), torch.tensor([[5, 5, 8, 2, 40]])]
    vis = torch.randn(2, 3, VIS, generator=g)
    with torch.no_grad():
        singles = [m(h[i], seed_ids=ids[i], vis=vis[i : i + 1]) for i in range(2)]
        hidden = torch.zeros(2, 7, IN)
        mask = torch.zeros(2, 7, dtype=torch.bool)
        seeds = torch.full((2, 5), PAD_SLOT)
        for i in range(2):
            hidden[i, : h[i].shape[1]], mask[i, : h[i].shape[1]] = h[i][0], True
            seeds[i, : ids[i].shape[1]] = ids[i][0]
        cap, slots = m.heads(hidden, mask, seed_ids=seeds, vis=vis)
    for i in range(2):
        one = singles[i][0]
        assert one.shape == (NCAP + ids[i].shape[1], OUT)
        assert torch.all(one[:NCAP, CAP:] == 0)  # caption rows zero-padded to out_dim (hpp 597)
        torch.testing.assert_close(cap[i], one[:NCAP, :CAP], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(slots[i, : ids[i].shape[1]], one[NCAP:], rtol=1e-5, atol=1e-5)


def test_export_carries_the_tokenizer_and_loads_back(tmp_path):
    m = randomize(build_adapter(CFG))
    path = tmp_path / "ming.gguf"
    with pytest.raises(ValueError, match="Ling tokenizer.json"):
        write_adapter_gguf(path, m.state_dict(), CFG, metadata={})
    info = write_adapter_gguf(path, m.state_dict(), CFG, metadata={"adapter.pack": "ming_image"},
                              tokenizer={"json": TOKENIZER})
    view = read_adapter(path)
    assert (view.kind, trainer_kind(view), view.problems, view.notes) == ("ming_image",
                                                                          "ming_image", [], [])
    assert info["n_tensors"] == len(m.state_dict())
    import gguf

    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == "tokenizer_json")
    assert t.tensor_type == gguf.GGMLQuantizationType.F16
    assert tokenizer_from_tensor(np.asarray(t.data)) == TOKENIZER
    out = io.StringIO()
    assert inspect_main(str(path), False, out) == 0
    text = out.getvalue()
    assert f"caption {NCAP} x {CAP}" in text and "Ming-Image, Ming-Image Layer" in text
    assert f"the Ling tokenizer.json, {len(TOKENIZER.encode())} bytes (tokenizer_json)" in text
    loaded = load_gguf(path)
    h, ids = torch.randn(1, 5, IN), torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        want = m.eval()(h, seed_ids=ids)
        got = loaded(h, seed_ids=ids)
    assert (got - want).abs().max() / want.abs().max() < 2e-3  # f16 weights


def test_a_file_without_its_vocabulary_says_so(tmp_path):
    import gguf

    m = build_adapter(CFG)
    w = gguf.GGUFWriter(str(tmp_path / "bare.gguf"), "pig")
    for k, v in m.state_dict().items():
        arr = v.float().numpy()
        f32 = arr.ndim == 1 or "query" in k
        w.add_tensor("adapter." + k, arr if f32 else arr.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    view = read_adapter(tmp_path / "bare.gguf")
    assert any("no tokenizer_json" in p for p in view.problems)
    assert tokenizer_bytes_tensor("é").tolist() == [0xC3, 0xA9]
