"""Every problem the ggk engine would have with an adapter file, as one sentence each: names its
loader rewrites (engine-contract §1.1), dtypes it converts (§1.2), a variant it misreads (§1.3),
geometry and inventory it refuses (§1.4).

Owns: the checks `read_adapter` runs on an AdapterView, in that order; `refusals` (the engine
refuses or misreads the file) apart from the dtype policy (it converts and runs).

Usage: `check_names(view, rest)`, ..., `check_dtypes(view, rest)`; `refuse(view, sentence)`.
"""

from __future__ import annotations

from gguf_trainer.model import slot_file
from gguf_trainer.model.adapter_inventory import view_expected
from gguf_trainer.model.adapter_view import (
    DETECTOR_TRAPS,
    EMBED_KEPT_TYPES,
    EMBED_TABLES,
    F32_NAMES,
    HEAD_DIM,
    LINEAR_TYPES,
    LLAMA_CPP_SUBSTRINGS,
    MING_MARKERS,
    PREFIX,
    TOKENIZER_JSON,
    AdapterView,
    Shape,
    block_size,
    ne_of,
    rest_name,
)


def _shape_matches(ne: tuple, want: Shape) -> bool:
    return len(ne) == len(want) and all(w is None or n == w for n, w in zip(ne, want))


def _fmt_shape(shape: Shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def refuse(view: AdapterView, sentence: str) -> None:
    view.problems.append(sentence)
    view.refusals.append(sentence)


def _collides(name: str) -> str | None:
    return next((s for s in LLAMA_CPP_SUBSTRINGS + DETECTOR_TRAPS if s in name), None)


def check_names(view: AdapterView, rest: dict) -> None:
    for name in view.tensors:
        hit = _collides(name)
        if hit:
            refuse(
                view,
                f"tensor {name} contains {hit!r}, which the engine's name conversion or "
                "student detector also matches; rename it (adapter tensors "
                "use blocks.N, not layers.N).",
            )
    n_other = sum(1 for n in view.tensors if rest_name(n) is None  # Ming's Ling vocabulary:
                  and not ("cap_query" in rest and n.endswith(TOKENIZER_JSON)))  # the engine's
    if n_other and rest:
        view.notes.append(
            f"{n_other} tensor(s) outside adapter.* are loaded but never used by the engine."
        )


def check_variant(view: AdapterView, rest: dict) -> None:
    if view.kind in slot_file.KINDS:  # the engine's own kinds, not a broken token-aligned file
        for sentence in slot_file.slot_metadata_problems(view.kind, view.metadata):
            refuse(view, sentence)
        if view.kind == "ming_image" and not any(n.endswith(TOKENIZER_JSON) for n in view.tensors):
            view.problems.append("the file carries no tokenizer_json, so the engine has no Ling "
                                 "vocabulary unless a tokenizer pack holds ling/tokenizer.json; "
                                 "re-export it with gguf-trainer's ming_image pack.")
        return
    ming = [m for m in MING_MARKERS if m in rest]
    if ming:
        refuse(
            view,
            f"adapter.{ming[0]} marks a ming_image adapter, which this engine reads as a broken "
            "token-aligned file; export a resampler or token-aligned adapter instead.",
        )
    if view.kind == "token_aligned" and any(n.startswith("t5_embed") for n in rest):
        refuse(
            view,
            "the file has a t5_embed seed table but no adapter.query, so the engine reads it as "
            "token-aligned and ignores the seeds; add the query tensor or drop the seed table.",
        )
    if view.kind == "token_aligned" and view.has_vis_in and not view.has_vision_proj:
        refuse(
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


def check_geometry(view: AdapterView, rest: dict) -> None:
    if view.width is not None and view.width % HEAD_DIM != 0:
        refuse(
            view,
            f"width {view.width} is not a multiple of {HEAD_DIM} (head_dim is fixed at "
            f"{HEAD_DIM}); "
            "retrain with a width such as 1024.",
        )
    if view.depth is None:
        refuse(
            view,
            "the file has no adapter.blocks.N tensors; the engine then "
            "expects 6 blocks and refuses it.",
        )
    vp, vi = ne_of(rest, "vision_proj.weight", 0), ne_of(rest, "vis_in.weight", 0)
    if vp is not None and vi is not None and vp != vi:
        refuse(
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
        refuse(
            view,
            f"out_dim {view.out_dim} is not a multiple of the layer_map length "
            f"{view.n_out_layers}, "
            "so the output cannot be n_layers x teacher_dim.",
        )


def check_inventory(view: AdapterView, rest: dict) -> None:
    expected = view_expected(view)
    for name, want in expected.items():
        if name not in rest:
            refuse(
                view,
                f"adapter.{name} is missing; the engine refuses a {view.kind} adapter without it.",
            )
        elif not _shape_matches(rest[name][0], want):
            refuse(
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


def check_dtypes(view: AdapterView, rest: dict) -> None:
    used = view_expected(view)
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
