"""adapter_file / `gguf-trainer inspect`: engine detection and every refusal reason.

Good files come from the exporter; broken ones are written here with GGUFWriter directly,
from the §1.4 shapes, so each test breaks exactly one thing.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch
from adapter_cases import CFGS, DEPTH, IN, OUT, QUERIES, VIS, VOCAB, WIDTH

from gguf_trainer.base.errors import UserError
from gguf_trainer.model.adapter_file import (
    expected_tensors,
    read_adapter,
    read_adapter_arrays,
    trainer_kind,
)
from gguf_trainer.model.adapter_report import format_report, inspect_main, report_dict
from gguf_trainer.model.adapters import build_adapter, load_gguf
from gguf_trainer.model.export import write_adapter_gguf

RANK = 16
Q8 = gguf.GGMLQuantizationType.Q8_0
BF16 = gguf.GGMLQuantizationType.BF16
Q4 = gguf.GGMLQuantizationType.Q4_0  # no export.dtype writes it: a Linear in it is a problem


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """kind -> path of an exported file."""
    d = tmp_path_factory.mktemp("good")
    torch.manual_seed(0)
    out = {}
    for kind, cfg in CFGS.items():
        out[kind] = d / f"{kind}.gguf"
        write_adapter_gguf(
            out[kind], build_adapter(cfg).state_dict(), cfg, metadata={"adapter.pack": "t"}
        )
    return out


def default_f32(name: str, ne: tuple) -> bool:
    return (
        len(ne) == 1 or name in ("query", "vision_proj.weight", "layer_map") or ".ln_" in "." + name
    )


def shapes(kind="resampler", width=WIDTH, **kw) -> dict[str, tuple]:
    """File names -> ne for a well-formed file of a detected kind."""
    args = {
        "in_dim": IN,
        "out_dim": OUT,
        "width": width,
        "depth": DEPTH,
        "mlp_hidden": 4 * width,
        "num_queries": QUERIES,
    }
    args.update(kw)
    return {"adapter." + k: v for k, v in expected_tensors(kind, **args).items()}


def write_raw(path, ne: dict[str, tuple], types: dict | None = None, kv: dict | None = None):
    """Random tensors with the given ne; dtype f32/f16 by the policy unless `types` says
    'f32', 'f16' or a GGMLQuantizationType."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "pig")
    for k, v in (kv or {}).items():
        w.add_string(k, v)
    for name, dims in ne.items():
        a = rng.normal(size=tuple(reversed(dims))).astype(np.float32)
        ty = (types or {}).get(name) or (
            "f32" if default_f32(name.split("adapter.")[-1], dims) else "f16"
        )
        if ty in ("f32", "f16"):
            w.add_tensor(name, a.astype(np.float32 if ty == "f32" else np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(a, ty), raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(
    "kind,file_kind",
    [
        ("resampler", "resampler"),
        ("seeded_resampler", "seeded_resampler"),
        ("token_aligned_vision", "token_aligned"),
        ("token_aligned", "token_aligned"),
    ],
)
def test_good_files_have_no_problems(good, kind, file_kind):
    v = read_adapter(good[kind])
    assert v.problems == [] and v.refusals == []
    assert v.kind == file_kind
    assert (v.in_dim, v.out_dim, v.width, v.depth, v.heads, v.mlp_hidden) == (
        IN,
        OUT,
        WIDTH,
        DEPTH,
        2,
        4 * WIDTH,
    )
    ta, vision = kind.startswith("token_aligned"), kind == "token_aligned_vision"
    assert v.num_queries == (0 if ta else QUERIES)
    assert v.t5_vocab == (VOCAB if kind == "seeded_resampler" else 0)
    assert v.vis_dim == (VIS if vision else 0)
    assert (v.has_skip, v.has_vision_proj, v.has_vis_in, v.has_layer_map) == (
        ta, vision, vision, False)
    assert trainer_kind(v) == kind
    assert v.min_ggk == ("0.5.7" if kind == "resampler" else None)  # information, not a problem
    assert v.metadata["adapter.pack"] == "t" and v.metadata["adapter.width"] == WIDTH
    assert inspect_main(str(good[kind]), as_json=False, out=io.StringIO()) == 0


def test_seedless_report_mentions_min_ggk(good):
    buf = io.StringIO()
    assert inspect_main(str(good["resampler"]), as_json=False, out=buf) == 0
    text = buf.getvalue()
    assert "seedless resampler" in text and "0.5.7" in text and "problems       : none" in text
    assert "adapter.pack = t" in text and "width=128" in text


def test_json_output_parses(good):
    buf = io.StringIO()
    assert inspect_main(str(good["seeded_resampler"]), as_json=True, out=buf) == 0
    d = json.loads(buf.getvalue())
    assert set(d) >= {"path", "kind", "geometry", "metadata", "min_ggk", "problems", "tensors"}
    assert d["kind"] == "seeded_resampler" and d["geometry"]["t5_vocab"] == VOCAB
    assert (
        d["tensors"] == len(build_adapter(CFGS["seeded_resampler"]).state_dict())
        and d["problems"] == []
    )


def test_missing_tensor(tmp_path):
    ne = shapes()
    del ne["adapter.blocks.1.cross_attn.v.bias"]
    v = read_adapter(write_raw(tmp_path / "m.gguf", ne))
    assert len(v.problems) == 1 and "blocks.1.cross_attn.v.bias is missing" in v.problems[0]
    assert v.refusals == v.problems
    buf = io.StringIO()
    assert inspect_main(str(tmp_path / "m.gguf"), as_json=True, out=buf) == 1
    assert json.loads(buf.getvalue())["problems"] == v.problems
    with pytest.raises(UserError, match="refused by the engine"):
        load_gguf(tmp_path / "m.gguf")


def test_wrong_dtypes(tmp_path):
    ne = shapes("seeded_resampler", t5_vocab=VOCAB)
    types = {
        "adapter.blocks.0.ln_q.weight": "f16",
        "adapter.query": "f16",
        "adapter.in_proj.bias": "f16",
        "adapter.blocks.0.mlp.0.weight": Q4,
        "adapter.t5_embed.weight": BF16,
    }
    v = read_adapter(write_raw(tmp_path / "d.gguf", ne, types))
    assert len(v.problems) == 5 and v.refusals == []
    text = " ".join(v.problems)
    for name in types:
        assert name in text
    assert "must be f32" in text and "adds rounding the trainer did not see" in text
    assert "embedding table" in text and "turns it into f32" in text
    # the engine still runs it, so load_gguf does too (dequantized, as the engine converts)
    m = load_gguf(tmp_path / "d.gguf")
    arrays = read_adapter_arrays(tmp_path / "d.gguf")
    assert arrays["blocks.0.mlp.0.weight"].shape == (4 * WIDTH, WIDTH)
    assert torch.equal(m.blocks[0].mlp[0].weight, torch.from_numpy(arrays["blocks.0.mlp.0.weight"]))


def test_f32_matrices_are_only_a_note(tmp_path):
    ne = shapes()
    v = read_adapter(write_raw(tmp_path / "f.gguf", ne, {"adapter.in_proj.weight": "f32"}))
    assert v.problems == [] and any("f32 where shipped files use f16" in n for n in v.notes)


@pytest.mark.parametrize(
    "bad",
    [
        "adapter.layers.0.self_attn.q_proj.weight",
        "adapter.blk.0.attn_q.weight",
        "adapter.visual.merger",
        "model.norm.weight",
        "adapter.x.ffn_up.weight",
    ],
)
def test_colliding_names(tmp_path, bad):
    ne = {**shapes(), bad: (WIDTH,)}
    v = read_adapter(write_raw(tmp_path / "c.gguf", ne))
    assert len(v.problems) == 1 and bad in v.problems[0] and v.refusals == v.problems


def test_width_not_multiple_of_64(tmp_path):
    v = read_adapter(write_raw(tmp_path / "w.gguf", shapes(width=96)))
    assert v.width == 96 and v.heads is None
    assert len(v.problems) == 1 and "not a multiple of 64" in v.problems[0]


def test_wrong_shape_and_width_disagreement(tmp_path):
    ne = shapes()
    ne["adapter.in_proj.weight"] = (IN, 2 * WIDTH)  # in_proj width disagrees with query
    ne["adapter.blocks.1.mlp.2.weight"] = (4 * WIDTH + 1, WIDTH)
    v = read_adapter(write_raw(tmp_path / "s.gguf", ne))
    assert len(v.problems) == 2 and v.width == WIDTH
    assert "in_proj.weight has ne [32, 256]" in v.problems[0] and "[32, 128]" in v.problems[0]
    assert "blocks.1.mlp.2.weight" in v.problems[1]


def test_extra_tensors_are_notes(tmp_path):
    ne = {
        **shapes(
            "token_aligned",
            has_skip=True,
            has_vision_proj=True,
            has_vis_in=True,
            vis_dim=VIS,
            num_queries=0,
        ),
        "adapter.my_extra.weight": (4, 4),
        "tokenizer_json": (10,),
    }
    v = read_adapter(write_raw(tmp_path / "e.gguf", ne))
    assert v.problems == []
    assert any("my_extra" in n for n in v.notes) and any("outside adapter.*" in n for n in v.notes)
    assert load_gguf(tmp_path / "e.gguf").config == CFGS["token_aligned_vision"]


def test_seed_table_without_query(tmp_path):
    ne = {**shapes("token_aligned", num_queries=0), "adapter.t5_embed.weight": (WIDTH, VOCAB)}
    v = read_adapter(write_raw(tmp_path / "t.gguf", ne))
    assert v.kind == "token_aligned"
    assert len(v.problems) == 1 and "no adapter.query" in v.problems[0]


def test_vis_in_without_vision_proj(tmp_path):
    ne = shapes("token_aligned", num_queries=0, has_vis_in=True, vis_dim=VIS)
    v = read_adapter(write_raw(tmp_path / "v.gguf", ne))
    assert v.has_vis_in and not v.has_vision_proj
    assert len(v.problems) == 1 and "without adapter.vision_proj.weight" in v.problems[0]
    with pytest.raises(UserError):
        load_gguf(tmp_path / "v.gguf")


def test_vision_proj_alone_is_a_valid_engine_file_gguf_trainer_cannot_rebuild(tmp_path):
    ne = shapes("token_aligned", num_queries=0, has_vision_proj=True, vis_dim=VIS)
    v = read_adapter(write_raw(tmp_path / "vp.gguf", ne))
    assert v.problems == [] and v.vis_dim == VIS
    with pytest.raises(UserError, match="cannot rebuild"):
        load_gguf(tmp_path / "vp.gguf")


def test_factorized_and_layerwise_detection(tmp_path):
    ne = shapes("seeded_resampler_factorized", t5_vocab=VOCAB, embed_rank=RANK)
    v = read_adapter(write_raw(tmp_path / "fz.gguf", ne))
    assert v.kind == "seeded_resampler_factorized" and (v.embed_rank, v.t5_vocab) == (RANK, VOCAB)
    assert v.problems == [] and v.min_ggk is None
    assert trainer_kind(v) == "seeded_resampler"  # load_gguf rebuilds it with seed_rank = RANK
    # inspect: the rank and what the factorization saves against the full f16 table
    table = report_dict(v)["seed_table"]
    assert table == {"rank": RANK, "bytes": (VOCAB * RANK + RANK * WIDTH) * 2,
                     "full_bytes": VOCAB * WIDTH * 2,
                     "saved_bytes": (VOCAB * WIDTH - VOCAB * RANK - RANK * WIDTH) * 2}
    assert f"factorized, rank {RANK}" in format_report(v) and "saved" in format_report(v)
    assert report_dict(read_adapter(write_raw(tmp_path / "full.gguf", shapes(
        "seeded_resampler", t5_vocab=VOCAB))))["seed_table"] is None
    ne = shapes("token_aligned", num_queries=0, out_dim=3 * 16, has_layer_map=True, n_out_layers=3)
    v = read_adapter(write_raw(tmp_path / "lw.gguf", ne))
    assert v.has_layer_map and v.n_out_layers == 3 and v.problems == []
    ne["adapter.layer_map"] = (5,)
    assert "layer_map length 5" in " ".join(
        read_adapter(write_raw(tmp_path / "lw2.gguf", ne)).problems
    )


def test_ming_and_empty_files(tmp_path):
    ne = {**shapes("token_aligned", num_queries=0), "adapter.cap_query": (WIDTH, 4)}
    assert any(
        "ming_image" in p for p in read_adapter(write_raw(tmp_path / "ming.gguf", ne)).problems
    )
    v = read_adapter(write_raw(tmp_path / "student.gguf", {"model.embed_tokens2": (8, 8)}))
    assert v.kind is None and len(v.problems) == 1 and "no adapter.* tensors" in v.problems[0]


def test_engine_prefixed_names_are_read(tmp_path):
    ne = {"text_encoders.llm_adapter." + k: s for k, s in shapes().items()}
    v = read_adapter(write_raw(tmp_path / "p.gguf", ne))
    assert v.kind == "resampler" and v.problems == []
    assert "query" in read_adapter_arrays(tmp_path / "p.gguf")


def test_not_gguf_and_truncated(tmp_path, good):
    (tmp_path / "a.txt").write_text("hello, not a gguf file")
    with pytest.raises(UserError, match="truncated or not a GGUF file"):
        read_adapter(tmp_path / "a.txt")
    with pytest.raises(UserError, match="does not exist"):
        read_adapter(tmp_path / "missing.gguf")
    data = good["resampler"].read_bytes()
    for cut in (3, 40, len(data) // 2, len(data) - 10):
        (tmp_path / "t.gguf").write_bytes(data[:cut])
        with pytest.raises(UserError):
            read_adapter(tmp_path / "t.gguf")


def test_report_dict_is_json(good):
    d = report_dict(read_adapter(good["token_aligned_vision"]))
    assert json.loads(json.dumps(d, allow_nan=False)) == d
    assert d["trainer_kind"] == "token_aligned_vision" and d["geometry"]["vis_dim"] == VIS
    assert "token-aligned + skip, vision_proj, vis_in" in format_report(
        read_adapter(good["token_aligned_vision"])
    )


def test_module_does_not_import_torch():
    code = (
        "import sys, gguf_trainer.model.adapter_file; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
