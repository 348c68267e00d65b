"""The LLaDA-Image teacher on the tiny remote-code snapshot (gguf_trainer/tiny/llada.py): the
real trust_remote_code path with the transformers-5 traps, QueryFormer/TextProjection against
independent computations, the attention mask and positions, placement on fake budgets, and the
SigVQ companion."""

from __future__ import annotations

import math
import os
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gguf_trainer.errors import UserError
from gguf_trainer.packs.llada_image import PACK
from gguf_trainer.teachers import trust
from gguf_trainer.teachers.llada import attention_inputs, load_llada_teacher, plan_backbone
from gguf_trainer.teachers.llada_compat import (
    install_attn_mask_utils,
    repair_rotary_tables,
    rotary_modules,
)
from gguf_trainer.teachers.placement import GIB
from gguf_trainer.teachers.queryformer import QueryFormer, TextProjection, load_module
from gguf_trainer.tiny.llada import QUERYFORMER, TEXT_ENCODER, TEXT_PROJECTION, copy_tiny_llada

PROMPTS = ["a red fox, oil painting", "",
           "a koi pond under a full moon in autumn, fog, highly detailed, 35mm photo, neon glow"]


@pytest.fixture(scope="module")
def llada_env(tmp_path_factory):
    """A private GGUF_TRAINER_HOME (trust records) and HF modules cache (remote code copies)."""
    import transformers.dynamic_module_utils as dmu

    root = tmp_path_factory.mktemp("llada_env")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(trust.HOME_ENV, str(root / "home"))
        mp.setattr(dmu, "HF_MODULES_CACHE", str(root / "modules"))
        yield root


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
    root = _edited_copy(snapshot, llada_env / "bad_rope", "return inv, 1.0", 'return inv * float("nan"), 1.0')
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
    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)


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
    mha = torch.nn.MultiheadAttention(c["hidden_size"], c["num_attention_heads"], batch_first=True).double()
    mha.load_state_dict({k.split("cross_attn.")[1]: v for k, v in sd.items() if "cross_attn." in k})
    eps = c["layer_norm_eps"]
    q = _ln(sd["meta_queries"].expand(2, -1, -1), eps)
    e = _ln(enc, eps)
    q = q + mha(q, e, e, key_padding_mask=~mask, need_weights=False)[0]
    q = _ln(q, eps)
    h = _gelu_tanh(q @ sd["query_blocks.0.mlp.fc1.weight"].T + sd["query_blocks.0.mlp.fc1.bias"])
    want = q + h @ sd["query_blocks.0.mlp.fc2.weight"].T + sd["query_blocks.0.mlp.fc2.bias"]
    got = qf(enc, mask)
    assert got.shape == (2, c["num_queries"], c["hidden_size"])
    assert (got - want).abs().max().item() < 1e-10


def test_text_projection_matches_hand_computation(snapshot):
    tp = load_module(TextProjection, snapshot / "text_projection").double()
    sd, c = tp.state_dict(), TEXT_PROJECTION
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 9, c["hidden_size"], generator=g, dtype=torch.float64)
    keys = torch.tensor([[1] * 9, [1] * 6 + [0] * 3]).bool()
    eps, nh = c["rms_norm_eps"], c["num_attention_heads"]
    hd = c["hidden_size"] // nh
    want = x.clone()
    for i in range(c["num_layers"]):
        p = f"layers.{i}."

        def lin(name, v, p=p):
            return v @ sd[p + name + ".weight"].T + sd[p + name + ".bias"]

        n = _rms(want, eps)
        split = [lin(f"attn.{k}_proj", n).view(2, 9, nh, hd) for k in "qkv"]
        q = _rms(split[0], eps) * sd[p + "attn.q_norm.weight"]
        k = _rms(split[1], eps) * sd[p + "attn.k_norm.weight"]
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
        s = s.masked_fill(~keys[:, None, None, :], -math.inf)
        a = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), split[2]).reshape(2, 9, -1)
        want = want + lin("attn.out_proj", a)
        want = want + lin("mlp.fc2", _gelu_tanh(lin("mlp.fc1", _rms(want, eps))))
    want = want @ sd["projector.weight"].T + sd["projector.bias"]
    got = tp(x, keys)
    assert got.shape == (2, 9, c["projection_dim"])
    assert (got - want).abs().max().item() < 1e-9


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
    assert "missing ['query_blocks.0.mlp.fc2.bias']" in msg
    assert "unexpected ['query_blocks.0.extra.weight']" in msg and "\n" not in msg
    state.pop("query_blocks.0.extra.weight")
    state["query_blocks.0.mlp.fc2.bias"] = torch.zeros(3)  # wrong shape
    save_file(state, str(weights))
    with pytest.raises(UserError, match="shapes differ"):
        load_module(QueryFormer, folder)


# ---------------------------------------------------------------- mask, positions, batching


def test_mask_keeps_text_from_the_queries_and_everyone_from_pads():
    _, pos, bias = attention_inputs(torch.tensor([[1, 1, 1], [1, 0, 0]]), 2, torch.float32)
    allowed = (bias[:, 0] == 0)
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
            q = torch.randn(1, teacher.num_queries, emb.shape[-1], generator=torch.Generator().manual_seed(seed))
            outs.append(teacher.backbone(inputs_embeds=torch.cat([emb, q], 1), attention_mask=bias,
                                         position_ids=pos).last_hidden_state)
    n = ids.shape[1]
    assert torch.equal(outs[0][:, :n], outs[1][:, :n])
    assert not torch.allclose(outs[0][:, n:], outs[1][:, n:])


def test_batched_equals_per_prompt(teacher):
    batched = teacher.encode(PROMPTS)  # mixed lengths, right-padded
    single = torch.cat([teacher.encode([p]) for p in PROMPTS])
    delta = (batched - single).abs().max().item()
    scale = single.abs().max().item()
    print(f"batched vs per-prompt: max |delta| {delta:.3g} on rows of max |x| {scale:.3g} "
          f"({delta / scale:.3g} relative)")
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
    assert dmap.pop("model.language_model.rotary_emb") == 1  # the repaired table stays on the main card
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

    from gguf_trainer.sigvq_export import sigvq_file_for, source_in, write_sigvq_gguf

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
    assert {f for f in reader.fields if not f.startswith("GGUF.")} == {"general.architecture", "general.name"}
    assert not write_sigvq_gguf(src, dest)["rebuilt"]  # not older than its source: kept
    later = dest.stat().st_mtime + 10
    os.utime(src, (later, later))
    assert write_sigvq_gguf(src, dest)["rebuilt"]


def test_sigvq_bad_source_is_one_sentence(tmp_path):
    from gguf_trainer.sigvq_export import source_in, write_sigvq_gguf

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
        pack=PACK, dir=tmp_path / "proj", material_path=lambda mid: paths.get(mid),
        settings=SimpleNamespace(precompute=SimpleNamespace(mock_teacher=mock),
                                 export=SimpleNamespace(export_sigvq=export_sigvq)))


def test_project_trust_functions(llada_env, snapshot, tmp_path):
    root = shutil.copytree(snapshot, llada_env / "project_trust")
    proj = _fake_project(tmp_path, teacher=root)
    assert trust.project_trust_status(proj)["reason"] == "never"
    with pytest.raises(UserError, match=f"--project {tmp_path / 'proj'} --trust-remote-code"):
        trust.require_project_trust(proj)
    assert trust.confirm_project_trust(proj)["trusted"]
    trust.require_project_trust(proj)  # no error now
    assert trust.project_trust_status(_fake_project(tmp_path, teacher=root, mock=True)) is None
    assert trust.project_trust_status(_fake_project(tmp_path, teacher=None)) is None


def test_export_without_sigvq_says_so_and_command_leaves_llm_vision_out(tmp_path, caplog):
    adapter = tmp_path / "pig_llada_adapter-f16.gguf"
    adapter.write_bytes(b"x")
    with caplog.at_level("INFO"):
        assert PACK.write_companions(_fake_project(tmp_path), adapter) == []
    assert "no SigVQ companion" in caplog.text and "leaves --llm_vision out" in caplog.text
    cmd = PACK.engine_command(student="pig_clip-q8_0.gguf", adapter=str(adapter))
    assert "--llm_vision" not in cmd and "--ref-image" not in cmd and f"--llm-adapter {adapter}" in cmd
    assert "--llm_vision <pig_llada_sigvq-f16.gguf>" in PACK.engine_command()  # the template view


def test_export_writes_and_names_the_companion(tmp_path, snapshot):
    adapter = tmp_path / "pig_llada_adapter-f16.gguf"
    adapter.write_bytes(b"x")
    (written,) = PACK.write_companions(_fake_project(tmp_path, sigvq=snapshot), adapter)
    assert written == tmp_path / "pig_llada_sigvq-f16.gguf" and written.is_file()
    assert f"--llm_vision {written} --ref-image" in PACK.engine_command(adapter=str(adapter))
    assert PACK.write_companions(_fake_project(tmp_path, sigvq=snapshot, export_sigvq=False), adapter) == []


def test_health_line_reads_the_shared_verdicts():
    early = PACK.health_line({"cos_centered": 0.5, "trained_steps": 40})
    assert early.startswith("too early to judge at 40 steps")
    assert PACK.health_line({"cos_centered": 0.97, "trained_steps": 20000}).startswith("healthy")
    assert PACK.health_line({"cos_centered": 0.87, "trained_steps": 20000}).startswith("broken")
    assert "0.965" in PACK.health_line({"cos_centered": 0.95, "trained_steps": 20000})


def test_trust_remote_code_flag_confirms_the_projects_teacher(llada_env, snapshot, tmp_path, capsys):
    from gguf_trainer.cli import build_parser
    from gguf_trainer.project import create_project

    root = shutil.copytree(snapshot, llada_env / "cli_trust")
    proj = tmp_path / "proj"
    create_project(proj, "llada_image", overrides={"materials": {"teacher": {"path": str(root)}}})
    for cmd in ("run", "start", "download"):
        assert build_parser().parse_args([cmd, "--project", str(proj), "--trust-remote-code"]).trust_remote_code
    assert trust.trust_status(root)["reason"] == "never"
    line = trust.confirm_for_project_dir(proj)
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
    offloaded = load_llada_teacher(snapshot, format_prompt=PACK.format_prompt, device="cuda:0",
                                   device_map=dmap)
    a, b = resident.encode(PROMPTS), offloaded.encode(PROMPTS)

    def cos(x, y):
        return F.cosine_similarity(x.flatten(1), y.flatten(1)).min().item()

    print(f"cuda bf16 vs cpu fp32: min cos {cos(a, cpu):.5f}; offloaded vs resident {cos(b, a):.6f}")
    assert cos(a, cpu) > 0.99 and cos(b, a) > 0.9999
    resident.close()
    offloaded.close()
