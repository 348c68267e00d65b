"""Engine tier, Ming-Image adapter (`ming_image`): ggk 0.9.7's own code on an exported file.

The driver (ming_image/ming_probe.cpp) reads the adapter GGUF the project exports, builds the
engine's LingTokenizer from its `tokenizer_json` tensor as gk-diffuser.cpp does, and runs
LLMAdapter::MingAdapterRunner. No Ling vocabulary installs offline, so the vocabulary is the tests'
tokenizer.json (tiny/ming.py: byte-level BPE trained on the demo prompts, the engine's Ling
specials as added tokens). Asserted:
  * the engine's slot ids (MingImageTE::build_prompt_tokens over LingTokenizer) are the project's
    (engine/ling_bpe.py ming_prompt_ids) on the tier's prompts;
  * the engine's adapter graph equals `load_gguf`'s forward at <= 1e-5 relative (max |diff| over
    max |value|), text only and with vision rows under the slots (vis_in / vis_q).

    python -m pytest -q tests/engine/test_ming_adapter_engine.py     # builds ming_probe once
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from adapter_cases import export_random
from ming_engine import Probe, build_probe
from tier_corpus import prompts

from gguf_trainer.model.adapters import AdapterConfig, load_gguf

pytestmark = pytest.mark.slow

IN, WIDTH, DEPTH, VIS = 64, 128, 2, 48
RTOL = 1e-5


@pytest.fixture(scope="module")
def binary():
    return build_probe()


@pytest.fixture(scope="module")
def tokenizer_json():
    from gguf_trainer.tiny.ming import ling_tokenizer_json

    return ling_tokenizer_json()


def _adapter(path, tokenizer_json):
    cfg = AdapterConfig("ming_image", IN, 192, WIDTH, DEPTH, num_queries=1024, seed_vocab=157184,
                        seed_rank=16, vis_dim=VIS, n_bank=256, bank_dim=160)
    return export_random(path, cfg, "ming_image", {"json": tokenizer_json})


def test_engine_slot_ids_are_the_projects(binary, tokenizer_json, tmp_path):
    from gguf_trainer.engine.ling_bpe import EngineLingBPE, ming_prompt_ids

    bpe = EngineLingBPE(tokenizer_json)
    probe = Probe(binary, adapter=_adapter(tmp_path / "a.gguf", tokenizer_json))
    try:
        assert probe.ready[-1] == "1", probe.ready  # the Ling tokenizer came from the file
        texts = prompts()
        mismatched = [t for t in texts if probe.ids("ling", t) != ming_prompt_ids(bpe, t)[0]]
        assert mismatched == [], f"{len(mismatched)} of {len(texts)}: {mismatched[:3]!r}"
        ids = probe.ids("ling", "a sheep in sunglasses")
        assert ids[:1] == [bpe.special_ids["<role>"]] and ids[-1] == bpe.special_ids["</role>"]
        print(f"engine Ling slot ids: {len(texts)} tier prompts, all equal")
    finally:
        probe.close()


@pytest.mark.parametrize("vision", [False, True], ids=["text", "vision"])
def test_engine_graph_is_load_gguf(binary, tokenizer_json, tmp_path, vision):
    from gguf_trainer.engine.ling_bpe import EngineLingBPE, ming_prompt_ids

    path = _adapter(tmp_path / "a.gguf", tokenizer_json)
    model = load_gguf(path)
    bpe = EngineLingBPE(tokenizer_json)
    probe = Probe(binary, adapter=path)
    g = torch.Generator().manual_seed(3)
    worst = 0.0
    try:
        for text in ("a sheep in sunglasses", "", "一只戴墨镜的羊, watercolor " * 8):
            n_image = 12 if vision else 0
            ids, start = ming_prompt_ids(bpe, text, n_image)
            L = max(1, len(text) // 3)
            hidden = torch.randn(1, L, IN, generator=g)
            hidden.numpy().astype(np.float32).tofile(tmp_path / "h.bin")
            (tmp_path / "ids.txt").write_text("".join(f"{i}\n" for i in ids))
            kw, extra = {}, ""
            if vision:
                vis = torch.randn(1, n_image, VIS, generator=g)
                vis = torch.nn.functional.normalize(vis, dim=-1)
                vis.numpy().astype(np.float32).tofile(tmp_path / "v.bin")
                vis_slot = torch.zeros(1, len(ids), VIS)
                vis_slot[0, start : start + n_image] = vis[0]
                kw = {"vis": vis, "vis_slot": vis_slot}
                extra = f" {tmp_path}/v.bin {n_image} {start}"
            out = probe.ask(f"run {tmp_path}/h.bin {L} {tmp_path}/ids.txt {tmp_path}/o.bin{extra}")
            with torch.no_grad():
                want = model(hidden, seed_ids=torch.tensor([ids]), **kw)[0].double().numpy()
            got = np.fromfile(tmp_path / "o.bin", dtype=np.float32).reshape(want.shape)
            assert int(out) == want.size
            rel = float(np.abs(got - want).max() / np.abs(want).max())
            worst = max(worst, rel)
            assert rel <= RTOL, (text[:20], rel)
    finally:
        probe.close()
    print(f"engine Ming adapter graph vs load_gguf ({'vision' if vision else 'text'}): "
          f"worst rel {worst:.2e}")
