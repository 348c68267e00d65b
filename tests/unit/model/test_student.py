"""gguf_trainer.model.student: GGUF → Qwen3Model round trips, config, tokenizer ids, refusals,
splices.

References are independent: a transformers Qwen3Model holding the exact values the file stores
(recorded by the tiny writer) and the engine contract's token counts (§3.1, §3.2, §3.6).
Figures are printed (`pytest -s` shows them).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from gguf import GGUFWriter

from gguf_trainer.base.errors import UserError
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.engine.template_ids import Piece, student_ids
from gguf_trainer.model.student import (
    PAD_ID,
    build_model,
    load_student,
    load_tokenizer,
    pad_batch,
    read_student_tensors,
    student_config,
)
from gguf_trainer.tiny.student import (
    build_tiny_qwen3,
    tiny_qwen3_config,
    write_student_gguf,
    write_tiny_student,
    write_tiny_tokenizer_dir,
)

VOCAB = 1024  # small vocab for the dtype matrix; ids are random, not tokenized
SMALL = {"vocab": VOCAB}  # hidden 64, intermediate 128 from TINY_DIMS
KQUANT = {"vocab": VOCAB, "hidden": 256, "intermediate": 512, "layers": 1}  # rows a multiple of 256
SEQ = 12
TOLERANCE = 1e-5  # BF16 / Q8_0 / K-quants against the dequantized reference

# engine-contract §3.2, copied exactly
EDIT_PREFIX = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, "
    "texture, objects, background), then explain how the user's text instruction should alter or "
    "modify the image. Generate a new image that meets the user's requirements while maintaining "
    "consistency with the original input where appropriate.<|im_end|>\n<|im_start|>user\n"
)
T2I_PREFIX = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
    "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
    "<|im_start|>user\n"
)
LLADA = "<role>HUMAN</role> Generate an image: a cat\n<role>ASSISTANT</role>\n<IMAGE1>"


@pytest.fixture(scope="module")
def small_source():
    return build_tiny_qwen3(seed=0, **SMALL)


@pytest.fixture(scope="module")
def kquant_source():
    return build_tiny_qwen3(seed=1, **KQUANT)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def student32(tmp_path_factory, small_source, qwen_tokenizer_dir):
    path = write_student_gguf(small_source, tmp_path_factory.mktemp("s32") / "s.gguf", dtype="F32")
    return load_student(path, qwen_tokenizer_dir)


def _reference_states(record, dims, ids):
    """Final-norm states of a plain Qwen3Model holding exactly the stored values."""
    reference = build_tiny_qwen3(**dims)
    reference.load_state_dict(record, strict=True)
    with torch.no_grad():
        return reference(input_ids=ids).last_hidden_state


def _arrays(model, drop: str | None = None) -> dict[str, np.ndarray]:
    """HF-named file tensors of `model`, leaving out names containing `drop`."""
    arrays = {f"model.{k}": v.numpy() for k, v in model.state_dict().items()}
    return {name: arr for name, arr in arrays.items() if not drop or drop not in name}


def _read_written(model, path, **kwargs):
    return read_student_tensors(write_student_gguf(model, path, **kwargs))


def _write_raw_gguf(path, arrays: dict[str, np.ndarray]):
    writer = GGUFWriter(path, "qwen3")
    for name, arr in arrays.items():
        writer.add_tensor(name, arr.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("names", ["hf", "llamacpp"])
@pytest.mark.parametrize("dtype, dims, source", [
    ("F32", SMALL, "small_source"), ("F16", SMALL, "small_source"),
    ("BF16", SMALL, "small_source"), ("Q8_0", SMALL, "small_source"),
    ("Q4_K", KQUANT, "kquant_source"), ("Q6_K", KQUANT, "kquant_source"),
])
def test_loaded_student_matches_reference(tmp_path, request, qwen_tokenizer_dir, ids, names, dtype,
                                          dims, source):
    model = request.getfixturevalue(source)
    record: dict = {}
    path = write_student_gguf(model, tmp_path / "s.gguf", names=names, dtype=dtype, record=record)
    student = load_student(path, qwen_tokenizer_dir)
    assert student.file_dtype == dtype
    assert student.dtype == torch.float32
    assert not any(p.requires_grad for p in student.model.parameters())
    mask = torch.ones_like(ids, dtype=torch.bool)
    got = student.hidden(ids, mask)
    delta = (got - _reference_states(record, dims, ids)).abs().max().item()
    print(f"{names:8s} {dtype:5s} max|Δ| vs dequantized reference = {delta:.3g}")
    assert got.dtype == torch.float32 and got.shape == (*ids.shape, dims.get("hidden", 64))
    if dtype in ("F32", "F16"):
        assert delta == 0.0
    else:
        assert delta <= TOLERANCE
    if dtype == "F32":  # F32 stores the source exactly
        with torch.no_grad():
            assert torch.equal(got, model(input_ids=ids).last_hidden_state)


@pytest.mark.parametrize("dtype, max_rel_err", [("Q4_K", 0.1), ("Q6_K", 0.03)])
def test_kquant_blocks_approximate_the_source(tmp_path, kquant_source, dtype, max_rel_err):
    """Well-formed blocks: gguf's own decoder gives back values close to the source weights."""
    tensors, info = _read_written(kquant_source, tmp_path / "k.gguf", dtype=dtype)
    assert info["tensor_types"] == {dtype: 8, "F32": 5}
    worst = max(np.linalg.norm(tensors[k] - v.numpy()) / np.linalg.norm(v.numpy())
                for k, v in kquant_source.state_dict().items() if v.ndim == 2)
    print(f"{dtype}: worst relative weight error {worst:.3g}")
    assert worst < max_rel_err


def test_kquant_falls_back_when_rows_are_not_256(tmp_path, small_source):
    _, info = _read_written(small_source, tmp_path / "s.gguf", dtype="Q4_K")
    # only o_proj (in = 2 heads x 128 = 256) has rows of 256; the rest fall back to Q8_0
    assert info["tensor_types"] == {"Q8_0": 13, "Q4_K": 2, "F32": 9}
    assert info["file_dtype"] == "Q8_0"


def test_names_styles_read_the_same(tmp_path, small_source):
    hf, info = _read_written(small_source, tmp_path / "a.gguf", names="hf")
    ll, _ = _read_written(small_source, tmp_path / "b.gguf", names="llamacpp")
    assert sorted(hf) == sorted(small_source.state_dict()) == sorted(ll)
    assert all(np.array_equal(hf[k], ll[k]) for k in hf)
    assert info == {"file_dtype": "F16", "tensor_types": {"F16": 15, "F32": 9}, "n_tensors": 24}


def test_output_weight_is_ignored(tmp_path, small_source):
    arrays = _arrays(small_source)
    arrays["output.weight"] = arrays["model.embed_tokens.weight"]
    tensors, info = read_student_tensors(_write_raw_gguf(tmp_path / "o.gguf", arrays))
    assert "output.weight" not in tensors and info["n_tensors"] == 25


def test_fp32_cpu_build_shares_the_arrays(small_source):
    tensors = {k: v.numpy().copy() for k, v in small_source.state_dict().items()}
    model = build_model(small_source.config, tensors)
    assert model.embed_tokens.weight.data_ptr() == tensors["embed_tokens.weight"].ctypes.data


# ---------------------------------------------------------------- config


def test_config_from_shapes_equals_config_json(tmp_path):
    model = build_tiny_qwen3()
    tensors, _ = read_student_tensors(write_student_gguf(model, tmp_path / "s.gguf"))
    from_shapes = student_config(tensors)
    from_json = student_config(tensors, write_tiny_tokenizer_dir(tmp_path / "tok", model.config))
    assert from_shapes.to_dict() == from_json.to_dict() == tiny_qwen3_config().to_dict()
    heads = (from_shapes.num_attention_heads, from_shapes.num_key_value_heads)
    assert from_shapes.head_dim == 128 and heads == (2, 1)
    assert from_shapes.rms_norm_eps == 1e-6 and from_shapes.rope_parameters["rope_theta"] == 1e6


@pytest.mark.parametrize("change, field", [
    ({"hidden_size": 128}, "hidden_size"),
    ({"rope_theta": 10_000.0}, "rope_theta"),
])
def test_config_json_mismatch_is_refused(tmp_path, small_source, change, field):
    tensors, _ = read_student_tensors(write_student_gguf(small_source, tmp_path / "s.gguf"))
    config = tiny_qwen3_config(**SMALL)
    for key, value in change.items():
        if key == "rope_theta":
            config.rope_parameters = {"rope_type": "default", "rope_theta": value}
        else:
            setattr(config, key, value)
    with pytest.raises(UserError, match=f"config.json does not match.*{field}"):
        student_config(tensors, write_tiny_tokenizer_dir(tmp_path / "tok", config))


def test_full_vocab_student_with_tokenizer_folder(tmp_path):
    """The demo path: full-vocab tiny student, real tokenizer, config.json, a real template."""
    model = build_tiny_qwen3()
    folder = write_tiny_tokenizer_dir(tmp_path / "tok", model.config)
    student = load_student(write_student_gguf(model, tmp_path / "s.gguf"), folder)
    encode = engine_bpe(student.tokenizer).encode  # the engine's ids, piece by piece
    template = [Piece(T2I_PREFIX), Piece("a cat", prompt=True),
                Piece("<|im_end|>\n<|im_start|>assistant\n")]
    ids, keep = pad_batch([student_ids(encode, template),
                           student_ids(encode, [Piece("", prompt=True)])])
    states = student.hidden(ids, keep)
    assert states.shape == (2, ids.shape[1], 64) and torch.isfinite(states[keep]).all()
    assert student.embed_table().shape == (151936, 64)


# ---------------------------------------------------------------- tokenizer


@pytest.fixture(scope="module")
def tokenizer(qwen_tokenizer_dir):
    return load_tokenizer(qwen_tokenizer_dir)


def test_llada_template_is_plain_bpe(tokenizer):
    ids = engine_bpe(tokenizer).encode(LLADA)
    assert max(ids) < PAD_ID
    assert tokenizer.decode(ids) == LLADA


def test_mageflow_token_counts(tokenizer):
    encode = engine_bpe(tokenizer).encode
    edit, t2i, header = map(encode, (EDIT_PREFIX, T2I_PREFIX, "Image 1: <|vision_start|>"))
    assert (len(edit), len(t2i), len(header)) == (64, 34, 6)
    assert header[-1] == 151652


def test_special_tokens_are_single_ids_inside_text(tokenizer):
    encode = engine_bpe(tokenizer).encode
    ids = encode("a<|vision_start|><|image_pad|><|image_pad|><|vision_end|>b")
    plain_a, plain_b = encode("a"), encode("b")
    assert ids == plain_a + [151652, 151655, 151655, 151653] + plain_b


def test_empty_prompt_and_no_bos_eos(tokenizer):
    encode = engine_bpe(tokenizer).encode
    assert student_ids(encode, [Piece("", prompt=True)]) == [PAD_ID]  # the engine's empty prompt
    ids = student_ids(encode, [Piece("a cat", prompt=True)])
    assert ids == tokenizer.encode("a cat", add_special_tokens=False)
    assert not {151643, 151644, 151645} & set(ids)


def test_pad_batch_right_pads():
    ids, keep = pad_batch([[5, 6, 7], [8]])
    assert ids.tolist() == [[5, 6, 7], [8, PAD_ID, PAD_ID]]
    assert keep.tolist() == [[True, True, True], [True, False, False]]
    assert ids.dtype == torch.long and keep.dtype == torch.bool


# ---------------------------------------------------------------- refusals


def test_truncated_file_is_refused(tmp_path, small_source):
    path = write_student_gguf(small_source, tmp_path / "s.gguf")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    refusal = "truncated or not a GGUF file; re-download pig_clip-f16.gguf"
    with pytest.raises(UserError, match=refusal):
        read_student_tensors(path)


@pytest.mark.parametrize("content", [b"", b"not a model\n" * 100])
def test_non_gguf_file_is_refused(tmp_path, content):
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    with pytest.raises(UserError, match="truncated or not a GGUF file"):
        read_student_tensors(path)


def test_missing_file_is_refused(tmp_path, qwen_tokenizer_dir):
    with pytest.raises(UserError, match="does not exist"):
        load_student(tmp_path / "nope.gguf", qwen_tokenizer_dir)


def test_missing_final_norm_is_refused(tmp_path, small_source):
    path = _write_raw_gguf(tmp_path / "n.gguf", _arrays(small_source, drop="model.norm"))
    refusal = "neither model.norm.weight nor output_norm.weight.*un-normed"
    with pytest.raises(UserError, match=refusal):
        read_student_tensors(path)


@pytest.mark.parametrize("drop, message", [
    ("self_attn.q_norm", "not a Qwen3 .*model.layers.0.self_attn.q_norm.weight is missing"),
    ("embed_tokens", "not a Qwen3 .*no model.embed_tokens.weight or token_embd.weight"),
])
def test_non_qwen3_gguf_is_refused(tmp_path, small_source, drop, message):
    path = _write_raw_gguf(tmp_path / "q.gguf", _arrays(small_source, drop=drop))
    with pytest.raises(UserError, match=message):
        read_student_tensors(path)


def test_adapter_gguf_is_refused(tmp_path):
    adapter = {"adapter.query": np.zeros((4, 64)), "adapter.out_proj.weight": np.zeros((8, 64))}
    path = _write_raw_gguf(tmp_path / "a.gguf", adapter)
    with pytest.raises(UserError, match="not a Qwen3"):
        read_student_tensors(path)


# ---------------------------------------------------------------- hidden()


def test_splices_replace_input_embeddings(student32, ids):
    mask = torch.ones_like(ids, dtype=torch.bool)
    rows = torch.randn(3, 64, generator=torch.Generator().manual_seed(4))
    got = student32.hidden(ids, mask, splices=[(1, 4, rows)])
    with torch.no_grad():
        embeds = student32.model.embed_tokens(ids)
        embeds[1, 4:7] = rows
        want = student32.model(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
    plain = student32.hidden(ids, mask)
    assert torch.equal(got, want)
    assert torch.equal(got[0], plain[0]) and torch.equal(got[1, :4], plain[1, :4])  # causal
    assert not torch.allclose(got[1, 4:], plain[1, 4:])


def test_right_padding_keeps_real_rows(student32):
    gen = torch.Generator().manual_seed(5)
    rows = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (5, 9, 1)]
    ids, keep = pad_batch(rows, pad_id=0)  # PAD_ID is outside the small vocab
    batched = student32.hidden(ids, keep)
    worst = max((batched[i, : len(r)] - student32.hidden(*pad_batch([r]))[0]).abs().max().item()
                for i, r in enumerate(rows))
    print(f"padded vs unpadded real rows: max|Δ| = {worst:.3g}")
    assert worst <= TOLERANCE


def test_non_f16_student_logs_the_warning(tmp_path, small_source, qwen_tokenizer_dir, caplog):
    f16 = write_student_gguf(small_source, tmp_path / "f16.gguf", dtype="F16")
    q8 = write_student_gguf(small_source, tmp_path / "q8.gguf", dtype="Q8_0")
    with caplog.at_level(logging.WARNING, logger="gguf_trainer.model.student"):
        load_student(f16, qwen_tokenizer_dir)
        assert "training against" not in caplog.text
        load_student(q8, qwen_tokenizer_dir)
    assert "training against Q8_0; the recipes train against pig_clip-f16.gguf" in caplog.text


def test_write_tiny_student_is_deterministic(tmp_path):
    a = write_tiny_student(tmp_path / "a.gguf", seed=7, vocab=VOCAB)
    b = write_tiny_student(tmp_path / "b.gguf", seed=7, vocab=VOCAB)
    assert a.read_bytes() == b.read_bytes()
