"""Qwen Image 2.1 edits (conditioner.hpp 3050-3153, gk-diffuser.cpp 6017-6072): the pipeline's
reference size rule at the render area, the pixels the tower takes (nearest, alpha over white,
2x − 1), the `<imageN><|vision_start|>` template with its runs at the rows the engine's tokenizer
counts, M-RoPE image positions against transformers' own get_rope_index, and the teacher on a
tiny real Qwen3-VL against transformers' full forward (its own deepstack and rope index) read
before the final norm; the student side keeps the main merger rows (token_aligned_vision)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import Qwen3VLModel

from gguf_trainer.base.errors import UserError
from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.engine.qwen_image_refs import (
    RefImage,
    align_render,
    default_ref_size,
    ref_pixels,
    ref_size,
    render_area,
)
from gguf_trainer.engine.qwen_vl_images import engine_refuses, patchify, vision_tokens
from gguf_trainer.engine.template_ids import Piece, template_ids
from gguf_trainer.model.student import load_tokenizer
from gguf_trainer.model.vision import image_runs
from gguf_trainer.packs import get_pack
from gguf_trainer.teachers import qwen3vl
from gguf_trainer.teachers.base import VisionSegment
from gguf_trainer.tiny import qwen_tokenizer_dir
from gguf_trainer.tiny.qwen3vl import HIDDEN, copy_tiny_qwen3vl

PACK = get_pack("qwen3vl_qwen_image_2_1")
SYSTEM = "<|im_start|>system\nComprehend and analyze the provided prompt.<|im_end|>\n"  # 3079
USER = "<|im_start|>user\n"  # 3084
TAIL = "<|im_end|>\n<|im_start|>assistant\n"  # 3152
PAD = "<|image_pad|>"


@pytest.fixture(scope="module")
def encode():
    return engine_bpe(load_tokenizer(qwen_tokenizer_dir())).encode


def test_the_size_rule_is_the_pipelines_at_the_render_area():
    """w̄' = sqrt((A·w) // h), h̄' = w̄'·h/w, each max(32, round(/32)·32) (6036-6044)."""
    a = 1024 * 1024
    assert ref_size(1000, 1000, a) == (1024, 1024)
    # 1048576·1024 // 768 = 1398101 -> 1182.41 (36.95 cells -> 37), h 886.8 (27.71 -> 28)
    assert ref_size(768, 1024, a) == (896, 1184)
    # the first reference at its own area keeps its size, rounded per side (6.25 -> 6, 9.375 -> 9)
    assert ref_size(300, 200, 300 * 200) == (288, 192)
    # no cap on a long side: sqrt(1048576·4000 // 5) = 28963.1 -> 905 cells
    assert ref_size(5, 4000, a) == (32, 28960) and ref_size(4000, 5, a) == (28960, 32)
    assert ref_size(48, 48, 512 * 512) == (512, 512)  # upscaled to the render's area
    assert vision_tokens(768, 1024, default_ref_size) == 28 * 37
    for h, w in ((37, 91), (300, 200), (1024, 768), (5, 2000), (4000, 3000)):
        th, tw = ref_size(h, w, 768 * 768)
        assert th % 32 == tw % 32 == 0 and 0.8 < th * tw / 768**2 < 1.25 or min(th, tw) == 32
    assert align_render(1000, 700) == (1024, 704)  # -W/-H aligned up to 32
    assert render_area({}) == 1024 * 1024 and render_area({"render": [200, 100]}) == 224 * 128
    for bad in ([0, 10], "512x512", [512], [512.0, 512], [True, 512]):
        with pytest.raises(UserError, match="render"):
            render_area({"render": bad})
    # nearest straight to the size, no crop: the corpus refuses no shape (MageFlow's does)
    assert not engine_refuses(78, 592, default_ref_size) and engine_refuses(78, 592)


def test_the_pixels_are_nearest_alpha_over_white_then_2x_minus_1(tmp_path):
    rgba = np.zeros((3, 2, 4), dtype=np.uint8)
    rgba[..., 0] = [[255, 0], [0, 255], [128, 64]]  # red
    rgba[..., 3] = [[255, 0], [128, 255], [255, 255]]  # alpha: opaque, clear, half
    path = tmp_path / "a.png"
    Image.fromarray(rgba, "RGBA").save(path)
    got = ref_pixels(path, (6, 4))  # index = out·in // out_size (tensor.hpp 1283)
    x = rgba.astype(np.float32) / np.float32(255)
    near = x[np.arange(6) * 3 // 6][:, np.arange(4) * 2 // 4]
    a = near[..., 3:]
    want = (np.float32(2) * (near[..., :3] * a + np.float32(1) - a) - np.float32(1))
    assert got.shape == (3, 6, 4) and np.array_equal(got, want.transpose(2, 0, 1))
    assert got[0, 0, 2] == got[1, 0, 2] == 1.0  # the clear pixel is white
    rgb = tmp_path / "b.png"
    Image.fromarray(rgba[..., :3]).save(rgb)  # no alpha: opaque
    assert np.allclose(ref_pixels(rgb, (3, 2))[0], x[..., 0] * 2 - 1, atol=1e-7)
    item = RefImage(rgb, 96 * 64)  # 3:2 at 96·64 px: sqrt(6144·2 // 3) = 64 wide, 96 high
    assert item.pixels().shape == (3, 96, 64) and str(item) == str(rgb)
    assert RefImage(rgb, 64 * 64).pixels().shape == (3, 64, 64)  # 52.3 × 78.4 -> 2 × 2 cells


def test_the_edit_template_and_its_runs_are_the_engines(encode):
    """3084-3152: `<image1><|vision_start|>` + pads + `<|vision_end|>`, then ` <image2>…`, the
    prompt range, the tail; image i spliced at the tokenizer count of everything before its
    pads (3128-3129); start 14 with images too."""
    sample = Sample("put the hat from image 2 on the pig", images=("a.png", "b.png"))
    ids = PACK.student_ids(encode, sample, [6, 4])
    first = "<image1><|vision_start|>" + PAD * 6 + "<|vision_end|>"
    second = " <image2><|vision_start|>" + PAD * 4 + "<|vision_end|>"
    want = template_ids(encode, [Piece(SYSTEM + USER + first + second),
                                 Piece(sample.text, prompt=True), Piece(TAIL)])
    assert ids == want and PACK.template_start(sample) == 14 == len(encode(SYSTEM))
    starts = [len(encode(SYSTEM + USER + "<image1><|vision_start|>")),
              len(encode(SYSTEM + USER + first + " <image2><|vision_start|>"))]
    assert image_runs(ids, PACK.image_pad_id) == [(starts[0], 6), (starts[1], 4)]
    empty = PACK.student_ids(encode, Sample("", images=("a.png",)), [2])  # "" -> " " (3148)
    assert empty == template_ids(encode, [Piece(SYSTEM + USER + "<image1><|vision_start|>" + PAD * 2
                                                + "<|vision_end|>"), Piece(" ", prompt=True),
                                          Piece(TAIL)])
    layout = PACK.tap_layout(36)  # the teacher: the tap teacher at the last layer, with pictures
    assert layout.taps == (36,) and layout.start == 14 and layout.vision_inputs is not None


def test_the_export_keeps_the_vision_extension_text_only_packs_do_not():
    cfg = PACK.adapter_config(type("T", (), {"width": 64, "depth": 1})(), 1024)
    assert cfg.kind == PACK.adapter_kind == "token_aligned_vision" and cfg.vis_dim == 4096
    for pid in ("qwen3_zimage", "qwen3_ovis", "qwen3vl_minimax_h3"):
        assert get_pack(pid).adapter_kind == "token_aligned" and not get_pack(pid).vis_dim
    assert "--ref-image" in PACK.engine_command() and "--llm_vision" in PACK.engine_command()


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    root = copy_tiny_qwen3vl(tmp_path_factory.mktemp("qi21") / "Qwen3-VL-tiny")
    t = PACK.load_teacher({"teacher": root}, SimpleNamespace(mode="cpu", cpu_gib=0.0), "cpu")
    assert t.layout.taps == (2,) and t.visual is not None  # the tiny one's last layer, its tower
    hf = Qwen3VLModel.from_pretrained(str(root), dtype=torch.float32).eval()
    yield t, hf
    t.close()


def test_mrope_positions_are_transformers_get_rope_index(teacher):
    _, hf_model = teacher
    ids = [7] * 5 + [qwen3vl.IMAGE_PAD_ID] * 6 + [7] * 3 + [qwen3vl.IMAGE_PAD_ID] * 4 + [7] * 2
    grids = [(2, 3), (4, 1)]  # merged (gh, gw)
    ours = torch.tensor(qwen3vl.mrope_positions(len(ids), [(5, 2, 3), (14, 4, 1)]))
    x = torch.tensor([ids])
    hf, _ = hf_model.get_rope_index(
        x, (x == qwen3vl.IMAGE_PAD_ID).int(),
        image_grid_thw=torch.tensor([[1, 2 * gh, 2 * gw] for gh, gw in grids]))
    assert torch.equal(ours, hf[:, 0])
    # text 0-4, image 1 at 5 (h 5-6, w 5-7), text resumes at 5 + max(2, 3) = 8
    assert ours[:, 4].tolist() == [4, 4, 4] and ours[:, 10].tolist() == [5, 6, 7]
    assert ours[:, 11].tolist() == [8, 8, 8] and ours[0].max() < len(ids)


def _picture(tmp_path, name, h, w, seed):
    rng = np.random.default_rng(seed)
    px = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
    px[..., 3] = np.where(rng.random((h, w)) < 0.3, 0, 255)  # some clear pixels
    path = tmp_path / name
    Image.fromarray(px, "RGBA").save(path)
    return path


def test_the_teacher_is_transformers_full_qwen3vl_before_the_norm(teacher, tmp_path, encode):
    teacher, hf = teacher
    """Targets = transformers' own Qwen3VLModel forward (its vision tower, deepstack injection and
    get_rope_index) on the engine's pixels, the final norm's input; the stored vision rows are
    the main merger's alone (what the engine splices for the student)."""
    paths = [_picture(tmp_path, "p0.png", 40, 70, 1), _picture(tmp_path, "p1.png", 90, 50, 2)]
    sample = Sample("swap the colours", images=tuple(paths), extra={"render": [96, 96]})
    items = PACK.vision_inputs(sample)
    assert [it.area for it in items] == [96 * 96] * 2
    rows = teacher.vision(items)
    sizes = [ref_size(40, 70, 96 * 96), ref_size(90, 50, 96 * 96)]
    assert sizes == [(64, 128), (128, 64)] and [r.shape for r in rows] == [(8, HIDDEN)] * 2
    ids = PACK.student_ids(encode, sample, [r.shape[0] for r in rows])
    segs = [VisionSegment(s, r) for (s, _), r in zip(image_runs(ids, PACK.image_pad_id), rows)]
    got = teacher.targets([sample], [ids], [segs])[0]
    assert got.rows.shape == (len(ids), HIDDEN) and got.sup_start == 14

    prepared = [patchify(ref_pixels(p, s)) for p, s in zip(paths, sizes)]
    pixel_values = torch.from_numpy(np.concatenate([r for r, _ in prepared]))
    grid = torch.tensor([g for _, g in prepared])
    caught = {}
    hook = hf.language_model.norm.register_forward_pre_hook(
        lambda _m, a: caught.__setitem__("x", a[0]))
    x = torch.tensor([ids])
    with torch.no_grad():
        out = hf(input_ids=x, attention_mask=torch.ones_like(x),
                            pixel_values=pixel_values, image_grid_thw=grid,
                            mm_token_type_ids=(x == qwen3vl.IMAGE_PAD_ID).int())
    hook.remove()
    assert torch.allclose(got.rows, caught["x"][0], atol=1e-5)
    assert not torch.allclose(got.rows, out.last_hidden_state[0], atol=1e-3)  # not the norm
    e = teacher.text.embed_tokens(x).clone()  # the same splice without deepstack and M-RoPE
    for seg in segs:
        e[0, seg.start: seg.start + seg.rows.shape[0]] = seg.rows
    hook = teacher.text.norm.register_forward_pre_hook(lambda _m, a: caught.__setitem__("x", a[0]))
    with torch.no_grad():
        teacher.text(inputs_embeds=e, attention_mask=torch.ones_like(x))
    hook.remove()
    tail = segs[0].start  # from the first image on, the reduced path differs
    assert torch.allclose(got.rows[:tail], caught["x"][0, :tail], atol=1e-5)
    assert not torch.allclose(got.rows[tail:], caught["x"][0, tail:], atol=1e-3)
    with torch.no_grad():
        main = teacher.visual(pixel_values, grid_thw=grid).pooler_output
    assert torch.allclose(torch.cat(rows), main, atol=1e-6)  # the student's rows: main only
    # a batch with a text-only sample gives each sample its own rows
    text = Sample("a pig")
    both = teacher.targets([text, sample], [PACK.student_ids(encode, text), ids], [[], segs])
    assert torch.allclose(both[1].rows, got.rows, atol=1e-5)
    alone = teacher.targets([text], [PACK.student_ids(encode, text)], [[]])[0]
    assert torch.allclose(both[0].rows, alone.rows, atol=1e-5)


def test_a_records_render_reaches_the_tower(tmp_path):
    """The corpus keeps a .jsonl record's other keys (samples.py: `extra`, for packs), so a
    sample's "render" sizes its references; without one, the 1024×1024 of the engine command."""
    from gguf_trainer.materials.prompt_files import read_source

    Image.new("RGB", (60, 40)).save(tmp_path / "a.png")
    src = tmp_path / "edits.jsonl"
    src.write_text('{"text": "make it night", "images": ["a.png"], "render": [500, 300]}\n'
                   '{"text": "add snow", "images": ["a.png"]}\n')
    first, second = read_source(src)
    assert first.extra == {"render": [500, 300]} and second.extra == {}
    assert [i.area for i in PACK.vision_inputs(first)] == [512 * 320]  # aligned up to 32
    assert [i.pixels().shape for i in PACK.vision_inputs(second)] == [(3, 832, 1248)]
