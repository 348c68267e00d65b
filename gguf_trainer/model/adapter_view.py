"""What the ggk engine sees in an adapter GGUF: the variant and geometry it detects from tensor
names and shapes (engine-contract §1.3), the names and types its loader treats specially (§1.1,
§1.2), and the gguf-trainer kind that rebuilds a file.

Owns: AdapterView (the record adapter_file.read_adapter fills), `detect`, `trainer_kind`, the
layerwise families and export types. Must not: read files (adapter_file.py) or import torch.

Usage: `detect(view, rest)` on the tensors under `adapter.`; `trainer_kind(view)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    "FLUX.3 Klein": (4, 8, 12, 16, 20, 24, 28, 32),  # 3549-3561
    "Krea2": (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35),  # 3295-3305
    "Iris-3B": (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35),  # 3656-3673, Krea2's adapter
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
# (ggml_extend.hpp 3695-3698; else f32): the types export.dtype writes besides f16.
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


def rest_name(file_name: str) -> str | None:
    """The name under `text_encoders.llm_adapter.adapter.`, or None for a non-adapter tensor."""
    file_name = file_name.removeprefix(ENGINE_PREFIX)
    return file_name[len(PREFIX) :] if file_name.startswith(PREFIX) else None


# ---------------------------------------------------------------- detection (§1.3)


def ne_of(rest, name, axis, ndim=2):
    info = rest.get(name)
    if info is None or len(info[0]) != ndim:
        return None
    return info[0][axis]


def detect(view: AdapterView, rest: dict) -> None:
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
    view.in_dim = ne_of(rest, "in_proj.weight", 0)
    view.width = ne_of(rest, "query", 0) if is_resampler else ne_of(rest, "in_proj.weight", 1)
    view.out_dim = ne_of(rest, "out_proj.weight", 1)
    view.mlp_hidden = ne_of(rest, "blocks.0.mlp.0.weight", 1)
    view.vis_dim = (
        ne_of(rest, "vision_proj.weight", 0)
        if view.has_vision_proj
        else ne_of(rest, "vis_in.weight", 0)
        if view.has_vis_in
        else 0
    )
    view.n_out_layers = ne_of(rest, "layer_map", 0, ndim=1) if view.has_layer_map else 0
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
    view.num_queries = ne_of(rest, "query", 1)
    if "t5_embed_a.weight" in rest:
        view.kind = "seeded_resampler_factorized"
        view.embed_rank = ne_of(rest, "t5_embed_a.weight", 0)
        view.t5_vocab = ne_of(rest, "t5_embed_a.weight", 1)
    elif "t5_embed.weight" in rest:
        view.kind = "seeded_resampler"
        view.t5_vocab = ne_of(rest, "t5_embed.weight", 1)
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

