"""Fibo 2.0 edits (qwen3vl_fibo2 with reference images): the size rule and the 8-bit bicubic of
fibo2.hpp 198-259, the edit JSON and its expanded markers (125-151, 292-316), the tap teacher's
full Qwen3-VL path (deepstack after the first layers, M-RoPE image positions, taps after the
deepstack addition) against transformers' own Qwen3VLModel, batched = per sample, and the
layerwise export with vision_proj + vis_in (text-only layerwise packs keep none)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.fibo2 import fibo2_target_size, preprocess_fibo2, resize_8bit, vlm_size
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.engine.qwen_vl_images import engine_refuses, patchify
from gguf_trainer.model.adapters import build_adapter
from gguf_trainer.model.student import load_tokenizer
from gguf_trainer.model.vision import image_runs
from gguf_trainer.packs import get_pack
from gguf_trainer.teachers.base import VisionSegment
from gguf_trainer.teachers.qwen_taps import TapLayout, load_tap_teacher, mrope_positions
from gguf_trainer.tiny import qwen_tokenizer_dir
from gguf_trainer.tiny.qwen_taps import HIDDEN

PACK = get_pack("qwen3vl_fibo2")
PAD, VSTART, VEND = 151655, 151652, 151653


@pytest.fixture(scope="module")
def encode():
    return engine_bpe(load_tokenizer(qwen_tokenizer_dir())).encode


def test_the_size_rule_is_the_engines_arithmetic():
    """fibo2.hpp 238-258 worked by hand: llround halves away from zero (48x80 -> 64x96, where
    Python's round gives 64x64), the 768 px long side, the 3136 px minimum area."""
    assert fibo2_target_size(48, 80) == (64, 96)
    assert fibo2_target_size(535, 401) == (544, 416)
    assert fibo2_target_size(768, 1024) == (576, 768)  # 0.75: 18 x 24 = 432 vision rows
    assert fibo2_target_size(4000, 3000) == (768, 576)
    assert fibo2_target_size(769, 100) == (768, 96)  # 100 * 768/769 = 99.87 -> 100 -> 96
    assert fibo2_target_size(1, 1) == (64, 64)  # beta = 56: ceil(56/32) = 2 cells a side
    # 1000x1 -> 768x1 (max(1, llround(0.768))), area 0 < 3136: beta = sqrt(3136/768)
    beta = math.sqrt(3136 / 768)
    assert fibo2_target_size(1000, 1) == (math.ceil(768 * beta / 32) * 32, 32) == (1568, 32)
    assert vlm_size(500, 700) == (500, 700) and vlm_size(1536, 770) == (768, 385)
    # the engine resizes straight to the size: no shape is refused (unlike clip_preprocess)
    assert not any(engine_refuses(h, w, PACK.image_size) for h, w in [(592, 78), (535, 8)])
    assert PACK.image_size is fibo2_target_size


def _engine_resize(x: np.ndarray, th: int, tw: int) -> np.ndarray:
    """core/tensor.hpp interpolate_2d_filter (bicubic, antialias) written as its loops, then
    fibo2.hpp's 8-bit rounding: the reference for resize_8bit's matrix form."""

    def contributors(n_in, n_out):
        scale = n_in / n_out
        fs = max(1.0, scale)
        out = []
        for o in range(n_out):
            c = (o + 0.5) * scale - 0.5
            taps = []
            for i in range(math.ceil(c - 2 * fs), math.floor(c + 2 * fs) + 1):
                d = abs((c - i) / fs)
                a = -0.75
                w = (((a + 2) * d - (a + 3)) * d * d + 1 if d <= 1
                     else ((a * d - 5 * a) * d + 8 * a) * d - 4 * a if d < 2 else 0.0)
                if w:
                    taps.append((min(max(i, 0), n_in - 1), w))
            s = sum(w for _, w in taps)
            out.append([(i, w / s) for i, w in taps])
        return out

    h, w, ch = x.shape
    cy, cx = contributors(h, th), contributors(w, tw)
    out = np.zeros((th, tw, ch), np.float32)
    for c in range(ch):
        for y in range(th):
            for xo in range(tw):
                v = 0.0
                for yi, yw in cy[y]:
                    for xi, xw in cx[xo]:
                        v += float(x[yi, xi, c]) * xw * yw
                out[y, xo, c] = np.float32(v)
    r = np.floor(out.astype(np.float64) * 255 + 0.5).astype(np.float32)  # v >= 0 here
    return np.clip(r / np.float32(255), 0, 1)


def test_resize_8bit_is_the_engines_bicubic():
    rng = np.random.default_rng(3)
    x = (rng.integers(0, 256, (23, 17, 3)).astype(np.float32) / np.float32(255))
    for th, tw in [(9, 11), (40, 29), (23, 8)]:  # down, up, one axis
        got = resize_8bit(x, th, tw)
        assert got.dtype == np.float32 and got.shape == (th, tw, 3)
        assert np.array_equal(got, _engine_resize(x, th, tw)), (th, tw)
        assert np.array_equal(np.round(got * 255), got * 255)  # 8-bit values
    assert resize_8bit(x, 23, 17) is x  # the same size: untouched (fibo2.hpp 200-202)
    flat = np.full((50, 70, 3), 0.4, np.float32)
    assert np.allclose(resize_8bit(flat, 13, 90), np.float32(round(0.4 * 255) / 255))


def test_preprocess_scales_then_grids_then_centres(tmp_path):
    """A 1000x600 picture: 768x461 first (8-bit), then the grid's 768x448, as 2v - 1."""
    rng = np.random.default_rng(4)
    pic = rng.integers(0, 256, (600, 1000, 3), dtype=np.uint8)
    path = tmp_path / "p.png"
    Image.fromarray(pic).save(path)
    x = preprocess_fibo2(path)
    assert x.shape == (3, 448, 768) and x.dtype == np.float32
    step = resize_8bit(pic.astype(np.float32) / np.float32(255), 461, 768)
    one = np.float32(1)
    want = np.float32(2) * (resize_8bit(step, 448, 768) * one + one - one) - one  # fibo2.hpp 266
    assert np.array_equal(x, want.transpose(2, 0, 1)) and x.min() >= -1 and x.max() <= 1
    Image.fromarray(np.concatenate([pic, pic[..., :1]], 2), "RGBA").save(tmp_path / "a.png")
    assert np.array_equal(preprocess_fibo2(tmp_path / "a.png"), x)  # alpha dropped, as ggk does


def _template(encode, text, counts):
    sample = Sample(text, images=tuple(f"{i}.png" for i in range(len(counts))))
    (piece,) = PACK.student_pieces(sample, counts)
    return piece.text, PACK.student_ids(encode, sample, counts)


def test_the_edit_template_and_its_image_runs(encode):
    text, ids = _template(encode, "make it night", [6])
    assert text == ('<|im_start|>user\n{"image":"<|vision_start|>' + "<|image_pad|>" * 6
                    + '<|vision_end|>","edit_instruction":"make it night"}<|im_end|>\n'
                    "<|im_start|>assistant\n")
    (start, n), = image_runs(ids, PAD)
    assert n == 6 and ids[start - 1] == VSTART and ids[start + n] == VEND
    # the engine's splice row: the tokens of everything before the marker (fibo2.hpp 299)
    assert start == len(encode(text[: text.index("<|image_pad|>")]))
    # two images, a JSON caption with an instruction: image_1, image_2, the caption, then it
    prompt = json.dumps({"short_description": "a pig", "aesthetic_score": 7,
                         "objects": [], "edit_instruction": "add a hat"})
    text, ids = _template(encode, prompt, [2, 3])
    body = text.split("\n")[1].removesuffix("<|im_end|>")
    assert list(json.loads(body)) == ["image_1", "image_2", "structured_caption",
                                      "edit_instruction"]
    assert json.loads(body)["structured_caption"] == {"short_description": "a pig"}
    assert [n for _, n in image_runs(ids, PAD)] == [2, 3]
    # a JSON caption without an instruction: the whole prompt is the instruction (128-132)
    caption = '{"short_description": "a pig"}'
    text, _ = _template(encode, caption, [1])
    assert json.loads(text.split("\n")[1].removesuffix("<|im_end|>")) == {
        "image": "<|vision_start|><|image_pad|><|vision_end|>", "edit_instruction": caption}
    # an empty prompt with an image: an empty instruction, not the null caption
    assert '"edit_instruction":""' in _template(encode, "", [1])[0]
    # text-only samples keep the text-to-image caption
    assert PACK.student_pieces(Sample(""), ())[0].text == PACK.format_prompt("")


def test_mrope_positions_are_the_engines():
    """llm.hpp 2336-2365: text counts on; a 2x3 image at row 2 sits at t = 2, h = 2 + row,
    w = 2 + col; the text after it resumes at 2 + max(2, 3)."""
    t, h, w = mrope_positions(10, [(2, 2, 3)])
    assert t == [0, 1, 2, 2, 2, 2, 2, 2, 5, 6]
    assert h == [0, 1, 2, 2, 2, 3, 3, 3, 5, 6]
    assert w == [0, 1, 2, 3, 4, 2, 3, 4, 5, 6]
    assert mrope_positions(3, []) == [[0, 1, 2]] * 3


@pytest.fixture(scope="module")
def teacher(tiny_tap_teacher):
    root = tiny_tap_teacher("qwen3_vl", 4)
    layout = TapLayout(taps=(1, 2, 3, 4), image_preprocess=preprocess_fibo2)
    t = load_tap_teacher(root, "cpu", student_pieces=PACK.student_pieces, layout=layout,
                         family="Fibo 2.0")
    yield root, t
    t.close()


def _edit_batch(teacher, tmp_path):
    rng = np.random.default_rng(0)
    paths = []
    for i, (h, w) in enumerate([(70, 100), (130, 64)]):
        paths.append(tmp_path / f"im{i}.png")
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(paths[-1])
    samples = [Sample("make it night", images=(paths[0],)),
               Sample("a cat", images=(paths[0], paths[1])), Sample("plain text")]
    rows = teacher.vision([p for s in samples for p in s.images])
    encode = engine_bpe(teacher.tokenizer).encode
    ids, segs, at = [], [], 0
    for s in samples:
        r = rows[at : at + len(s.images)]
        at += len(s.images)
        ids.append(PACK.student_ids(encode, s, [x.shape[0] for x in r]))
        segs.append([VisionSegment(a, x) for (a, _), x in zip(image_runs(ids[-1], PAD), r)])
    return samples, ids, segs


def test_the_teacher_runs_the_full_qwen3vl_path(teacher, tmp_path):
    """Against transformers' own Qwen3VLModel given the pixels and the image token types (its
    get_rope_index and deepstack): taps 2 and 3 equal its hidden states; tap 1 adds the
    deepstack rows at the image rows only (taken after the addition, as llm.hpp 1782-1795);
    tap 4 is layer 4's raw output (its final norm is the model's last state)."""
    from transformers import Qwen3VLModel

    root, t = teacher
    samples, ids, segs = _edit_batch(t, tmp_path)
    got = t.targets(samples, ids, segs)
    model = Qwen3VLModel.from_pretrained(str(root), dtype=torch.float32).eval()
    for sample, row, g in zip(samples, ids, got):
        x = torch.tensor([row])
        kw = {}
        if sample.images:
            prepared = [patchify(preprocess_fibo2(p)) for p in sample.images]
            kw = {"pixel_values": torch.from_numpy(np.concatenate([r for r, _ in prepared])),
                  "image_grid_thw": torch.tensor([g_ for _, g_ in prepared]),
                  "mm_token_type_ids": (x == PAD).int()}
        with torch.no_grad():
            hs = model(input_ids=x, output_hidden_states=True, **kw).hidden_states
        taps = [g.rows[:, k * HIDDEN : (k + 1) * HIDDEN] for k in range(4)]
        image = x[0] == PAD
        for k in (2, 3):
            torch.testing.assert_close(taps[k - 1], hs[k][0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(taps[0][~image], hs[1][0][~image], rtol=1e-4, atol=1e-4)
        if sample.images:
            assert (taps[0][image] - hs[1][0][image]).abs().max() > 1e-2
        with torch.no_grad():
            normed = model.language_model.norm(taps[3])
        torch.testing.assert_close(normed, hs[4][0], rtol=1e-4, atol=1e-4)
        assert g.sup_start == 0 and g.rows.shape == (len(row), 4 * HIDDEN)


def test_batched_edit_targets_equal_per_sample(teacher, tmp_path):
    _, t = teacher
    samples, ids, segs = _edit_batch(t, tmp_path)
    batched = t.targets(samples, ids, segs)
    for i in range(len(samples)):
        alone = t.targets([samples[i]], [ids[i]], [segs[i]])[0]
        torch.testing.assert_close(batched[i].rows, alone.rows, rtol=1e-4, atol=1e-4)


def test_only_fibo2_exports_the_vision_extension():
    """Fibo 2.0's adapter: layerwise, 15 taps, vision_proj + vis_in (fibo2.hpp 217-221); every
    text-only layerwise pack's adapter has neither."""
    train = SimpleNamespace(width=128, depth=1)
    for pid in ("qwen3vl_krea2", "qwen3vl_flux3", "qwen3vl_fibo2", "qwen3vl_ideogram4",
                "qwen3vl_sefi", "qwen3_flux2_klein"):
        pack = get_pack(pid)
        cfg = pack.adapter_config(train, 64, out_dim=len(pack.taps) * 16, vis_dim=pack.vis_dim)
        module = build_adapter(cfg)
        names = set(module.state_dict())
        vision = {"vision_proj.weight", "vis_in.weight"} <= names
        assert cfg.kind == "layerwise" and "layer_map" in names
        assert vision == (pid == "qwen3vl_fibo2") and bool(cfg.vis_dim) == vision, pid
    assert PACK.vis_dim == 2560 and PACK.image_pad_id == PAD


def test_the_preflight_counts_the_vision_tower(teacher):
    """Edits load the tower too: Fibo 2.0's need is the text stack's plus the tower's."""
    from gguf_trainer.teachers.qwen_taps import text_stack_params

    root, t = teacher
    tower = sum(p.numel() for p in t.visual.parameters())
    text_gib = text_stack_params(root) * 4 / 1024**3
    got = PACK.teacher_gib({"teacher": root}, "cpu")
    assert got == pytest.approx(text_gib + tower * 4 / 1024**3, rel=1e-6) and got > text_gib


def _fibo2_edit_dump(tmp_path, tiny_materials, shift=0):
    """A tiny Fibo 2.0 vision adapter and what ggk's SD_DUMP_COND writes for one edit pass with
    it: adapter_out.bin (tests/engine_reference.py's forward), qwen_hidden.bin, tokens.txt,
    vis_embeds.bin and vis_pos.txt (`shift` moves the written start row)."""
    from engine_reference import engine_forward

    from gguf_trainer.model.adapters import AdapterConfig
    from gguf_trainer.model.export import write_adapter_gguf
    from gguf_trainer.model.student import load_student

    student = load_student(tiny_materials["student"], tiny_materials["tokenizer"])
    cfg = AdapterConfig("layerwise", 64, 15 * 16, 64, 1, vis_dim=16, taps=PACK.taps)
    torch.manual_seed(0)
    module = build_adapter(cfg)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = tmp_path / "pig_qwen3vl_fibo2_adapter-f16.gguf"
    write_adapter_gguf(path, module.state_dict(), cfg, metadata={"adapter.pack": PACK.id})
    raw = torch.randn(4, 16, generator=torch.Generator().manual_seed(2))
    sample = Sample("make it night", images=("ref.png",))
    ids = PACK.student_ids(engine_bpe(student.tokenizer).encode, sample, [4])
    (start, _), = image_runs(ids, PAD)
    x = torch.tensor([ids])
    with torch.no_grad():
        proj = raw @ module.vision_proj.weight.T
        hidden = student.hidden(x, torch.ones_like(x), splices=[(0, start, proj)])[0]
    vis = torch.zeros(len(ids), 16)
    vis[start : start + 4] = raw
    dump = tmp_path / "dump"
    dump.mkdir()
    engine_forward(path, hidden.numpy(), vis=vis.numpy()).astype("<f4").tofile(
        dump / "adapter_out.bin")
    hidden.numpy().astype("<f4").tofile(dump / "qwen_hidden.bin")
    (dump / "tokens.txt").write_text("".join(f"{i}\n" for i in ids))
    raw.numpy().astype("<f4").tofile(dump / "vis_embeds.bin")
    (dump / "vis_pos.txt").write_text(f"{start + shift} 4\n")
    return path, dump


def test_check_reads_an_edit_dump(tmp_path, tiny_materials):
    """`gguf-trainer check` of a Fibo 2.0 vision adapter against an edit dump: the images come
    from the dump (raw rows, splice rows), the figures are the engine's (cos 1 against the
    engine's own forward); a dump whose rows sit elsewhere is one sentence."""
    from gguf_trainer.base.errors import UserError
    from gguf_trainer.check import format_check, run_check

    adapter, dump = _fibo2_edit_dump(tmp_path / "ok", tiny_materials)
    got = run_check(adapter, tiny_materials["student"], dump, "make it night",
                    tokenizer_dir=tiny_materials["tokenizer"])
    assert got["images"] == 1 and got["tokens_checked"] and got["pack"] == PACK.id
    assert got["cos"] > 0.99999 and got["student_cos"] > 0.99999
    assert min(got["per_tap"]["cos"]) > 0.99999
    assert "1 reference image(s) from vis_embeds.bin" in format_check(got)
    adapter, dump = _fibo2_edit_dump(tmp_path / "moved", tiny_materials, shift=1)
    with pytest.raises(UserError, match="splices the images at rows"):
        run_check(adapter, tiny_materials["student"], dump, "make it night",
                  tokenizer_dir=tiny_materials["tokenizer"])
