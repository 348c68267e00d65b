"""Engine tier, `gguf-trainer check` of the slot kinds against dumps the engine's own code wrote.

The dump folder holds what ggk 0.9.7's Qwen35BridgeEmbedder / MingImageAdapterEmbedder write
with SD_DUMP_COND (conditioner.hpp 4137-4150, 4458-4488), made as engine_ggk.py makes PixArt's:
  seed_ids.txt     (bridge) the slot ids of the engine's Qwen35Tokenizer over the file's own
                   vocabulary and its MOSS template (qwen35_probe `moss`); vis_pos.txt empty;
                   Ming writes no id file (its ids, ming_probe `ling`, only feed the run)
  qwen_hidden.bin  the tiny student's final-norm states on the raw prompt (run by this tool: the
                   engine's Qwen3 graph is not part of the tier's build)
  adapter_out.bin  the exported file read and run by the engine's LLMAdapter::Qwen35BridgeRunner
                   / MingAdapterRunner on those states and slot ids; FLUX.3's bank cut to the
                   real rows' next multiple of 80 as the conditioner cuts it (4440-4456)
Asserted: check's port figure is >= 1 - 1e-5 on each (text, edit rows for Ming, the bank for
the bridge), and a dump of the CFG negative pass is one sentence. The full Ming teacher's dump
(ming_te_out.bin + ming_tokens.txt from the engine's MingImageTextRunner on the tiny encoder) is
read in the engine's layout: the figure equals the one against the torch port's rows.

    python -m pytest -q tests/engine/test_check_slots_engine.py   # the probes build once
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from adapter_cases import export_random
from ming_engine import Probe as MingProbe
from ming_engine import build_probe as build_ming_probe
from qwen35_engine import Probe as BridgeProbe
from qwen35_engine import build_probe as build_bridge_probe

from gguf_trainer.base.errors import UserError
from gguf_trainer.check import format_check, run_check
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.model.adapters import AdapterConfig
from gguf_trainer.model.student import load_student

pytestmark = pytest.mark.slow

PROMPT = "a sheep in sunglasses, watercolor"
TOL = 1e-5


@pytest.fixture(scope="module")
def student(tiny_materials):
    return load_student(tiny_materials["student"], tiny_materials["tokenizer"])


def _states(student, folder, prompt):
    """qwen_hidden.bin (and h.bin for the probe): the student on the raw prompt."""
    ids = engine_bpe(student.tokenizer).encode(prompt) or [151643]
    x = torch.tensor([ids])
    with torch.no_grad():
        h = student.hidden(x, torch.ones_like(x))[0].numpy().astype("<f4")
    folder.mkdir(parents=True, exist_ok=True)
    h.tofile(folder / "qwen_hidden.bin")
    h.tofile(folder / "h.bin")
    return h


def _ids_file(folder, ids, name="ids.txt"):
    (folder / name).write_text("".join(f"{i}\n" for i in ids))
    return folder / name


def test_check_reads_the_engines_bridge_dumps(student, tiny_materials, tmp_path):
    from gguf_trainer.tiny.qwen35 import qwen35_vocabulary

    tokens, merges = qwen35_vocabulary()
    in_dim = _states(student, tmp_path, "x").shape[1]
    cfg = AdapterConfig("qwen35_bridge", in_dim, 96, 128, 2, num_queries=512,
                        seed_vocab=len(tokens), seed_rank=16, vis_dim=64, n_bank=160,
                        bank_dim=48, bank_align=True)
    path = export_random(tmp_path / "pig_qwen3.5_9b_adapter-f16.gguf", cfg, "qwen35_bridge",
                         {"tokens": list(tokens), "merges": list(merges), "pre": "qwen35"})
    s, tok = tiny_materials["student"], tiny_materials["tokenizer"]
    enc = engine_bpe(student.tokenizer).encode
    probe = BridgeProbe(build_bridge_probe(), path)
    try:
        for prompt, folder, head in ((PROMPT, tmp_path / "moss", "slots"),
                                     ("", tmp_path / "negative", "slots"),
                                     (PROMPT, tmp_path / "flux3", "bank")):
            h = _states(student, folder, prompt)
            slots = probe.ids("moss", prompt)
            ids = _ids_file(folder, slots, "seed_ids.txt")
            (folder / "vis_pos.txt").write_text("")
            extra = ""
            if head == "bank":
                pre, suf = enc("<|im_start|>user\n"), enc("<|im_end|>\n<|im_start|>assistant\n")
                bank = np.zeros((160, h.shape[1]), "<f4")
                bank[len(pre) : len(pre) + len(h)] = h
                bank.tofile(folder / "bh.bin")
                extra = f" {folder}/bh.bin"
                keep = -(-(len(pre) + len(h) + len(suf)) // 80) * 80
            out = probe.ask(f"run {folder}/h.bin {len(h)} {ids} {folder}/o.bin "
                            f"{int(head == 'bank')}{extra}")
            rows = np.fromfile(folder / "o.bin", "<f4")
            assert int(out) == rows.size
            if head == "bank":  # the conditioner's slice: what the DiT sees and the dump shows
                rows = rows.reshape(160, 48)[:keep]
            rows.tofile(folder / "adapter_out.bin")
            if prompt == "":  # the CFG negative pass left last in the folder
                with pytest.raises(UserError, match="empty prompt's: with CFG on"):
                    run_check(path, s, folder, PROMPT, tok)
                continue
            res = run_check(path, s, folder, prompt, tok)
            print(f"engine {head} dump: {res['rows']} rows, cos {res['cos']:.8f}, lead "
                  + ", ".join(f"{n} {f['cos_centered']:.8f}" for n, f in res["lead"].items()))
            print(format_check(res))
            assert res["head"] == head and res["slot_ids_checked"]
            assert res["cos"] >= 1 - TOL and res["rel_mse"] <= TOL
            assert all(f["cos_centered"] >= 1 - TOL for f in res["lead"].values())
    finally:
        probe.close()


@pytest.mark.parametrize("edit", [False, True], ids=["text", "edit"])
def test_check_reads_the_engines_ming_dumps(student, tiny_materials, tmp_path, edit):
    from gguf_trainer.engine.ling_bpe import EngineLingBPE, ming_prompt_ids
    from gguf_trainer.tiny.ming import ling_tokenizer_json

    text = ling_tokenizer_json()
    h = _states(student, tmp_path, PROMPT)
    cfg = AdapterConfig("ming_image", h.shape[1], 192, 128, 2, num_queries=512,
                        seed_vocab=157184, seed_rank=16, vis_dim=48, n_bank=256, bank_dim=128)
    path = export_random(tmp_path / "pig_ming_adapter-f16.gguf", cfg, "ming_image", {"json": text})
    probe = MingProbe(build_ming_probe(), adapter=path)
    try:
        extra = ""
        if edit:  # the image's slots: the engine's template with 6 patches, from the port
            ids, start = ming_prompt_ids(EngineLingBPE(text), PROMPT, 6)
            vis = np.random.default_rng(2).standard_normal((6, 48)).astype("<f4") / 7
            vis.tofile(tmp_path / "vis_embeds.bin")
            extra = f" {tmp_path}/vis_embeds.bin 6 {start}"
        else:
            ids = probe.ids("ling", PROMPT)  # the engine's LingTokenizer over the file's json
        out = probe.ask(f"run {tmp_path}/h.bin {len(h)} {_ids_file(tmp_path, ids)} "
                        f"{tmp_path}/adapter_out.bin{extra}")
        assert int(out) == (256 + len(ids)) * 192
    finally:
        probe.close()
    res = run_check(path, tiny_materials["student"], tmp_path, PROMPT, tiny_materials["tokenizer"])
    print(f"engine Ming dump ({'edit' if edit else 'text'}): {res['rows']} rows, cos "
          f"{res['cos']:.8f}, lead "
          + ", ".join(f"{n} {f['cos_centered']:.8f}" for n, f in res["lead"].items()))
    assert res["images"] == int(edit) and res["slots"] == len(ids)
    assert res["cos"] >= 1 - TOL and res["rel_mse"] <= TOL
    assert res["lead"]["caption"]["cos_centered"] >= 1 - TOL
    assert res["lead"]["tokens"]["cos_centered"] >= 1 - TOL


def test_check_reads_the_engines_ming_teacher_dump(student, tiny_materials, tmp_path):
    """The full teacher's dump (MingImageEmbedder: ming_te_out.bin + ming_tokens.txt), written by
    the engine's MingImageTextRunner on the tiny Ming text encoder: check reads its layout
    (256 caption rows zero-padded, then the direct rows) and ids as the engine's; its figure
    equals the one against the torch port's rows in that layout (test_ming_teacher_engine
    shows the two agree within 1e-4)."""
    from dataclasses import replace

    from test_ming_teacher_engine import write_te

    from gguf_trainer.tiny.ming import TINY, build_tiny_ming, ling_tokenizer_json

    model = build_tiny_ming(cfg=replace(TINY, engine_moe=True))
    c = model.cfg
    write_te(tmp_path / "te.gguf", model)
    h = _states(student, tmp_path / "dump", PROMPT)
    cfg = AdapterConfig("ming_image", h.shape[1], c.diffusion_dim, 128, 2, num_queries=512,
                        seed_vocab=157184, seed_rank=16, vis_dim=48, n_bank=c.num_queries,
                        bank_dim=c.caption_dim)
    path = export_random(tmp_path / "pig_ming_adapter-f16.gguf", cfg, "ming_image",
                         {"json": ling_tokenizer_json()})
    (tmp_path / "dump" / "qwen_hidden.bin").unlink()  # the teacher's run writes none
    probe = MingProbe(build_ming_probe(), te=tmp_path / "te.gguf", adapter=path)
    try:
        ids = probe.ids("ling", PROMPT)
        _ids_file(tmp_path / "dump", ids, "ming_tokens.txt")
        n = int(probe.ask(f"te {tmp_path}/dump/ming_tokens.txt {tmp_path}/dump/ming_te_out.bin"))
    finally:
        probe.close()
    assert n == (c.num_queries + len(ids)) * c.diffusion_dim
    s, tok = tiny_materials["student"], tiny_materials["tokenizer"]
    res = run_check(path, s, tmp_path / "dump", PROMPT, tok)
    print(f"adapter vs the engine's Ming teacher: {res['rows']} rows, cos {res['cos']:.4f}, lead "
          + ", ".join(f"{k} {f['cos_centered']:.4f}" for k, f in res["lead"].items()))
    assert res["verdict"].startswith("quality") and res["slot_ids_checked"]
    assert res["rows"] == c.num_queries + len(ids) and res["student_cos"] is None
    with torch.no_grad():
        out = model([ids])
    port = np.zeros((c.num_queries + len(ids), c.diffusion_dim), "<f4")
    port[: c.num_queries, : c.caption_dim] = out.caption[0].numpy()
    port[c.num_queries :] = out.direct[0].numpy()
    torch_dir = tmp_path / "port"
    torch_dir.mkdir()
    port.tofile(torch_dir / "ming_te_out.bin")
    _ids_file(torch_dir, ids, "ming_tokens.txt")
    want = run_check(path, s, torch_dir, PROMPT, tok)
    assert abs(res["cos"] - want["cos"]) < 1e-3
    for k in ("caption", "tokens"):
        assert abs(res["lead"][k]["cos_centered"] - want["lead"][k]["cos_centered"]) < 1e-3
