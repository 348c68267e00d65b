"""`gguf-trainer check` of the slot kinds (qwen35_bridge, ming_image) against dumps in the exact
form ggk 0.9.7's Qwen35BridgeEmbedder / MingImageAdapterEmbedder write (conditioner.hpp
4137-4150, 4458-4488): adapter_out.bin, qwen_hidden.bin, seed_ids.txt + vis_pos.txt (the
bridge), vis_embeds.bin, whose rows come from the independent NumPy forward of
tests/engine_reference.py over the exported file, on the engine's slot ids (the file's own
vocabulary) and the student's states. The engine's own code writes them in
tests/engine/test_check_slots_engine.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from adapter_cases import export_random
from engine_reference import _lin, _tensors, slot_blocks, slot_forward, slot_inputs

from gguf_trainer.base.errors import UserError
from gguf_trainer.check import format_check, run_check
from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.model.adapters import AdapterConfig
from gguf_trainer.model.student import load_student
from gguf_trainer.packs import get_pack

PROMPT = "a sheep in sunglasses"
LONGER = "a sheep in sunglasses on a red bicycle at dawn"
HIDDEN = 64  # the tiny student


def ming_forward(path, hidden, seed_ids, vis=None, vis_slot=None) -> np.ndarray:
    """MingAdapter (llm_adapter.hpp 565-599) from the file alone: cap_query ++ seeded slots
    through the blocks, the caption rows zero-padded to out_dim, then the direct rows."""
    t = _tensors(path)
    kv, q = slot_inputs(t, hidden, seed_ids, vis, vis_slot)
    n_cap = t["cap_query"].shape[0]
    q = slot_blocks(t, np.concatenate([t["cap_query"], q], 0), kv)
    cap = _lin(t, "out_cap", q[:n_cap])
    direct = _lin(t, "out_proj", q[n_cap:])
    cap = np.pad(cap, ((0, 0), (0, direct.shape[1] - cap.shape[1])))
    return np.concatenate([cap, direct], 0)


@pytest.fixture(scope="module")
def student(tiny_materials):
    return load_student(tiny_materials["student"], tiny_materials["tokenizer"])


def _student_states(student, pack, prompt):
    ids = get_pack(pack).student_ids(engine_bpe(student.tokenizer).encode, Sample(prompt))
    assert ids == (engine_bpe(student.tokenizer).encode(prompt) or [151643])  # raw, no template
    x = torch.tensor([ids])
    with torch.no_grad():
        return student.hidden(x, torch.ones_like(x))[0].double().numpy()


def _write(folder, out, hidden, seed_ids=None, vis=None, runs=None):
    """The files one engine pass leaves: f32 rows, one id per line, "slot n" per reference."""
    folder.mkdir(parents=True, exist_ok=True)
    np.asarray(out, "<f4").tofile(folder / "adapter_out.bin")
    np.asarray(hidden, "<f4").tofile(folder / "qwen_hidden.bin")
    if seed_ids is not None:  # the bridge writes both, vis_pos.txt empty for a text-only run
        (folder / "seed_ids.txt").write_text("".join(f"{i}\n" for i in seed_ids))
        (folder / "vis_pos.txt").write_text("".join(f"{s} {n}\n" for s, n in runs or ()))
    if vis is not None:
        np.asarray(vis, "<f4").tofile(folder / "vis_embeds.bin")
    return folder


# ------------------------------------------------------------------ Qwen3.5 bridge


def small_vocabulary() -> tuple[list[str], list[str]]:
    """A byte-level vocabulary of the engine's form (tokens in id order, "a b" merges): the 256
    byte characters and a few merges; the engine's 33 specials go after it (qwen35_bpe). The
    released 248,320-token one is the engine tier's (test_check_slots_engine.py): reading it
    takes minutes on a loaded 2-core box."""
    from gguf_trainer.engine.qwen_bpe import byte_chars

    chars = byte_chars()
    merges = ["Ġ s", "h e", "e p", "Ġs h", "Ġsh ep"]
    tokens = list(chars) + [m.replace(" ", "") for m in merges]
    return tokens, merges


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    tokens, merges = small_vocabulary()
    root = tmp_path_factory.mktemp("bridge")
    cfg = AdapterConfig("qwen35_bridge", HIDDEN, 96, 64, 2, num_queries=256,
                        seed_vocab=len(tokens) + 33, seed_rank=8, vis_dim=32, n_bank=160,
                        bank_dim=48, bank_align=True)
    path = export_random(root / "pig_qwen3.5_9b_adapter-f16.gguf", cfg, "qwen35_bridge",
                         {"tokens": list(tokens), "merges": list(merges), "pre": "qwen35"},
                         seeds=(5, 6))
    from gguf_trainer.engine.qwen35_bpe import EngineQwen35BPE

    return root, path, EngineQwen35BPE(tokens, merges)


def test_bridge_slot_dump_is_the_adapter(bridge, student, tiny_materials, tmp_path):
    from gguf_trainer.engine.qwen35_bpe import moss_prompt

    _, path, bpe = bridge
    s, tok = tiny_materials["student"], tiny_materials["tokenizer"]
    ids = bpe.encode(moss_prompt(PROMPT))
    h = _student_states(student, "qwen35_bridge", PROMPT)
    out = slot_forward(path, h, ids)
    dump = _write(tmp_path / "moss", out, h, ids)
    res = run_check(path, s, dump, PROMPT, tok)
    print(f"bridge slots: cos {res['cos']:.7f} tokens {res['lead']['tokens']}")
    assert res["pack"] == "qwen35_bridge" and res["head"] == "slots"
    assert res["rows"] == res["slots"] == len(ids) and res["slot_ids_checked"]
    assert res["cos"] > 0.99999 and res["rel_mse"] < 1e-8 and res["student_cos"] > 0.99999
    # the lead: the prompt's own slots, not the template's 3 + 7 constant ones (" " stands in
    # for an empty prompt)
    assert res["lead"]["tokens"]["rows"] == len(ids) - (len(bpe.encode(moss_prompt(""))) - 1)
    assert res["verdict"].startswith("port check")
    text = format_check(res)
    assert "seed_ids.txt matches this prompt's" in text and "tokens:" in text

    bad = out.copy()
    at = len(bpe.encode("<|im_start|>user\n")) + 1
    bad[at] = bad[at + 1]  # one prompt slot wrong: the lead's worst row shows it
    res = run_check(path, s, _write(tmp_path / "bad", bad, h, ids), PROMPT, tok)
    assert res["lead"]["tokens"]["worst_row_cos_centered"] < 0.99 < res["cos"] < 0.9999


def test_bridge_dump_of_another_pass_is_a_sentence(bridge, student, tiny_materials, tmp_path):
    from gguf_trainer.engine.qwen35_bpe import moss_prompt

    _, path, bpe = bridge
    s, tok = tiny_materials["student"], tiny_materials["tokenizer"]
    empty = bpe.encode(moss_prompt(""))
    h = _student_states(student, "qwen35_bridge", "")
    cfg_pass = _write(tmp_path / "cfg", slot_forward(path, h, empty), h, empty)
    with pytest.raises(UserError, match="empty prompt's: with CFG on.*--cfg-scale 1"):
        run_check(path, s, cfg_pass, PROMPT, tok)
    other = bpe.encode(moss_prompt(LONGER))
    h = _student_states(student, "qwen35_bridge", LONGER)
    longer = _write(tmp_path / "longer", slot_forward(path, h, other), h, other)
    with pytest.raises(UserError, match=r"seed_ids.txt \(\d+ slots\) is not this prompt's"):
        run_check(path, s, longer, PROMPT, tok)
    (longer / "seed_ids.txt").unlink()  # without the ids, the row count tells
    with pytest.raises(UserError, match="another prompt or length was dumped"):
        run_check(path, s, longer, PROMPT, tok)
    family = tmp_path / "family"
    family.mkdir()
    np.zeros((len(other), 2560), "<f4").tofile(family / "adapter_out.bin")
    with pytest.raises(UserError, match="another family's conditioner or adapter"):
        run_check(path, s, family, PROMPT, tok)
    np.zeros((len(other), 96), "<f4").tofile(family / "adapter_out.bin")  # the bridge's width
    (family / "tokens.txt").write_text("1\n2\n")  # a token-aligned run's id file
    with pytest.raises(UserError, match="tokens.txt but no seed_ids.txt: it is another kind's"):
        run_check(path, s, family, PROMPT, tok)


def test_bridge_bank_dump_is_the_flux3_head(bridge, student, tiny_materials, tmp_path):
    """FLUX.3: the token-aligned bank, trimmed to the real rows' next multiple of 80."""
    from gguf_trainer.engine.qwen35_bpe import moss_prompt

    _, path, bpe = bridge
    enc = engine_bpe(student.tokenizer).encode
    ids = bpe.encode(moss_prompt(PROMPT))
    h = _student_states(student, "qwen35_bridge", PROMPT)
    pre, suf = enc("<|im_start|>user\n"), enc("<|im_end|>\n<|im_start|>assistant\n")
    bank_hidden = np.zeros((160, HIDDEN))
    bank_hidden[len(pre) : len(pre) + len(h)] = h
    real = len(pre) + len(h) + len(suf)
    out = slot_forward(path, h, ids, want_bank=True, bank_hidden=bank_hidden)[:80]
    dump = _write(tmp_path / "flux3", out, h, ids)
    res = run_check(path, tiny_materials["student"], dump, PROMPT, tiny_materials["tokenizer"])
    print(f"bridge bank: cos {res['cos']:.7f} lead {res['lead']}")
    assert res["head"] == "bank" and res["rows"] == 80 and res["cos"] > 0.99999
    assert res["lead"]["tokens"]["rows"] == real and res["lead"]["pads"]["rows"] == 80 - real


def test_bridge_reference_rows_come_from_the_dump(bridge, student, tiny_materials, tmp_path):
    from gguf_trainer.engine.qwen35_bpe import moss_prompt

    _, path, bpe = bridge
    ids = bpe.encode(moss_prompt(PROMPT, [6, 4]))
    pad = bpe.special_ids["<|image_pad|>"]
    starts = [i for i, t in enumerate(ids) if t == pad and ids[i - 1] != pad]
    runs = list(zip(starts, (6, 4)))  # each after its <|vision_start|>
    assert [ids[s : s + n] for s, n in runs] == [[pad] * 6, [pad] * 4]
    vis = np.random.default_rng(0).standard_normal((10, 32)) / 6
    vis_slot = np.zeros((len(ids), 32))
    vis_slot[starts[0] : starts[0] + 6], vis_slot[starts[1] : starts[1] + 4] = vis[:6], vis[6:]
    h = _student_states(student, "qwen35_bridge", PROMPT)
    out = slot_forward(path, h, ids, vis=vis, vis_slot=vis_slot)
    dump = _write(tmp_path / "refs", out, h, ids, vis=vis, runs=runs)
    s, tok = tiny_materials["student"], tiny_materials["tokenizer"]
    res = run_check(path, s, dump, PROMPT, tok)
    assert res["images"] == 2 and res["cos"] > 0.99999
    (dump / "vis_pos.txt").write_text(f"{starts[0] + 1} 6\n{starts[1]} 4\n")
    with pytest.raises(UserError, match=rf"references at slots \[{starts[0] + 1}, {starts[1]}\]"
                                        rf".*has them at \[{starts[0]}, {starts[1]}\]"):
        run_check(path, s, dump, PROMPT, tok)


# ------------------------------------------------------------------ Ming-Image


@pytest.fixture(scope="module")
def ming(tmp_path_factory):
    from gguf_trainer.engine.ling_bpe import EngineLingBPE
    from gguf_trainer.tiny.ming import ling_tokenizer_json

    text = ling_tokenizer_json()
    root = tmp_path_factory.mktemp("ming")
    cfg = AdapterConfig("ming_image", HIDDEN, 96, 64, 2, num_queries=256, seed_vocab=157184,
                        seed_rank=8, vis_dim=32, n_bank=24, bank_dim=64)
    path = export_random(root / "pig_ming_adapter-f16.gguf", cfg, "ming_image", {"json": text},
                         seeds=(5, 6))
    return path, EngineLingBPE(text)


def test_ming_dump_is_the_adapter(ming, student, tiny_materials, tmp_path):
    from gguf_trainer.engine.ling_bpe import ming_prompt_ids

    path, bpe = ming
    s, tok = tiny_materials["student"], tiny_materials["tokenizer"]
    ids, _ = ming_prompt_ids(bpe, PROMPT)
    h = _student_states(student, "ming_image", PROMPT)
    out = ming_forward(path, h, ids)
    assert out.shape == (24 + len(ids), 96) and not out[:24, 64:].any()
    dump = _write(tmp_path / "ming", out, h)
    res = run_check(path, s, dump, PROMPT, tok)
    print(f"ming: cos {res['cos']:.7f} lead {res['lead']}")
    assert res["pack"] == "ming_image" and res["rows"] == 24 + len(ids) and res["images"] == 0
    assert res["cos"] > 0.99999 and not res["slot_ids_checked"]
    assert res["lead"]["caption"]["rows"] == 24 and res["lead"]["caption"]["cos_centered"] > 0.9999
    assert 0 < res["lead"]["tokens"]["rows"] < len(ids)  # the prompt's own direct rows
    text = format_check(res)
    assert "caption:" in text and "Ming-Image dumps no slot ids" in text

    bad = out.copy()
    bad[:24] = bad[:24][::-1]  # the caption rows scrambled: the caption lead says so
    res = run_check(path, s, _write(tmp_path / "bad", bad, h), PROMPT, tok)
    assert res["lead"]["caption"]["cos_centered"] < 0.5 < res["lead"]["tokens"]["cos_centered"]


def test_ming_edit_dump_reads_its_image(ming, student, tiny_materials, tmp_path):
    from gguf_trainer.engine.ling_bpe import ming_prompt_ids

    path, bpe = ming
    s, tok = tiny_materials["student"], tiny_materials["tokenizer"]
    ids, start = ming_prompt_ids(bpe, PROMPT, 6)
    vis = np.random.default_rng(1).standard_normal((6, 32)) / 6
    vis_slot = np.zeros((len(ids), 32))
    vis_slot[start : start + 6] = vis
    h = _student_states(student, "ming_image", PROMPT)
    dump = _write(tmp_path / "edit", ming_forward(path, h, ids, vis, vis_slot), h, vis=vis)
    res = run_check(path, s, dump, PROMPT, tok)
    assert res["images"] == 1 and res["slots"] == len(ids) and res["cos"] > 0.99999
    # a text pass in a folder an edit run used before: vis_embeds.bin is stale, rows tell
    text_ids, _ = ming_prompt_ids(bpe, PROMPT)
    np.asarray(ming_forward(path, h, text_ids), "<f4").tofile(dump / "adapter_out.bin")
    res = run_check(path, s, dump, PROMPT, tok)
    assert res["images"] == 0 and res["cos"] > 0.99999
    np.zeros(7, "<f4").tofile(dump / "vis_embeds.bin")  # another adapter's width: not read either
    assert run_check(path, s, dump, PROMPT, tok)["images"] == 0


def test_ming_dump_of_another_pass_is_a_sentence(ming, student, tiny_materials, tmp_path):
    from gguf_trainer.engine.ling_bpe import ming_prompt_ids

    path, bpe = ming
    s, tok = tiny_materials["student"], tiny_materials["tokenizer"]
    ids, _ = ming_prompt_ids(bpe, LONGER)
    h = _student_states(student, "ming_image", LONGER)
    longer = _write(tmp_path / "longer", ming_forward(path, h, ids), h)
    with pytest.raises(UserError, match="another prompt or length was dumped"):
        run_check(path, s, longer, PROMPT, tok)
    ids, _ = ming_prompt_ids(bpe, PROMPT)
    h = _student_states(student, "ming_image", PROMPT)
    dump = _write(tmp_path / "same", ming_forward(path, h, ids), h)
    h2 = _student_states(student, "ming_image", LONGER)
    np.asarray(h2, "<f4").tofile(dump / "qwen_hidden.bin")  # the student read another prompt
    with pytest.raises(UserError, match="qwen_hidden.bin has 10 student rows but this prompt is 4"):
        run_check(path, s, dump, PROMPT, tok)


def test_teacher_dumps_give_the_adapters_quality(ming, bridge, student, tiny_materials, tmp_path):
    """The full teacher's run (no --llm-adapter): Ming's ming_te_out.bin + ming_tokens.txt,
    MOSS's llm_hidden.bin + tokens.txt; a stale qwen_hidden.bin of an adapter run is not read."""
    from gguf_trainer.engine.ling_bpe import ming_prompt_ids
    from gguf_trainer.engine.qwen35_bpe import moss_prompt

    s, tok = tiny_materials["student"], tiny_materials["tokenizer"]
    rng = np.random.default_rng(4)
    path, bpe = ming
    ids, _ = ming_prompt_ids(bpe, PROMPT)
    h = _student_states(student, "ming_image", PROMPT)
    teacher = ming_forward(path, h, ids)
    teacher[24:] += rng.standard_normal(teacher[24:].shape) * teacher[24:].std()  # not the adapter
    folder = tmp_path / "ming"
    folder.mkdir()
    np.asarray(teacher, "<f4").tofile(folder / "ming_te_out.bin")
    (folder / "ming_tokens.txt").write_text("".join(f"{i}\n" for i in ids))
    np.zeros((3, HIDDEN), "<f4").tofile(folder / "qwen_hidden.bin")  # stale: another prompt
    res = run_check(path, s, folder, PROMPT, tok)
    print(f"ming teacher dump: cos {res['cos']:.4f} lead {res['lead']}")
    assert res["verdict"].startswith("quality") and res["slot_ids_checked"]
    assert res["lead"]["caption"]["cos"] > 0.9999 > res["lead"]["tokens"]["cos"]
    assert res["student_cos"] is None and "ming_tokens.txt matches" in format_check(res)
    (folder / "ming_tokens.txt").write_text("".join(f"{i}\n" for i in ids[:-1] + [5]))
    with pytest.raises(UserError, match="ming_tokens.txt .* is not this prompt's"):
        run_check(path, s, folder, PROMPT, tok)

    _, path, bpe = bridge
    ids = bpe.encode(moss_prompt(PROMPT))
    h = _student_states(student, "qwen35_bridge", PROMPT)
    teacher = slot_forward(path, h, ids) + rng.standard_normal((len(ids), 96))
    folder = tmp_path / "moss"
    folder.mkdir()
    np.asarray(teacher, "<f4").tofile(folder / "llm_hidden.bin")
    (folder / "tokens.txt").write_text("".join(f"{i}\n" for i in ids))
    res = run_check(path, s, folder / "llm_hidden.bin", PROMPT, tok)
    assert res["verdict"].startswith("quality") and res["head"] == "slots"
    assert res["slot_ids_checked"] and 0 < res["cos"] < 0.999
