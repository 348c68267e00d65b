"""The LLaDA-Image teacher on the tiny remote-code snapshot (gguf_trainer/tiny/llada.py): the
real trust_remote_code path with the transformers-5 traps, QueryFormer/TextProjection against
independent computations, the attention mask and positions, placement on fake budgets, and the
SigVQ companion."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gguf_trainer.base.errors import UserError
from gguf_trainer.materials import materials
from gguf_trainer.packs.llada_image import PACK
from gguf_trainer.runner import control
from gguf_trainer.teachers import trust
from gguf_trainer.teachers.llada import attention_inputs, load_llada_teacher, plan_backbone
from gguf_trainer.teachers.llada_compat import (
    install_attn_mask_utils,
    repair_rotary_tables,
    rotary_modules,
)
from gguf_trainer.teachers.llada_layout import QUERYFORMER as QUERYFORMER_LAYOUT
from gguf_trainer.teachers.llada_layout import TEXT_PROJECTION as TEXT_PROJECTION_LAYOUT
from gguf_trainer.teachers.llada_layout import read_config
from gguf_trainer.teachers.placement import GIB
from gguf_trainer.teachers.queryformer import (
    QueryFormer,
    TextProjection,
    load_module,
    module_config,
)
from gguf_trainer.tiny.llada import QUERYFORMER, TEXT_ENCODER, TEXT_PROJECTION, copy_tiny_llada

# The released configs (queryformer/config.json, text_projection/config.json of
# inclusionAI/LLaDA-Image-Turbo; sources in teachers/llada_layout.py).
RELEASED_QF = {"_class_name": "LLaDAImageQueryFormerModel", "_diffusers_version": "0.40.0.dev0",
               "dropout": 0.0, "hidden_size": 2048, "intermediate_size": 8192, "norm_eps": 1e-06,
               "num_attention_heads": 16, "num_hidden_layers": 1, "num_queries": 256}
RELEASED_TP = {"_class_name": "LLaDAImageTextProjectionModel", "_diffusers_version": "0.40.0.dev0",
               "attention_dropout": 0.0, "hidden_size": 2048, "intermediate_size": 8960,
               "norm_eps": 1e-06, "num_attention_heads": 32, "num_hidden_layers": 6,
               "projection_dim": 2560}

PROMPTS = ["a red fox, oil painting", "",
           "a koi pond under a full moon in autumn, fog, highly detailed, 35mm photo, neon glow"]


@pytest.fixture(scope="module")
def llada_env(tmp_path_factory):
    """A private GGUF_TRAINER_HOME (trust records) and HF modules cache (remote code copies)."""
    import transformers.dynamic_module_utils as dmu

    root = tmp_path_factory.mktemp("llada_env")
    # transformers imports remote code as packages under `transformers_modules`; one imported
    # by an earlier test from another cache keeps its __path__ there, and this module's copies
    # (under root/modules) would not be found. Start from none, and leave none behind.
    stale = {k: sys.modules.pop(k) for k in list(sys.modules)
             if k.startswith("transformers_modules")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(trust.HOME_ENV, str(root / "home"))
        mp.setattr(dmu, "HF_MODULES_CACHE", str(root / "modules"))
        # First on the path: an in-process run before this module (tests/e2e's families) left
        # `transformers_modules` in the default cache, which sys.path would find first; its copies
        # share the tiny snapshot's hash, so only an edited copy (a new hash) would go missing.
        (root / "modules").mkdir()
        mp.syspath_prepend(str(root / "modules"))
        yield root
    for k in [k for k in sys.modules if k.startswith("transformers_modules")]:
        del sys.modules[k]
    sys.modules.update(stale)


@pytest.fixture(scope="module")
def snapshot(llada_env):
    root = copy_tiny_llada(llada_env / "LLaDA-Image-Turbo")
    trust.confirm_trust(root)
    return root


@pytest.fixture(scope="module")
def teacher(snapshot):
    t = load_llada_teacher(snapshot, format_prompt=PACK.format_prompt)
    yield t
    t.close()


def _edited_copy(src, dest, old: str, new: str):
    root = shutil.copytree(src, dest)
    path = root / "text_encoder" / "modeling_llada2uni_moe.py"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return root


# ---------------------------------------------------------------- trust


def test_untrusted_snapshot_is_refused_with_how_to_confirm(llada_env):
    root = copy_tiny_llada(llada_env / "untrusted", with_sigvq=False)
    with pytest.raises(UserError) as err:
        load_llada_teacher(root, format_prompt=PACK.format_prompt, project_dir="/p/llada")
    msg = str(err.value)
    assert "not trusted" in msg and "--trust-remote-code" in msg and "--project /p/llada" in msg
    assert "modeling_llada2uni_moe.py" in msg and msg.count(".") >= 1 and "\n" not in msg
    assert trust.trust_status(root)["reason"] == "never"


def test_pack_hook_refuses_before_loading(llada_env, monkeypatch):
    """The pipeline's path (pack.load_teacher): the sentence comes before any code is imported."""
    from types import SimpleNamespace

    import transformers.dynamic_module_utils as dmu

    root = copy_tiny_llada(llada_env / "untrusted_pack", with_sigvq=False)
    monkeypatch.setattr(dmu, "get_class_from_dynamic_module",
                        lambda *a, **k: pytest.fail("remote code imported before the trust check"))
    plan = SimpleNamespace(mode="cpu", placement="sequential", gpu_gib=0.0, cpu_gib=8.0)
    with pytest.raises(UserError, match="not trusted yet"):
        PACK.load_teacher({"teacher": root}, plan, torch.device("cpu"))


def test_changed_code_asks_again(llada_env, snapshot):
    root = shutil.copytree(snapshot, llada_env / "changed")
    first = trust.confirm_trust(root)
    assert first["trusted"] and first["code_hash"] == trust.code_hash(snapshot)
    code = root / "text_encoder" / "fused_moe_ops.py"
    code.write_text(code.read_text() + "\n# edited\n")
    st = trust.trust_status(root)
    assert not st["trusted"] and st["reason"] == "changed" and st["code_hash"] != first["code_hash"]
    with pytest.raises(UserError, match="changed since you confirmed"):
        trust.require_trust(root)
    assert trust.confirm_trust(root)["trusted"]
    trust.revoke_trust(root)
    assert trust.trust_status(root)["reason"] == "never"


def test_non_code_files_do_not_change_the_hash(llada_env, snapshot):
    root = shutil.copytree(snapshot, llada_env / "weights_only")
    before = trust.code_hash(root)
    (root / "text_encoder" / "config.json").write_text("{}")
    (root / ".cache").mkdir()
    (root / ".cache" / "x.py").write_text("junk")  # huggingface_hub download state, not code
    assert trust.code_hash(root) == before


# ---------------------------------------------------------------- RoPE


def _want_inv_freq():
    rd = int(TEXT_ENCODER["head_dim"] * TEXT_ENCODER["partial_rotary_factor"])
    return 1.0 / TEXT_ENCODER["rope_theta"] ** (torch.arange(0, rd, 2).double() / rd)


def test_rope_table_is_repaired_after_the_real_load(snapshot):
    """transformers 5 leaves the remote model's non-persistent inv_freq as torch.empty memory."""
    from transformers import AutoModel

    install_attn_mask_utils()
    model = AutoModel.from_pretrained(str(snapshot / "text_encoder"), trust_remote_code=True,
                                      dtype=torch.float32)
    (name, mod), = rotary_modules(model)
    err = (mod.inv_freq.double() - _want_inv_freq()).abs().max().item()
    print(f"inv_freq straight from from_pretrained: max error {err:.3g}; original_inv_freq on "
          f"{mod.original_inv_freq.device}")
    repair_rotary_tables(model)
    assert torch.allclose(mod.inv_freq.double(), _want_inv_freq(), rtol=1e-6, atol=0)
    assert mod.inv_freq.dtype == torch.float32 and mod.original_inv_freq is mod.inv_freq
    assert "inv_freq" not in model.state_dict()  # still non-persistent
    mod.inv_freq.fill_(1e20)  # whatever the loader left, the next check repairs it
    assert repair_rotary_tables(model) == [name]
    assert torch.allclose(mod.inv_freq.double(), _want_inv_freq(), rtol=1e-6, atol=0)


def test_teacher_runs_with_the_config_table(teacher):
    (_, mod), = rotary_modules(teacher._model)
    assert torch.allclose(mod.inv_freq.double(), _want_inv_freq(), rtol=1e-6, atol=0)


def test_unrepairable_table_is_refused(llada_env, snapshot):
    root = _edited_copy(snapshot, llada_env / "bad_rope", "return inv, 1.0", 'return inv * '
                                                                             'float("nan"), 1.0')
    trust.confirm_trust(root)
    with pytest.raises(UserError, match=r"RoPE table .*inv_freq is unusable") as err:
        load_llada_teacher(root, format_prompt=PACK.format_prompt)
    assert "\n" not in str(err.value)


def test_attn_mask_utils_stand_in_has_4x_semantics():
    install_attn_mask_utils()
    from transformers.modeling_attn_mask_utils import (
        _prepare_4d_attention_mask,
        _prepare_4d_causal_attention_mask_for_sdpa,
    )

    x = torch.zeros(1, 3, 4)
    assert _prepare_4d_causal_attention_mask_for_sdpa(torch.ones(1, 3), (1, 3), x, 0) is None
    m = _prepare_4d_causal_attention_mask_for_sdpa(torch.tensor([[1, 1, 0]]), (1, 3), x, 0)
    blocked = (m[0, 0] < 0).tolist()
    assert blocked == [[False, True, True], [False, False, True], [False, False, True]]
    e = _prepare_4d_attention_mask(torch.tensor([[1, 0]]), torch.float32, tgt_len=3)
    assert e.shape == (1, 1, 3, 2) and (e[..., 1] < 0).all() and (e[..., 0] == 0).all()


# ---------------------------------------------------------------- QueryFormer / TextProjection


def _ln(x, eps):
    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(
        x.var(-1, unbiased=False, keepdim=True) + eps
    )


def _rms(x, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def test_queryformer_matches_torch_multihead_attention(snapshot):
    """The packed cross-attention against torch's own nn.MultiheadAttention, LN and GELU by hand."""
    qf = load_module(QueryFormer, snapshot / "queryformer").double()
    sd, c = qf.state_dict(), QUERYFORMER
    g = torch.Generator().manual_seed(0)
    enc = torch.randn(2, 7, c["hidden_size"], generator=g, dtype=torch.float64)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3]).bool()
    mha = torch.nn.MultiheadAttention(
        c["hidden_size"], c["num_attention_heads"], batch_first=True
    ).double()
    mha.load_state_dict({k.split("cross_attn.")[1]: v for k, v in sd.items() if "cross_attn." in k})
    eps = c["norm_eps"]
    q = _ln(sd["meta_queries"].expand(2, -1, -1), eps)
    e = _ln(enc, eps)
    q = q + mha(q, e, e, key_padding_mask=~mask, need_weights=False)[0]
    q = _ln(q, eps)
    h = _gelu_tanh(q @ sd["query_blocks.0.mlp.fc1.weight"].T + sd["query_blocks.0.mlp.fc1.bias"])
    want = q + h @ sd["query_blocks.0.mlp.fc2.weight"].T + sd["query_blocks.0.mlp.fc2.bias"]
    got = qf(enc, mask)
    assert got.shape == (2, c["num_queries"], c["hidden_size"])
    assert (got - want).abs().max().item() < 1e-10


NON_DEFAULT_TP = {
    **TEXT_PROJECTION,
    "hidden_size": 48,
    "intermediate_size": 40,
    "num_attention_heads": 3,
    "num_hidden_layers": 3,
    "norm_eps": 0.25,
    "projection_dim": 24,
}


def _write_module(folder, config, layout, seed=0):
    """`folder` with `config` as config.json and seeded random weights under the layout's names."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    g = torch.Generator().manual_seed(seed)
    table = layout.tensors(read_config(folder, layout))
    save_file(
        {k: torch.randn(s, generator=g) * 0.3 for k, s in table.items()},
        str(folder / "diffusion_pytorch_model.safetensors"),
    )
    return folder


@pytest.mark.parametrize("which", ["shipped", "non_default"])
def test_text_projection_matches_hand_computation(snapshot, tmp_path, which):
    """Released names and keys (parameter-free q/k RMSNorm); a config whose values differ from
    the defaults (3 heads, 3 layers, eps 0.25) builds what it says."""
    if which == "shipped":
        folder, c = snapshot / "text_projection", TEXT_PROJECTION
    else:
        folder, c = (
            _write_module(tmp_path / "tp", NON_DEFAULT_TP, TEXT_PROJECTION_LAYOUT),
            NON_DEFAULT_TP,
        )
    tp = load_module(TextProjection, folder).double()
    sd = tp.state_dict()
    assert len(tp.layers) == c["num_hidden_layers"] and not any("norm" in k for k in sd)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 9, c["hidden_size"], generator=g, dtype=torch.float64)
    keys = torch.tensor([[1] * 9, [1] * 6 + [0] * 3]).bool()
    eps, nh = c["norm_eps"], c["num_attention_heads"]
    hd = c["hidden_size"] // nh
    want = x.clone()
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}."

        def lin(name, v, p=p):
            return v @ sd[p + name + ".weight"].T + sd[p + name + ".bias"]

        n = _rms(want, eps)
        split = [lin(f"self_attn.{k}_proj", n).view(2, 9, nh, hd) for k in "qkv"]
        q, k = _rms(split[0], eps), _rms(split[1], eps)
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
        s = s.masked_fill(~keys[:, None, None, :], -math.inf)
        a = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), split[2]).reshape(2, 9, -1)
        want = want + lin("self_attn.out_proj", a)
        want = want + lin("mlp.fc2", _gelu_tanh(lin("mlp.fc1", _rms(want, eps))))
    want = want @ sd["projector.weight"].T + sd["projector.bias"]
    got = tp(x, keys)
    assert got.shape == (2, 9, c["projection_dim"])
    assert (got - want).abs().max().item() < 1e-9


def test_layout_table_is_the_modules_state_dict():
    """One truth for the names: the header check's table (no torch) equals what the modules
    load, for the released sizes and for others."""
    cases = (
        (QueryFormer, QUERYFORMER_LAYOUT, RELEASED_QF),
        (TextProjection, TEXT_PROJECTION_LAYOUT, RELEASED_TP),
        (QueryFormer, QUERYFORMER_LAYOUT, {**QUERYFORMER, "num_hidden_layers": 3}),
        (TextProjection, TEXT_PROJECTION_LAYOUT, NON_DEFAULT_TP),
    )
    for cls, layout, cfg in cases:
        args = {k: cfg[k] for k in (*layout.int_keys, "norm_eps")}
        with torch.device("meta"):
            module = cls(**args)
        assert {k: tuple(v.shape) for k, v in module.state_dict().items()} == layout.tensors(args)


def test_released_sizes_match_the_published_file_sizes():
    """The released files' sizes (T8mars/LLaDA-Image manifests/llada-image-turbo.source.json)
    are the bf16 bytes of exactly these tables plus a plausible header: no q/k norm weights."""
    qf, tp = QUERYFORMER_LAYOUT.tensors(RELEASED_QF), TEXT_PROJECTION_LAYOUT.tensors(RELEASED_TP)

    def data_bytes(table):
        return sum(2 * math.prod(s) for s in table.values())

    assert len(qf) == 9 and data_bytes(qf) == 101_748_736  # file: 101,749,704 bytes
    assert len(tp) == 74 and data_bytes(tp) == 652_449_792  # file: 652,457,384 bytes
    assert 0 < 101_749_704 - data_bytes(qf) < 120 * len(qf)
    assert 0 < 652_457_384 - data_bytes(tp) < 120 * len(tp)
    assert "layers.5.self_attn.q_proj.weight" in tp and "layers.0.self_attn.q_norm.weight" not in tp


@pytest.mark.parametrize(
    "edit,match",
    [
        ({"num_layers": 6}, r"keys \['num_layers'\] of an older gguf-trainer layout"),
        ({"rms_norm_eps": 1e-6}, "older gguf-trainer layout"),
        (
            {"qk_norm_affine": True},
            (
                r"keys \['qk_norm_affine'\] that gguf-trainer's LLaDAImageTextProjectionModel "
                r"does not build"
            ),
        ),
        (
            {"_class_name": "TextProjection"},
            "describes 'TextProjection', not the released LLaDAImageTextProjectionModel",
        ),
        ({"norm_eps": None}, r"lacks \['norm_eps'\]"),
        ({"num_hidden_layers": True}, r"unusable values for \['num_hidden_layers'\]"),
        ({"num_attention_heads": 5}, "not a multiple of num_attention_heads 5"),
    ],
)
def test_unknown_layouts_are_refused_not_guessed(tmp_path, edit, match):
    config = {**TEXT_PROJECTION, **edit}
    config = {k: v for k, v in config.items() if v is not None}
    folder = tmp_path / "text_projection"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=match) as err:
        module_config(TextProjection, folder)
    assert str(folder / "config.json") in str(err.value) and "\n" not in str(err.value)


def test_strict_loading_names_missing_and_unexpected_keys(tmp_path, snapshot):
    from safetensors.torch import load_file, save_file

    folder = shutil.copytree(snapshot / "queryformer", tmp_path / "queryformer")
    weights = folder / "diffusion_pytorch_model.safetensors"
    state = load_file(str(weights))
    state.pop("query_blocks.0.mlp.fc2.bias")
    state["query_blocks.0.extra.weight"] = torch.zeros(2)
    save_file(state, str(weights))
    with pytest.raises(UserError) as err:
        load_module(QueryFormer, folder)
    msg = str(err.value)
    assert "missing [query_blocks.0.mlp.fc2.bias]" in msg and str(weights) in msg
    assert "unexpected [query_blocks.0.extra.weight]" in msg and "\n" not in msg
    state.pop("query_blocks.0.extra.weight")
    state["query_blocks.0.mlp.fc2.bias"] = torch.zeros(3)  # wrong shape
    save_file(state, str(weights))
    with pytest.raises(UserError, match="shapes differ"):
        load_module(QueryFormer, folder)


# ---------------------------------------------------------------- mask, positions, batching


def test_mask_keeps_text_from_the_queries_and_everyone_from_pads():
    _, pos, bias = attention_inputs(torch.tensor([[1, 1, 1], [1, 0, 0]]), 2, torch.float32)
    allowed = bias[:, 0] == 0
    assert allowed.shape == (2, 5, 5)
    assert not allowed[:, :3, 3:].any()  # text rows never see the query columns
    assert allowed[0, 3:].all()  # queries see every real row, each other included
    assert allowed[1, 3:].tolist() == [[True, False, False, True, True]] * 2  # ... never a pad
    assert not allowed[1, :, 1:3].any()
    assert allowed[0, :3, :3].all()  # not causal
    assert pos.tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]]  # right pads never shift a query


def test_text_rows_do_not_depend_on_the_queries(teacher):
    """Functional check through the real backbone: other query content, same text rows."""
    ids = torch.tensor([teacher.token_ids(["a red fox"])[0]])
    mask = torch.ones_like(ids)
    emb = teacher.embed(ids)
    _, pos, bias = attention_inputs(mask, teacher.num_queries, torch.float32)
    outs = []
    with torch.inference_mode():
        for seed in (0, 1):
            q = torch.randn(
                1, teacher.num_queries, emb.shape[-1], generator=torch.Generator().manual_seed(seed)
            )
            outs.append(
                teacher.backbone(
                    inputs_embeds=torch.cat([emb, q], 1), attention_mask=bias, position_ids=pos
                ).last_hidden_state
            )
    n = ids.shape[1]
    assert torch.equal(outs[0][:, :n], outs[1][:, :n])
    assert not torch.allclose(outs[0][:, n:], outs[1][:, n:])


def test_batched_equals_per_prompt(teacher):
    batched = teacher.encode(PROMPTS)  # mixed lengths, right-padded
    single = torch.cat([teacher.encode([p]) for p in PROMPTS])
    delta = (batched - single).abs().max().item()
    scale = single.abs().max().item()
    print(
        f"batched vs per-prompt: max |delta| {delta:.3g} on rows of max |x| {scale:.3g} "
        f"({delta / scale:.3g} relative)"
    )
    assert batched.shape == (3, 256, 2560) and batched.dtype == torch.float32
    assert delta <= 1e-6 * scale
    assert (single[0] - single[2]).abs().max() > 1e-3  # the rows do depend on the prompt


def test_teacher_tokenizer_adds_its_special_tokens_over_the_template(teacher):
    ids = teacher.token_ids(["a red fox", "  "])
    tok = teacher.tokenizer
    assert ids[0][0] == tok.bos_token_id and ids[0][-1] == tok.eos_token_id
    assert tok.decode(ids[1], skip_special_tokens=True) == PACK.format_prompt("")
    lens = teacher.lengths(["a red fox"])
    assert lens == [len(ids[0]) + 256]


def test_targets_accept_sample_records(teacher, snapshot):
    class Rec:
        text = "a red fox"

    rows = teacher.targets([Rec()], [[1, 2, 3]])
    assert len(rows) == 1 and rows[0].rows.shape == (256, 2560)
    assert torch.equal(rows[0].rows, teacher.encode(["a red fox"])[0])
    assert teacher.identity["code_hash"] == trust.code_hash(snapshot)


def test_plain_2d_mask_would_be_causal_which_is_why_we_never_pass_one(teacher):
    """The released code turns a padded 2-D mask into causal + padding: the reason the teacher
    builds the 4-D mask itself."""
    ids = torch.tensor([teacher.token_ids(["a red fox"])[0] + [0]])
    mask2d = torch.ones_like(ids)
    mask2d[0, -1] = 0
    with torch.inference_mode():
        a = teacher.backbone(input_ids=ids, attention_mask=mask2d).last_hidden_state
        _, pos, bias = attention_inputs(mask2d, 0, torch.float32)
        b = teacher.backbone(input_ids=ids, attention_mask=bias, position_ids=pos).last_hidden_state
    assert (a[0, :-1] - b[0, :-1]).abs().max() > 1e-3


# ---------------------------------------------------------------- placement


def test_sequential_fills_the_chosen_gpu_first(snapshot):
    budgets = [(1, 300_000), (0, 250_000), ("cpu", 64 * GIB)]  # the tiny model is ~0.48 MB
    dmap = plan_backbone(snapshot, budgets, "sequential")
    order = list(dict.fromkeys(dmap.values()))
    assert order[0] == 1 and order[-1] == "cpu"  # GPU 1 chosen: it fills before GPU 0
    assert dmap["model.language_model.word_embeddings"] == 1
    # the repaired table stays on the main card
    assert dmap.pop("model.language_model.rotary_emb") == 1
    seq = [{1: 0, 0: 1, "cpu": 2}[d] for d in dmap.values()]
    assert seq == sorted(seq)  # layers flow chosen GPU -> other GPUs -> CPU RAM


def test_balanced_spreads_over_the_gpus(snapshot):
    dmap = plan_backbone(snapshot, [(0, 64 * GIB), (1, 64 * GIB), ("cpu", 64 * GIB)], "balanced")
    assert {0, 1} <= set(dmap.values())
    seq_all = plan_backbone(snapshot, [(0, 64 * GIB), (1, 64 * GIB), ("cpu", 64 * GIB)])
    assert set(seq_all.values()) == {0}  # sequential keeps a model that fits on one card


def test_plan_that_cannot_fit_is_refused(snapshot):
    with pytest.raises(UserError, match="does not fit"):
        plan_backbone(snapshot, [(0, 1000), ("cpu", 1000)])
    with pytest.raises(UserError, match="sequential or balanced"):
        plan_backbone(snapshot, [("cpu", GIB)], "auto")


# ---------------------------------------------------------------- SigVQ companion


def test_sigvq_companion_names_dtypes_count_and_rebuild(tmp_path, snapshot):
    import gguf
    from safetensors import safe_open

    from gguf_trainer.model.sigvq_export import sigvq_file_for, source_in, write_sigvq_gguf

    src = source_in(snapshot)
    dest = sigvq_file_for(tmp_path / "pig_llada_adapter-f16.gguf")
    assert dest.name == "pig_llada_sigvq-f16.gguf"
    info = write_sigvq_gguf(src, dest)
    with safe_open(str(src), framework="pt") as st:
        want = {k: st.get_tensor(k) for k in st.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    reader = gguf.GGUFReader(dest)
    got = {t.name: t for t in reader.tensors}
    assert info["rebuilt"] and info["n_tensors"] == len(want) == len(got) == 5
    assert set(got) == set(want)  # verbatim HF names, no prefix
    for name, t in got.items():
        assert t.tensor_type == gguf.GGMLQuantizationType.F16
        arr = np.asarray(t.data).reshape(tuple(want[name].shape))
        assert np.array_equal(arr, want[name].to(torch.float16).numpy())
    assert str(reader.get_field("general.name").contents()) == "pig_llada_sigvq-f16"
    assert {f for f in reader.fields if not f.startswith("GGUF.")} == {
        "general.architecture",
        "general.name",
    }
    assert not write_sigvq_gguf(src, dest)["rebuilt"]  # not older than its source: kept
    later = dest.stat().st_mtime + 10
    os.utime(src, (later, later))
    assert write_sigvq_gguf(src, dest)["rebuilt"]


def test_sigvq_bad_source_is_one_sentence(tmp_path):
    from gguf_trainer.model.sigvq_export import source_in, write_sigvq_gguf

    assert source_in(tmp_path) is None and source_in(None) is None
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(UserError, match="cannot be read as safetensors"):
        write_sigvq_gguf(bad, tmp_path / "x_sigvq-f16.gguf")
    assert not (tmp_path / "x_sigvq-f16.gguf").exists()


def test_experts_refuse_autograd(teacher):
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(RuntimeError, match="inference only"):
        teacher.backbone(input_ids=ids)


# ---------------------------------------------------------------- pack wiring


def _fake_project(tmp_path, teacher=None, sigvq=None, mock=False, export_sigvq=True):
    from types import SimpleNamespace

    paths = {"teacher": teacher, "sigvq": sigvq}
    return SimpleNamespace(
        pack=PACK,
        dir=tmp_path / "proj",
        material_path=lambda mid: paths.get(mid),
        settings=SimpleNamespace(
            precompute=SimpleNamespace(mock_teacher=mock),
            export=SimpleNamespace(export_sigvq=export_sigvq),
        ),
    )


def test_project_trust_functions(llada_env, snapshot, tmp_path):
    root = shutil.copytree(snapshot, llada_env / "project_trust")
    proj = _fake_project(tmp_path, teacher=root)
    assert materials.project_trust_status(proj)["reason"] == "never"
    with pytest.raises(UserError, match=f"--project {tmp_path / 'proj'} --trust-remote-code"):
        materials.require_project_trust(proj)
    assert materials.confirm_project_trust(proj)["trusted"]
    materials.require_project_trust(proj)  # no error now
    assert materials.project_trust_status(_fake_project(tmp_path, teacher=root, mock=True)) is None
    assert materials.project_trust_status(_fake_project(tmp_path, teacher=None)) is None


def test_export_without_sigvq_says_so_and_command_leaves_llm_vision_out(tmp_path, caplog):
    adapter = tmp_path / "pig_llada_adapter-f16.gguf"
    adapter.write_bytes(b"x")
    with caplog.at_level("INFO"):
        assert PACK.write_companions(_fake_project(tmp_path), adapter) == []
    assert "no SigVQ companion" in caplog.text and "leaves --llm_vision out" in caplog.text
    cmd = PACK.engine_command(student="pig_clip-q8_0.gguf", adapter=str(adapter))
    assert (
        "--llm_vision" not in cmd and "--ref-image" not in cmd and f"--llm-adapter {adapter}" in cmd
    )
    assert "--llm_vision <pig_llada_sigvq-f16.gguf>" in PACK.engine_command()  # the template view


def test_export_writes_and_names_the_companion(tmp_path, snapshot):
    adapter = tmp_path / "pig_llada_adapter-f16.gguf"
    adapter.write_bytes(b"x")
    (written,) = PACK.write_companions(_fake_project(tmp_path, sigvq=snapshot), adapter)
    assert written == tmp_path / "pig_llada_sigvq-f16.gguf" and written.is_file()
    assert f"--llm_vision {written} --ref-image" in PACK.engine_command(adapter=str(adapter))
    assert (
        PACK.write_companions(_fake_project(tmp_path, sigvq=snapshot, export_sigvq=False), adapter)
        == []
    )


def test_the_companion_is_never_written_over_a_file_the_export_may_not_replace(tmp_path, snapshot):
    """The export passes its ownership rule (refuse_overwrite) as may_write: a user's file at
    the companion's name is refused before anything is written over it."""
    adapter = tmp_path / "pig_llada_adapter-f16.gguf"
    adapter.write_bytes(b"x")
    users = tmp_path / "pig_llada_sigvq-f16.gguf"
    users.write_bytes(b"the user's own file")

    def refuse(path):
        raise UserError(f"{path} is not this project's")

    with pytest.raises(UserError, match="not this project's"):
        PACK.write_companions(_fake_project(tmp_path, sigvq=snapshot), adapter, may_write=refuse)
    assert users.read_bytes() == b"the user's own file"


def test_health_line_reads_the_shared_verdicts():
    early = PACK.health_line({"cos_centered": 0.5, "trained_steps": 40})
    assert early.startswith("too early to judge at 40 steps")
    assert PACK.health_line({"cos_centered": 0.97, "trained_steps": 20000}).startswith("healthy")
    assert PACK.health_line({"cos_centered": 0.87, "trained_steps": 20000}).startswith("broken")
    assert "0.965" in PACK.health_line({"cos_centered": 0.95, "trained_steps": 20000})


def test_trust_remote_code_flag_confirms_the_projects_teacher(
    llada_env, snapshot, tmp_path, capsys
):
    from gguf_trainer.cli import build_parser
    from gguf_trainer.store.project import create_project

    root = shutil.copytree(snapshot, llada_env / "cli_trust")
    proj = tmp_path / "proj"
    create_project(proj, "llada_image", overrides={"materials": {"teacher": {"path": str(root)}}})
    for cmd in ("run", "start", "download"):
        assert (
            build_parser()
            .parse_args([cmd, "--project", str(proj), "--trust-remote-code"])
            .trust_remote_code
        )
    assert trust.trust_status(root)["reason"] == "never"
    line = control.confirm_trust(proj)
    assert line.startswith(f"trusted the teacher code in {root}") and "3 .py files" in line
    assert trust.trust_status(root)["trusted"]


@pytest.mark.gpu
def test_cuda_resident_and_offloaded_match_the_cpu_rows(snapshot, teacher):
    """bf16 on the card, resident and with most layers streamed from CPU RAM by the device map,
    against the fp32 CPU rows."""
    cpu = teacher.encode(PROMPTS)
    resident = load_llada_teacher(snapshot, format_prompt=PACK.format_prompt, device="cuda:0")
    dmap = plan_backbone(snapshot, [(0, 150_000), ("cpu", 64 * GIB)])
    assert "cpu" in dmap.values()
    offloaded = load_llada_teacher(
        snapshot, format_prompt=PACK.format_prompt, device="cuda:0", device_map=dmap
    )
    a, b = resident.encode(PROMPTS), offloaded.encode(PROMPTS)

    def cos(x, y):
        return F.cosine_similarity(x.flatten(1), y.flatten(1)).min().item()

    print(
        f"cuda bf16 vs cpu fp32: min cos {cos(a, cpu):.5f}; offloaded vs resident {cos(b, a):.6f}"
    )
    assert cos(a, cpu) > 0.99 and cos(b, a) > 0.9999
    resident.close()
    offloaded.close()


# ---------------------------------------------------------------- the header check (no weights, no
# code)


def _old_layout_copy(src, dest):
    """The snapshot as gguf-trainer's old loader wanted it: text_projection with num_layers /
    rms_norm_eps, `layers.N.attn.*` and q/k norm weights."""
    from safetensors.torch import save_file

    root = shutil.copytree(src, dest)
    tp = root / "text_projection"
    old = {
        "_class_name": "TextProjection",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "rms_norm_eps": 1e-6,
        "num_layers": 2,
        "projection_dim": 2560,
    }
    (tp / "config.json").write_text(json.dumps(old))
    state = {}
    for i in range(2):
        for k in ("q_proj", "k_proj", "v_proj", "out_proj"):
            state[f"layers.{i}.attn.{k}.weight"] = torch.zeros(64, 64)
            state[f"layers.{i}.attn.{k}.bias"] = torch.zeros(64)
        state[f"layers.{i}.attn.q_norm.weight"] = torch.ones(16)
        state[f"layers.{i}.attn.k_norm.weight"] = torch.ones(16)
        for k, shape in (("fc1", (128, 64)), ("fc2", (64, 128))):
            state[f"layers.{i}.mlp.{k}.weight"] = torch.zeros(shape)
            state[f"layers.{i}.mlp.{k}.bias"] = torch.zeros(shape[0])
    state["projector.weight"], state["projector.bias"] = torch.zeros(2560, 64), torch.zeros(2560)
    save_file(state, str(tp / "diffusion_pytorch_model.safetensors"))
    return root, old


def test_header_check_passes_the_released_layout(snapshot):
    summary = PACK.check_teacher({"teacher": snapshot})
    assert summary.startswith(
        "LLaDA-Image teacher: text encoder hidden 64 (3 layers, 2 weight file(s)), "
        "QueryFormer 1 block(s) x 256 queries, TextProjection 2 layer(s) -> 2560"
    )
    # sharded, as released
    assert (snapshot / "text_encoder" / "model.safetensors.index.json").is_file()


def test_old_key_names_are_refused_from_headers_without_the_remote_code(
    llada_env, snapshot, monkeypatch
):
    import sys

    import safetensors
    import safetensors.torch
    import transformers.dynamic_module_utils as dmu

    root, _ = _old_layout_copy(snapshot, llada_env / "old_layout")
    monkeypatch.setattr(
        dmu,
        "get_class_from_dynamic_module",
        lambda *a, **k: pytest.fail("remote code imported by the header check"),
    )
    before = {m for m in sys.modules if "llada2uni" in m}
    # headers only: no tensor of any file is read (the check costs milliseconds, not a load)
    with monkeypatch.context() as m:
        for mod, name in ((safetensors, "safe_open"), (safetensors.torch, "load_file"),
                          (safetensors.torch, "load"), (torch, "load")):
            m.setattr(mod, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} during the check"))
        with pytest.raises(UserError) as err:
            PACK.check_teacher({"teacher": root})
    msg = str(err.value)
    assert str(root / "text_projection" / "config.json") in msg and "\n" not in msg
    assert "older gguf-trainer layout" in msg and "num_hidden_layers, norm_eps" in msg
    assert {m for m in sys.modules if "llada2uni" in m} == before
    # released keys over the old weight names: the weights sentence lists what is missing and extra
    (root / "text_projection" / "config.json").write_text(json.dumps(TEXT_PROJECTION))
    with pytest.raises(UserError) as err:
        PACK.teacher_gib({"teacher": root}, "cpu")  # the pre-flight refuses before anything loads
    msg = str(err.value)
    weights = root / "text_projection" / "diffusion_pytorch_model.safetensors"
    assert (
        msg.startswith(
            f"{weights} does not match its config.json (the released layout): missing "
            "[layers.0.self_attn.k_proj.bias,"
        )
        and "(16 in all)" in msg
    )
    assert "unexpected [layers.0.attn.k_norm.weight," in msg and "(20 in all)" in msg
    # ... and so does the load, before the trust check or the backbone
    plan = __import__("types").SimpleNamespace(
        mode="cpu", placement="sequential", gpu_gib=0.0, cpu_gib=8.0
    )
    with pytest.raises(UserError, match="does not match its config.json"):
        PACK.load_teacher({"teacher": root}, plan, torch.device("cpu"))


def _broken(snapshot, dest, how):
    root = shutil.copytree(snapshot, dest)
    te = root / "text_encoder"
    if how == "cut_shard":
        shard = te / "model-00002-of-00002.safetensors"
        with open(shard, "r+b") as f:
            f.truncate(shard.stat().st_size - 100)
    elif how == "missing_shard":
        (te / "model-00001-of-00002.safetensors").unlink()
    elif how == "hidden_mismatch":
        cfg = json.loads((te / "config.json").read_text())
        (te / "config.json").write_text(json.dumps({**cfg, "hidden_size": 128}))
    elif how == "queries":  # a consistent QueryFormer, but not this pack's 256 rows
        shutil.rmtree(root / "queryformer")
        _write_module(root / "queryformer", {**QUERYFORMER, "num_queries": 64}, QUERYFORMER_LAYOUT)
    elif how == "width":
        shutil.rmtree(root / "text_projection")
        _write_module(
            root / "text_projection",
            {**TEXT_PROJECTION, "projection_dim": 32},
            TEXT_PROJECTION_LAYOUT,
        )
    elif how == "no_code":
        (te / "modeling_llada2uni_moe.py").unlink()
    return root


@pytest.mark.parametrize(
    "how,match",
    [
        ("cut_shard", r"model-00002-of-00002\.safetensors is cut short"),
        (
            "missing_shard",
            (
                r"model-00001-of-00002\.safetensors is missing "
                r"\(model\.safetensors\.index\.json names it"
            ),
        ),
        (
            "hidden_mismatch",
            r"queryformer/config\.json has hidden_size 64 but .*text_encoder/config\.json has 128",
        ),
        ("queries", r"num_queries 64; this pack's targets are 256 rows"),
        ("width", r"projection_dim 32; this pack's targets are 2560 wide"),
        ("no_code", r"modeling_llada2uni_moe\.py is missing \(named by auto_map"),
    ],
)
def test_header_check_names_the_file_and_the_reason(llada_env, snapshot, how, match):
    root = _broken(snapshot, llada_env / f"broken_{how}", how)
    with pytest.raises(UserError, match=match) as err:
        PACK.check_teacher({"teacher": root})
    assert str(root) in str(err.value) and "\n" not in str(err.value)


def test_materials_shows_a_broken_teacher_as_failed_with_the_sentence(
    llada_env, snapshot, tmp_path
):
    """`gguf-trainer materials` and the GUI's Materials (the same rows): linked, every file
    present, refused by the header check: `failed` with the sentence, not `ready`."""
    from gguf_trainer.runner import downloads
    from gguf_trainer.store.project import create_project
    from gguf_trainer.ui import api

    bad, _ = _old_layout_copy(snapshot, llada_env / "linked_old")
    proj = tmp_path / "proj"
    create_project(proj, "llada_image")
    row = downloads.link_material(proj, "teacher", bad)
    assert row["state"] == "failed" and row["verified"] is False
    assert "text_projection/config.json uses keys ['num_layers', 'rms_norm_eps']" in row["error"]
    gui = next(m for m in api.materials(str(proj))["materials"] if m["id"] == "teacher")
    assert gui["state"] == "failed" and gui["error"] == row["error"]
    assert "failed" in downloads.format_statuses([row]) and row[
        "error"
    ] in downloads.format_statuses([row])
    good = downloads.link_material(proj, "teacher", snapshot)
    assert good["state"] == "ready" and good["verified"] and "LLaDA-Image teacher:" in good["note"]
