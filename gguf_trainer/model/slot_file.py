"""What the engine reads from a slot-resampler adapter file (slot_resampler.py has the module):
which kind, its geometry, the tensors it declares, the families it serves. adapter_file.py
reads every file and asks here when `slot_query` is in it. Like adapter_file, never imports
torch.

Detection and sizes are the engine's (ggk 0.9.7 llm_adapter.hpp): `cap_query` selects Ming-Image
(MingAdapterConfig::present 481-483, detect_from_weights 485-530), `slot_query` without it the
Qwen3.5 bridge (Qwen35BridgeConfig::present 693-696, detect_from_weights 698-750), whose bank is
on only when `out_bank` is there (737-740) and token-aligned when `bank_in` is (721-722).

    kind = slot_kind(rest); g = slot_geometry(kind, rest); want = slot_tensors(kind, g)
"""

from __future__ import annotations

KINDS = ("ming_image", "qwen35_bridge")
TRAINABLE = ("qwen35_bridge", "ming_image")  # the slot kinds gguf-trainer builds
# The slot kinds' f32 parameters (init_params, llm_adapter.hpp 540-541, 759-762).
F32_QUERIES = ("slot_query", "bank_query", "cap_query")
QWEN35_PRE = "qwen35"  # tokenizer.ggml.pre the engine requires of the bridge's vocabulary


def slot_kind(rest: dict) -> str | None:
    """"ming_image", "qwen35_bridge" or None (not a slot file), as the engine picks."""
    if "cap_query" in rest:
        return "ming_image"
    if "slot_query" in rest:
        return "qwen35_bridge"
    return None


def _ne(rest, name, axis):
    info = rest.get(name)
    return info[0][axis] if info is not None and len(info[0]) == 2 else None


def slot_geometry(kind: str, rest: dict) -> dict:
    """The AdapterView fields the engine's detect_from_weights reads (None: tensor absent)."""
    lead = "cap_query" if kind == "ming_image" else "bank_query"
    head = "out_cap" if kind == "ming_image" else "out_bank"
    g = {
        "width": _ne(rest, lead if kind == "ming_image" else "slot_query", 0),
        "num_queries": _ne(rest, "slot_query", 1),  # max_slots
        "in_dim": _ne(rest, "in_proj.weight", 0),
        "embed_rank": _ne(rest, "seed_embed.weight", 0),
        "t5_vocab": _ne(rest, "seed_embed.weight", 1),
        "vis_dim": _ne(rest, "vis_in.weight", 0),
        "out_dim": _ne(rest, "out_proj.weight", 1),
        "mlp_hidden": _ne(rest, "blocks.0.mlp.0.weight", 1),
        "bank_dim": _ne(rest, head + ".weight", 1) or 0,
        "n_bank": _ne(rest, lead, 1) or 0,
        "bank_align": "bank_in.weight" in rest,
    }
    if kind == "qwen35_bridge" and not g["bank_dim"]:  # 737-740: no out_bank, no bank
        g["n_bank"], g["bank_align"] = 0, False
    return g


def slot_tensors(kind: str, g: dict) -> dict[str, tuple]:
    """Every tensor the engine declares for this kind except blocks.N (ne order; None sizes
    are not compared)."""
    w, ind, vis, r, v = g["width"], g["in_dim"], g["vis_dim"], g["embed_rank"], g["t5_vocab"]
    t: dict[str, tuple] = {"slot_query": (w, g["num_queries"])}
    if kind == "ming_image":
        t["cap_query"] = (w, g["n_bank"])
    elif g["n_bank"]:
        t["bank_query"] = (w, g["n_bank"])
    t["seed_embed.weight"] = (r, v)
    t["seed_proj.weight"] = (r, w)
    t["vis_q.weight"] = (vis, w)
    t["in_proj.weight"] = (ind, w)
    t["in_proj.bias"] = (w,)
    t["vis_in.weight"] = (vis, w)
    t["ln_out.weight"] = (w,)
    t["ln_out.bias"] = (w,)
    if kind == "ming_image" or g["n_bank"]:
        head = "out_cap" if kind == "ming_image" else "out_bank"
        t[head + ".weight"] = (w, g["bank_dim"])
        t[head + ".bias"] = (g["bank_dim"],)
    if kind == "qwen35_bridge" and g["n_bank"] and g["bank_align"]:
        t["bank_in.weight"] = (ind, w)
    t["out_proj.weight"] = (w, g["out_dim"])
    t["out_proj.bias"] = (g["out_dim"],)
    return t


def slot_families(kind: str, g: dict) -> list[str]:
    """The ggk 0.9.7 families this file conditions (engine-families rows 19-21)."""
    if kind == "ming_image":
        return ["Ming-Image", "Ming-Image Layer"]
    return ["MOSS-Image"] + (["FLUX.3 Klein (bank head)"] if g.get("n_bank") else [])


def slot_metadata_problems(kind: str, metadata: dict) -> list[str]:
    """The vocabulary the engine needs in the file: the bridge's Qwen3.5 tokens and merges with
    tokenizer.ggml.pre "qwen35" (gk-diffuser.cpp 1236-1277: otherwise MOSS-Image needs the 9B's
    GGUF or a tokenizer pack, and FLUX.3 refuses the file as a source)."""
    if kind != "qwen35_bridge":
        return []
    p = []
    if not metadata.get("tokenizer.ggml.tokens") or not metadata.get("tokenizer.ggml.merges"):
        p.append(
            "the file carries no tokenizer.ggml.tokens / merges, so the engine has no Qwen3.5 "
            "vocabulary for the slots; re-export it with gguf-trainer's qwen35_bridge pack."
        )
    elif metadata.get("tokenizer.ggml.pre") != QWEN35_PRE:
        p.append(
            f"tokenizer.ggml.pre is {metadata.get('tokenizer.ggml.pre')!r}, not 'qwen35', so the "
            "engine does not take the file's vocabulary; re-export it."
        )
    return p
