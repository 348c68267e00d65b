"""Read an adapter GGUF the way the ggk engine does, and list everything wrong with it.

Owns: variant + geometry detection from tensor names and shapes (engine-contract §1.3),
the tensor inventory each variant needs (§1.4), the name-collision and dtype rules
(§1.1, §1.2): the view `gguf-trainer inspect` reports (adapter_report.py). It must not
import torch: the CLI and the UI use it, and users run it on adapter files from other tools too.

Usage: `view = read_adapter(path)`; `view.kind`, `view.problems`, `trainer_kind(view)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.gguf_bounds import check_gguf
from gguf_trainer.model import slot_file

PREFIX = "adapter."
# The engine adds this prefix to every file name that lacks it, so a file may carry it already.
ENGINE_PREFIX = "text_encoders.llm_adapter."
TOKENIZER_JSON = "tokenizer_json"  # a Ming file's Ling tokenizer.json (gk-diffuser.cpp 1327-1335)
HEAD_DIM = 64
SEEDLESS_MIN_GGK = "0.5.7"  # [T]: "ggk >= 0.5.7" selects query-without-t5_embed

# fmt: off
# §1.1: llama.cpp tokens the engine rewrites inside any name containing "llm".
LLAMA_CPP_SUBSTRINGS = (
    "attn_sinks.weight", "token_embd.", "blk.", "attn_q.", "attn_k.", "attn_v.", "attn_q_norm.",
    "attn_k_norm.", "attn_output.", "attn_norm.", "attn_post_norm.", "ffn_gate_inp.",
    "ffn_gate_exps.", "ffn_up_exps.", "ffn_down_exps.", "ffn_down.", "ffn_gate.", "ffn_up.",
    "ffn_post_norm.", "ffn_norm.", "output_norm.",
)
# §1.1: the student's config detector scans every `text_encoders.llm*` name, adapter included.
DETECTOR_TRAPS = (
    "visual.", "layers.", "embed_tokens.weight", "model.norm.weight",
    "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight",
    "layers.0.mlp.gate_proj.weight", "layers.0.pre_feedforward_layernorm.weight",
)
# §1.3: the trainer's ming_image kind, which this engine reads as a broken token-aligned file.
MING_MARKERS = (
    "cap_query", "slot_query", "seed_embed.weight", "seed_proj.weight", "vis_q.weight",
    "out_cap.weight",
)
# What adapter_report.report_dict puts under "geometry" (AdapterView field names).
GEOMETRY_KEYS = (
    "in_dim", "out_dim", "width", "depth", "heads", "num_queries", "t5_vocab", "embed_rank",
    "vis_dim", "mlp_hidden", "n_out_layers", "has_skip", "has_vision_proj", "has_vis_in",
    "has_layer_map",
)
# fmt: on
# engine-families §2: the ggk 0.9.7 families that condition on a stack of n teacher taps; the
# conditioner aborts unless the adapter's layer_map length is the family's n (conditioner.hpp
# 2798-2840). The taps (1-based decoder layers) are each family's out_layers.
LAYERWISE_FAMILIES = {
    "Flux.2 klein": (9, 18, 27),  # conditioner.hpp 3562-3573, a Qwen3 teacher
    "SeFi-Image": (9, 18, 27),  # 3574-3585, Qwen3-VL
    "FLUX.3 Klein": (4, 8, 12, 16, 20, 24, 28, 32),  # 3549-3560
    "Krea2": (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35),  # 3295-3305
    "Iris-3B": (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35),  # 3656-3680, Krea2's adapter
    "Ideogram 4": (1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 34, 36),  # 3383-3390
    "Fibo 2.0": (5, 7, 9, 11, 13, 16, 18, 20, 22, 24, 27, 29, 31, 33, 35),  # fibo2.hpp 39-43
}


def families_for(n: int) -> list[str]:
    """The engine families whose conditioner accepts an n-layer stack (by count: the engine
    checks nothing else)."""
    return [f for f, taps in LAYERWISE_FAMILIES.items() if len(taps) == n]


EMBED_TABLES = ("t5_embed.weight", "t5_embed_a.weight", "seed_embed.weight")
F32_NAMES = ("query", "vision_proj.weight", "layer_map", *slot_file.F32_QUERIES)
# Embedding tables keep these types in the engine; anything else becomes f32 on load.
EMBED_KEPT_TYPES = ("f16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0")
# A Linear keeps its file's type when its input width (ne0) is a multiple of the type's block
# (ggml_extend.hpp 3692-3695; else f32): the types export.dtype writes besides f16.
LINEAR_TYPES = {"q8_0": 32, "bf16": 1}


def block_size(type_name: str) -> int:
    return LINEAR_TYPES.get(type_name, 1)


def weight_type(view) -> str:
    """The export type of a file's Linear weights (`export.dtype`): q8_0 or bf16 when any
    weight is stored so, else f16 (f32 when every 2-D weight is f32)."""
    types = {ty for ne, ty in view.tensors.values() if len(ne) == 2}
    for ty in LINEAR_TYPES:
        if ty in types:
            return ty
    return "f16" if "f16" in types or not types else "f32"

Shape = tuple  # ne order; an element may be None where that size could not be detected


@dataclass
class AdapterView:
    """What the engine sees in one file. Sizes are None when the tensor they come from is
    absent (the engine would fall back to a default and then refuse the file)."""

    path: str
    # seeded_resampler | seeded_resampler_factorized | resampler | token_aligned | None
    kind: str | None = None
    in_dim: int | None = None
    out_dim: int | None = None
    width: int | None = None
    depth: int | None = None
    heads: int | None = None
    num_queries: int | None = None  # 0 for token-aligned (the engine forces it)
    t5_vocab: int | None = None  # 0 without a seed table
    embed_rank: int | None = None  # 0 unless factorized
    vis_dim: int | None = None  # 0 without the vision extension
    mlp_hidden: int | None = None
    n_out_layers: int | None = None  # layer_map length; 0 when not layerwise
    taps: tuple[int, ...] = ()  # layer_map's values (provenance: the engine never reads them)
    has_skip: bool = False
    has_vision_proj: bool = False
    has_vis_in: bool = False
    has_layer_map: bool = False
    # slot kinds (slot_file.py): num_queries = max_slots, t5_vocab/embed_rank = the seed table
    n_bank: int = 0
    bank_dim: int = 0
    bank_align: bool = False
    tensors: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    metadata: dict[str, object] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    # The subset of `problems` about names, shapes and variant: the engine refuses the file or
    # misreads it. The rest of `problems` is the dtype policy (the engine converts and runs).
    refusals: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # information only, never a reason to fail
    min_ggk: str | None = None


# ---------------------------------------------------------------- reading


def _open_reader(path):
    import gguf  # numpy-only package; imported here so `inspect --help` stays instant

    p = Path(path)
    if not p.is_file():
        raise UserError(
            f"{path} does not exist or is not a file; pass the path of an adapter .gguf file."
        )
    # Counts and sizes are checked against the file before GGUFReader allocates anything.
    check_gguf(p, fix="re-export it or choose another file")
    try:
        return gguf.GGUFReader(p)
    # GGUFReader reports a bad magic, a short header or truncated tensor data with these.
    except (ValueError, IndexError, KeyError, UnicodeDecodeError, OverflowError) as e:
        raise UserError(
            f"{path} is not a readable GGUF file ({e}); re-export it or choose another file."
        ) from e


def _type_name(tensor_type) -> str:
    return tensor_type.name.lower()


def _rest_name(file_name: str) -> str | None:
    """The name under `text_encoders.llm_adapter.adapter.`, or None for a non-adapter tensor."""
    file_name = file_name.removeprefix(ENGINE_PREFIX)
    return file_name[len(PREFIX) :] if file_name.startswith(PREFIX) else None


def _field_value(fld):
    value = fld.contents()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # keeps report_dict strict-JSON
    return value


def read_adapter(path) -> AdapterView:
    """Detect the variant and geometry as the engine does and list every problem.
    Raises UserError when the file is not a readable GGUF."""
    reader = _open_reader(path)
    view = AdapterView(path=str(path))
    view.tensors = {
        t.name: (tuple(int(d) for d in t.shape), _type_name(t.tensor_type)) for t in reader.tensors
    }
    view.metadata = {
        k: _field_value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")
    }
    view.taps = _layer_map_values(reader)
    del reader  # drop the memmap before a caller renames the file
    rest = {}
    for name, info in view.tensors.items():
        r = _rest_name(name)
        if r is not None:
            rest[r] = info
    if not rest:
        arch = view.metadata.get("general.architecture")
        llm = any(n.startswith(("blk.", "model.layers.", "model.embed_tokens", "token_embd"))
                  for n in view.tensors)
        if llm:  # the student pig_clip, or any LLM GGUF: say what it is and what goes here
            _refuse(
                view,
                f"{path} is a language model ({arch or 'LLM layout'}), not an adapter: it has no "
                "adapter.* tensors. It is what ggk takes as --llm (the student); inspect the "
                "adapter GGUF gguf-trainer exported instead.",
            )
        else:
            _check_names(view, rest)
            _refuse(
                view,
                f"{path} has no adapter.* tensors, so the engine finds no adapter in it "
                "(is it the student or another model?).",
            )
        return view
    _check_names(view, rest)
    _detect(view, rest)
    _check_variant(view, rest)
    _check_geometry(view, rest)
    _check_inventory(view, rest)
    _check_dtypes(view, rest)
    if view.kind == "resampler":
        view.min_ggk = SEEDLESS_MIN_GGK
    return view


def _layer_map_values(reader) -> tuple[int, ...]:
    """adapter.layer_map as tap numbers when it is a 1-D f32 of whole numbers, else ()."""
    import gguf

    for t in reader.tensors:
        if _rest_name(t.name) == "layer_map" and len(t.shape) == 1:
            if t.tensor_type != gguf.GGMLQuantizationType.F32:
                return ()
            values = np.asarray(t.data, dtype=np.float64)
            if np.all(np.isfinite(values)) and np.all(values == np.round(values)):
                return tuple(int(v) for v in values)
    return ()


def read_adapter_arrays(path) -> dict[str, np.ndarray]:
    """Every adapter tensor as float32 in torch shape order, keyed by its state-dict name.
    Quantized and bf16 data are dequantized the way the engine converts them."""
    import gguf

    reader = _open_reader(path)
    arrays = {}
    for t in reader.tensors:
        name = _rest_name(t.name)
        if name is None:
            continue
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            data = np.asarray(t.data, dtype=np.float32)
        else:
            data = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        arrays[name] = np.array(
            data.reshape(shape), dtype=np.float32, copy=True
        )  # writable, off the memmap
    return arrays


# ---------------------------------------------------------------- detection (§1.3)


def _ne(rest, name, axis, ndim=2):
    info = rest.get(name)
    if info is None or len(info[0]) != ndim:
        return None
    return info[0][axis]


def _detect(view: AdapterView, rest: dict) -> None:
    slot = slot_file.slot_kind(rest)
    if slot:
        view.kind = slot
        for key, value in slot_file.slot_geometry(slot, rest).items():
            setattr(view, key, value)
        view.has_vis_in = "vis_in.weight" in rest
        indices = [int(n.split(".")[1]) for n in rest
                   if n.startswith("blocks.") and n.split(".")[1].isdigit()]
        view.depth = max(indices) + 1 if indices else None
        if view.width and view.width % HEAD_DIM == 0:
            view.heads = view.width // HEAD_DIM
        return
    is_resampler = "query" in rest
    view.has_skip = "skip.weight" in rest
    view.has_vision_proj = "vision_proj.weight" in rest
    view.has_vis_in = "vis_in.weight" in rest
    view.has_layer_map = "layer_map" in rest
    view.in_dim = _ne(rest, "in_proj.weight", 0)
    view.width = _ne(rest, "query", 0) if is_resampler else _ne(rest, "in_proj.weight", 1)
    view.out_dim = _ne(rest, "out_proj.weight", 1)
    view.mlp_hidden = _ne(rest, "blocks.0.mlp.0.weight", 1)
    view.vis_dim = (
        _ne(rest, "vision_proj.weight", 0)
        if view.has_vision_proj
        else _ne(rest, "vis_in.weight", 0)
        if view.has_vis_in
        else 0
    )
    view.n_out_layers = _ne(rest, "layer_map", 0, ndim=1) if view.has_layer_map else 0
    indices = [
        int(n.split(".")[1]) for n in rest if n.startswith("blocks.") and n.split(".")[1].isdigit()
    ]
    view.depth = max(indices) + 1 if indices else None
    if view.width is not None and view.width > 0 and view.width % HEAD_DIM == 0:
        view.heads = view.width // HEAD_DIM
    view.num_queries, view.t5_vocab, view.embed_rank = 0, 0, 0
    if not is_resampler:
        view.kind = "token_aligned"
        return
    view.num_queries = _ne(rest, "query", 1)
    if "t5_embed_a.weight" in rest:
        view.kind = "seeded_resampler_factorized"
        view.embed_rank = _ne(rest, "t5_embed_a.weight", 0)
        view.t5_vocab = _ne(rest, "t5_embed_a.weight", 1)
    elif "t5_embed.weight" in rest:
        view.kind = "seeded_resampler"
        view.t5_vocab = _ne(rest, "t5_embed.weight", 1)
    else:
        view.kind = "resampler"


def trainer_kind(view: AdapterView) -> str | None:
    """The gguf-trainer module kind (adapters.KINDS) that rebuilds this file, or None. A
    factorized seed is a seeded_resampler with seed_rank = embed_rank; a token-aligned file
    with skip is `token_aligned` without vision tensors, `token_aligned_vision` with both;
    with a layer_map of n > 1 taps it is `layerwise`, text-only or with both vision tensors
    (Fibo 2.0 edits). A slot kind gguf-trainer builds is itself (slot_file.TRAINABLE)."""
    if view.kind in slot_file.TRAINABLE:
        return view.kind
    if view.kind in ("seeded_resampler", "resampler"):
        return view.kind
    if view.kind == "seeded_resampler_factorized":
        return "seeded_resampler"
    if view.kind != "token_aligned" or not view.has_skip:
        return None
    if view.has_layer_map:
        paired = view.has_vision_proj == view.has_vis_in  # both or neither
        return "layerwise" if paired and len(view.taps) > 1 else None
    if view.has_vision_proj and view.has_vis_in:
        return "token_aligned_vision"
    if not view.has_vision_proj and not view.has_vis_in:
        return "token_aligned"
    return None


# ---------------------------------------------------------------- inventory (§1.4)


def _block_tensors(i: int, w, h, *, cross: bool) -> dict[str, Shape]:
    b = f"blocks.{i}."
    subs = ["self_attn", "cross_attn"] if cross else ["self_attn"]
    lns = ["ln_self", "ln_q", "ln_kv", "ln_mlp"] if cross else ["ln_self", "ln_mlp"]
    out: dict[str, Shape] = {}
    for ln in lns:
        out[b + ln + ".weight"] = (w,)
        out[b + ln + ".bias"] = (w,)
    for sub in subs:
        for p in "qkvo":
            out[f"{b}{sub}.{p}.weight"] = (w, w)
            out[f"{b}{sub}.{p}.bias"] = (w,)
    out[b + "mlp.0.weight"] = (w, h)
    out[b + "mlp.0.bias"] = (h,)
    out[b + "mlp.2.weight"] = (h, w)
    out[b + "mlp.2.bias"] = (w,)
    return out


def expected_tensors(
    kind: str,
    *,
    in_dim,
    out_dim,
    width,
    depth: int,
    mlp_hidden,
    num_queries=0,
    t5_vocab=0,
    embed_rank=0,
    vis_dim=0,
    n_out_layers=0,
    has_skip=False,
    has_vision_proj=False,
    has_vis_in=False,
    has_layer_map=False,
) -> dict[str, Shape]:
    """Every tensor the engine declares for this variant (names without `adapter.`, ne order).
    Sizes may be None (not detected); such elements are not compared."""
    w = width
    t: dict[str, Shape] = {}
    resampler = kind != "token_aligned"
    if resampler:
        t["query"] = (w, num_queries)
    if kind == "seeded_resampler":
        t["t5_embed.weight"] = (w, t5_vocab)
    if kind == "seeded_resampler_factorized":
        t["t5_embed_a.weight"] = (embed_rank, t5_vocab)
        t["t5_embed_b.weight"] = (embed_rank, w)
    t["in_proj.weight"] = (in_dim, w)
    t["in_proj.bias"] = (w,)
    for i in range(depth):
        t.update(_block_tensors(i, w, mlp_hidden, cross=resampler))
    t["ln_out.weight"] = (w,)
    t["ln_out.bias"] = (w,)
    t["out_proj.weight"] = (w, out_dim)
    t["out_proj.bias"] = (out_dim,)
    if not resampler:  # the extensions are presence-switched and token-aligned only
        if has_skip:
            t["skip.weight"] = (in_dim, out_dim)
            t["skip.bias"] = (out_dim,)
        if has_vision_proj:
            t["vision_proj.weight"] = (vis_dim, in_dim)
        if has_vis_in:
            t["vis_in.weight"] = (vis_dim, w)
        if has_layer_map:
            t["layer_map"] = (n_out_layers,)
    return t


def _view_expected(view: AdapterView) -> dict[str, Shape]:
    if view.kind in slot_file.KINDS:
        g = {k: getattr(view, k) for k in ("width", "num_queries", "in_dim", "embed_rank",
                                            "t5_vocab", "vis_dim", "out_dim", "n_bank",
                                            "bank_dim", "bank_align")}
        blocks = {}
        for i in range(view.depth or 0):
            blocks.update(_block_tensors(i, view.width, view.mlp_hidden, cross=True))
        return {**slot_file.slot_tensors(view.kind, g), **blocks}
    sizes = {k: getattr(view, k) for k in GEOMETRY_KEYS if k not in ("depth", "heads")}
    return expected_tensors(view.kind, depth=view.depth or 0, **sizes)


def _shape_matches(ne: tuple, want: Shape) -> bool:
    return len(ne) == len(want) and all(w is None or n == w for n, w in zip(ne, want))


def _fmt_shape(shape: Shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _refuse(view: AdapterView, sentence: str) -> None:
    view.problems.append(sentence)
    view.refusals.append(sentence)


def _collides(name: str) -> str | None:
    return next((s for s in LLAMA_CPP_SUBSTRINGS + DETECTOR_TRAPS if s in name), None)


def _check_names(view: AdapterView, rest: dict) -> None:
    for name in view.tensors:
        hit = _collides(name)
        if hit:
            _refuse(
                view,
                f"tensor {name} contains {hit!r}, which the engine's name conversion or "
                "student detector also matches; rename it (adapter tensors "
                "use blocks.N, not layers.N).",
            )
    n_other = sum(1 for n in view.tensors if _rest_name(n) is None  # Ming's Ling vocabulary:
                  and not ("cap_query" in rest and n.endswith(TOKENIZER_JSON)))  # the engine's
    if n_other and rest:
        view.notes.append(
            f"{n_other} tensor(s) outside adapter.* are loaded but never used by the engine."
        )


def _check_variant(view: AdapterView, rest: dict) -> None:
    if view.kind in slot_file.KINDS:  # the engine's own kinds, not a broken token-aligned file
        for sentence in slot_file.slot_metadata_problems(view.kind, view.metadata):
            _refuse(view, sentence)
        if view.kind == "ming_image" and not any(n.endswith(TOKENIZER_JSON) for n in view.tensors):
            view.problems.append("the file carries no tokenizer_json, so the engine has no Ling "
                                 "vocabulary unless a tokenizer pack holds ling/tokenizer.json; "
                                 "re-export it with gguf-trainer's ming_image pack.")
        return
    ming = [m for m in MING_MARKERS if m in rest]
    if ming:
        _refuse(
            view,
            f"adapter.{ming[0]} marks a ming_image adapter, which this engine reads as a broken "
            "token-aligned file; export a resampler or token-aligned adapter instead.",
        )
    if view.kind == "token_aligned" and any(n.startswith("t5_embed") for n in rest):
        _refuse(
            view,
            "the file has a t5_embed seed table but no adapter.query, so the engine reads it as "
            "token-aligned and ignores the seeds; add the query tensor or drop the seed table.",
        )
    if view.kind == "token_aligned" and view.has_vis_in and not view.has_vision_proj:
        _refuse(
            view,
            "adapter.vis_in.weight is present without adapter.vision_proj.weight, so the engine "
            "refuses reference images and never uses vis_in; export vision_proj too.",
        )
    if view.kind != "token_aligned":
        for name in ("skip.weight", "vision_proj.weight", "vis_in.weight", "layer_map"):
            if name in rest:
                view.notes.append(
                    f"adapter.{name} belongs to token-aligned adapters; a resampler ignores it."
                )


def _check_geometry(view: AdapterView, rest: dict) -> None:
    if view.width is not None and view.width % HEAD_DIM != 0:
        _refuse(
            view,
            f"width {view.width} is not a multiple of {HEAD_DIM} (head_dim is fixed at "
            f"{HEAD_DIM}); "
            "retrain with a width such as 1024.",
        )
    if view.depth is None:
        _refuse(
            view,
            "the file has no adapter.blocks.N tensors; the engine then "
            "expects 6 blocks and refuses it.",
        )
    vp, vi = _ne(rest, "vision_proj.weight", 0), _ne(rest, "vis_in.weight", 0)
    if vp is not None and vi is not None and vp != vi:
        _refuse(
            view,
            f"vision_proj.weight reads vis_dim {vp} but vis_in.weight reads {vi}; both "
            "must equal the mmproj width.",
        )
    if (
        view.has_layer_map
        and view.n_out_layers
        and view.out_dim
        and view.out_dim % view.n_out_layers
    ):
        _refuse(
            view,
            f"out_dim {view.out_dim} is not a multiple of the layer_map length "
            f"{view.n_out_layers}, "
            "so the output cannot be n_layers x teacher_dim.",
        )


def _check_inventory(view: AdapterView, rest: dict) -> None:
    expected = _view_expected(view)
    for name, want in expected.items():
        if name not in rest:
            _refuse(
                view,
                f"adapter.{name} is missing; the engine refuses a {view.kind} adapter without it.",
            )
        elif not _shape_matches(rest[name][0], want):
            _refuse(
                view,
                f"adapter.{name} has ne {_fmt_shape(rest[name][0])} but the engine expects "
                f"{_fmt_shape(want)} from the detected geometry, so it refuses the file.",
            )
    # Extra adapter.* tensors are a note, not a problem: the engine loads them into its map and
    # never reads them (§1.2), so the file still runs. Foreign kinds with their own tensors (ming)
    # are caught above as problems because their *missing* pieces break the load.
    for name in rest:
        if name not in expected and not _collides(PREFIX + name):
            view.notes.append(
                f"adapter.{name} is not part of a {view.kind} adapter; the engine ignores it."
            )


def is_layernorm_name(name: str) -> bool:
    return any(part.startswith("ln_") for part in name.split("."))


def _check_dtypes(view: AdapterView, rest: dict) -> None:
    used = _view_expected(view)
    n_f32_2d = 0
    for name, (ne, ty) in rest.items():
        if name not in used:
            continue  # ignored by the engine, so its dtype cannot matter
        if len(ne) == 1 or name in F32_NAMES or is_layernorm_name(name):
            if ty != "f32":
                view.problems.append(
                    f"adapter.{name} is stored {ty} but must be f32 (1-D tensors, query, "
                    "vision_proj, layer_map and LayerNorm tensors are f32 in the engine)."
                )
        elif ty == "f32":
            n_f32_2d += 1  # exact, the engine keeps it: only a larger file than the f16 convention
        elif ty in LINEAR_TYPES and name not in EMBED_TABLES and ne[0] % block_size(ty) == 0:
            continue  # export.dtype q8_0 / bf16: a Linear the engine keeps in its file type
        elif ty != "f16":
            kind = "embedding table" if name in EMBED_TABLES else "2-D weight"
            extra = (
                " and the engine turns it into f32"
                if name in EMBED_TABLES and ty not in EMBED_KEPT_TYPES
                else ""
            )
            view.problems.append(
                f"adapter.{name} ({kind}) is stored {ty}{extra}, which adds rounding the "
                "trainer did not see; export it as f16."
            )
    if n_f32_2d:
        view.notes.append(
            f"{n_f32_2d} 2-D weight(s) are f32 where shipped files use f16 (exact, just larger)."
        )
