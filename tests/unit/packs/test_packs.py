"""Packs: every registered pack builds on tiny dims and validates its defaults; each mock
teacher gives the pack's real row shapes, deterministically and prompt-dependently; the
prompt templates are the engine's strings (token counts checked with the real tokenizer)."""

from __future__ import annotations

import json

import pytest
import torch

from gguf_trainer.base.errors import UserError
from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.model.adapters import TOKEN_ALIGNED_KINDS, build_adapter
from gguf_trainer.model.student import load_tokenizer
from gguf_trainer.packs import ADAPTER_KINDS, get_pack, pack_ids
from gguf_trainer.packs.mock import t5_like_ids
from gguf_trainer.packs.qwen3vl_mageflow import EDIT_PREFIX, SUFFIX, T2I_PREFIX
from gguf_trainer.store.project import create_project, load_project
from gguf_trainer.store.project_schema import TrainSettings

WIDTH, DEPTH, IN_DIM = 64, 1, 32  # tiny adapter dims
BATCH, SEQ = 2, 5
SEED = 0
PROMPTS = ["a red fox in the snow, oil painting", "a bowl of ramen at sunset"]
BUILTIN = ("llada_image", "qwen3vl_mageflow", "t5xxl_pixart", "t5xxl_chroma", "umt5xxl_wan")


@pytest.fixture(scope="module")
def tokenizer(qwen_tokenizer_dir):
    return load_tokenizer(qwen_tokenizer_dir)


def _ids(pack, tokenizer, texts):
    """The engine's student ids of each text (the pack's template, the engine BPE port)."""
    encode = engine_bpe(tokenizer).encode
    return [pack.student_ids(encode, Sample(t)) for t in texts]


def test_builtin_packs_are_registered():
    assert set(BUILTIN) <= set(pack_ids())
    for pid in pack_ids():
        pack = get_pack(pid)
        assert pack.id == pid and pack.adapter_kind in ADAPTER_KINDS


def test_no_pack_subclasses_another_family():
    """Kinds own behaviour, families own facts: every registered pack's bases are kind bases
    (T5SeededPack, LayerwisePack, ...), never another registered family's class, and no
    family module imports another."""
    import ast
    from pathlib import Path

    import gguf_trainer.packs as packs_pkg

    # the shipped packs: other test modules register test packs of their own while collecting
    families = {type(get_pack(pid)) for pid in pack_ids()}
    families = {cls for cls in families if cls.__module__.startswith("gguf_trainer.packs.")}
    for cls in families:
        assert not set(cls.__mro__[1:]) & families, cls
    modules = {cls.__module__.rsplit(".", 1)[-1] for cls in families}
    for name in modules:
        tree = ast.parse((Path(packs_pkg.__file__).parent / f"{name}.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m.rsplit(".", 1)[-1] for m in imported} & (modules - {name}), name


def test_get_pack_unknown_is_one_sentence():
    with pytest.raises(UserError) as info:
        get_pack("nope")
    msg = str(info.value)
    assert "'nope'" in msg and "\n" not in msg and msg.endswith(".")
    for pid in BUILTIN:
        assert pid in msg  # names the choices


def _inputs(pack, gen):
    hidden = torch.randn(BATCH, SEQ, IN_DIM, generator=gen)
    mask = torch.ones(BATCH, SEQ, dtype=torch.bool)
    mask[1, 3:] = False  # right padding on the second sample
    seed_ids = None
    if pack.seed_vocab:
        seed_ids = torch.tensor(
            [t5_like_ids(p, pack.num_queries, pack.seed_vocab) for p in PROMPTS]
        )
    return hidden, mask, seed_ids


@pytest.mark.parametrize("pack_id", pack_ids())
def test_pack_builds_on_tiny_dims(pack_id):
    pack = get_pack(pack_id)
    cfg = pack.adapter_config(TrainSettings(width=WIDTH, depth=DEPTH), IN_DIM)
    assert (cfg.kind, cfg.in_dim, cfg.width, cfg.depth) == (pack.adapter_kind, IN_DIM, WIDTH, DEPTH)
    assert cfg.validate() == []
    torch.manual_seed(SEED)
    model = build_adapter(cfg)
    gen = torch.Generator().manual_seed(SEED)
    hidden, mask, seed_ids = _inputs(pack, gen)
    with torch.no_grad():
        out = model(hidden, mask=mask, seed_ids=seed_ids)
    rows = SEQ if pack.adapter_kind in TOKEN_ALIGNED_KINDS else pack.num_queries
    rows += cfg.n_bank if pack.adapter_kind == "ming_image" else 0  # the caption rows first
    assert out.shape == (BATCH, rows, pack.out_dim)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("pack_id", pack_ids())
def test_pack_defaults_validate_through_create_project(tmp_path, pack_id):
    pack = get_pack(pack_id)
    create_project(tmp_path / "p", pack_id)
    settings = load_project(tmp_path / "p").settings.model_dump()
    for dotted, value in pack.defaults.items():
        node = settings
        for key in dotted.split("."):
            node = node[key]
        assert node == value, dotted
    assert settings["name"] == "pig_" + pack.default_name.removeprefix("pig_")


@pytest.mark.parametrize("pack_id", pack_ids())
def test_describe_is_json_serialisable(pack_id):
    pack = get_pack(pack_id)
    desc = json.loads(json.dumps(pack.describe()))
    assert desc["id"] == pack_id and desc["out_dim"] == pack.out_dim
    teacher = {"teacher"} if pack_id in BUILTIN else set()  # test-registered packs may need none
    assert {m["id"] for m in desc["materials"]} >= {"student", "student_tokenizer"} | teacher
    assert "{" not in desc["engine_command"]  # every placeholder filled


# ----------------------------------------------------------------- templates


def test_llada_format_prompt():
    pack = get_pack("llada_image")
    assert pack.format_prompt(" a cat ") == (
        "<role>HUMAN</role> Generate an image: a cat\n<role>ASSISTANT</role>\n<IMAGE1>"
    )
    for empty in ("", "   "):
        assert pack.format_prompt(empty) == (
            "<role>HUMAN</role> Generate an image.\n<role>ASSISTANT</role>\n<IMAGE1>"
        )


def test_t5_format_prompt_is_raw():
    assert get_pack("t5xxl_pixart").format_prompt("a cat, 35mm") == "a cat, 35mm"


def test_mageflow_prefix_token_counts(tokenizer):
    encode = engine_bpe(tokenizer).encode
    t2i, edit, suffix = encode(T2I_PREFIX), encode(EDIT_PREFIX), encode(SUFFIX)
    assert len(t2i) == 34 and len(edit) == 64
    pack = get_pack("qwen3vl_mageflow")
    (full,) = _ids(pack, tokenizer, ["a cat"])
    assert full[:34] == t2i and full[-len(suffix) :] == suffix  # the prefix tokenizes alone


# ----------------------------------------------------------------- mock teachers


def _mock(pack_id):
    return get_pack(pack_id).build_mock_teacher(None)


def _samples(texts):
    """Teachers take sample records (gguf_trainer.data.samples), not strings."""
    return [Sample(t) for t in texts]


def test_llada_mock_shapes(tokenizer):
    pack = get_pack("llada_image")
    teacher = _mock("llada_image")
    ids = _ids(pack, tokenizer, PROMPTS + [""])
    rows = teacher.targets(_samples(PROMPTS + [""]), ids)
    assert teacher.is_mock and len(rows) == 3
    for r in rows:
        assert r.rows.shape == (256, 2560) and r.rows.dtype == torch.float32 and r.seed_ids is None
        assert torch.isfinite(r.rows).all()
    assert teacher.lengths(_samples(PROMPTS), ids[:2]) == [len(i) + 256 for i in ids[:2]]


def test_t5_mock_shapes(tokenizer):
    pack = get_pack("t5xxl_pixart")
    teacher = _mock("t5xxl_pixart")
    long = " ".join(f"w{i}" for i in range(200))  # more words than the 120 window
    texts = PROMPTS + ["", long]
    rows = teacher.targets(_samples(texts), _ids(pack, tokenizer, texts))
    n_words = [len(t.split()) for t in texts]
    for text, words, r in zip(texts, n_words, rows):
        n_real = min(words, 119) + 1  # words (cut to the window) + EOS
        assert r.rows.shape == (n_real, 4096)
        assert len(r.seed_ids) == 120
        assert r.seed_ids[n_real - 1] == 1  # EOS ends the real slots
        assert all(i >= 2 for i in r.seed_ids[: n_real - 1])
        assert r.seed_ids[n_real:] == [0] * (120 - n_real)
    assert teacher.lengths(_samples(texts), [[]] * 4) == [min(w, 119) + 1 for w in n_words]


def test_mageflow_mock_shapes(tokenizer):
    pack = get_pack("qwen3vl_mageflow")
    teacher = _mock("qwen3vl_mageflow")
    ids = _ids(pack, tokenizer, PROMPTS + [""])
    rows = teacher.targets(_samples(PROMPTS + [""]), ids)
    for i, r in zip(ids, rows):
        assert r.rows.shape == (len(i), 2560) and r.sup_start == 34


@pytest.mark.parametrize("pack_id", BUILTIN)
def test_mock_is_deterministic_and_prompt_dependent(tokenizer, pack_id):
    pack = get_pack(pack_id)
    ids = _ids(pack, tokenizer, PROMPTS)
    a = _mock(pack_id).targets(_samples(PROMPTS), ids)
    b = _mock(pack_id).targets(_samples(PROMPTS), ids)  # a second instance
    for ra, rb in zip(a, b):
        assert torch.equal(ra.rows, rb.rows) and ra.seed_ids == rb.seed_ids
    assert _mock(pack_id).identity == _mock(pack_id).identity
    json.dumps(_mock(pack_id).identity)  # goes into the shard fingerprint
    first, second = a[0].rows, a[1].rows
    n = min(first.shape[0], second.shape[0])
    assert not torch.allclose(first[:n], second[:n], atol=1e-3)
    # a prompt differing in one word changes the rows too
    (c,) = _mock(pack_id).targets(
        _samples([PROMPTS[0] + " extra"]), _ids(pack, tokenizer, [PROMPTS[0] + " extra"])
    )
    n = min(first.shape[0], c.rows.shape[0])
    assert not torch.allclose(first[:n], c.rows[:n], atol=1e-3)


def test_pixart_window_is_one_setting_read_by_the_pack(tmp_path):
    """precompute.t5_window 300 (PixArt-Σ) sets the window, num_queries, the teacher limit and the
    shard contract of the project's pack; 120 is the registered pack itself (fingerprints of
    existing projects unchanged); other windows are refused; other packs hide the field."""
    from gguf_trainer.store.project import update_settings
    from gguf_trainer.store.project_schema import PrecomputeSettings
    from gguf_trainer.store.schema_fields import field_metadata

    registered = get_pack("t5xxl_pixart")
    proj = create_project(tmp_path / "p", "t5xxl_pixart")
    assert proj.pack is registered and proj.pack.num_queries == 120
    update_settings(proj.dir, {"precompute.t5_window": 300})
    sigma = load_project(proj.dir).pack
    assert (sigma.num_queries, sigma.max_len_teacher) == (300, 300)
    assert (
        sigma.shard_contract != registered.shard_contract
        and "300-slot" in sigma.export_kv["adapter.target"]
    )
    assert sigma.adapter_config(TrainSettings(width=64, depth=1), in_dim=64).num_queries == 300
    assert registered.num_queries == 120  # the registered pack is not changed by a project
    with pytest.raises(ValueError, match="120 or 300"):
        PrecomputeSettings(t5_window=200)
    meta = {
        pid: {f["key"]: f for f in field_metadata(pid)}["precompute.t5_window"]
        for pid in pack_ids()
    }
    assert meta["t5xxl_pixart"]["choices"] == [120, 300] and not meta["t5xxl_pixart"].get("hidden")
    assert all(m.get("hidden") for pid, m in meta.items() if pid != "t5xxl_pixart")
