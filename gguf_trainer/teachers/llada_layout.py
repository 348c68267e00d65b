"""The released `inclusionAI/LLaDA-Image-Turbo` snapshot layout, read from headers alone.

Owns: the config keys and weight names of `queryformer/` and `text_projection/` as the
release stores them, turning a config.json into constructor arguments (refusing what it cannot
build exactly), the expected tensor table for those arguments, the one sentence for a weight
file that does not match, and `check_snapshot`: every config.json, the safetensors headers of
queryformer/text_projection and the text encoder's weight index, checked in milliseconds with
no weight read and none of the snapshot's code imported. Must not: import torch or
transformers (the CLI's `materials` and the GUI's Materials run it), build modules.

Where the names come from (public ports that load the released files as stored):
* huggingface/diffusers `src/diffusers/models/transformers/transformer_llada_image.py` and
  sgl-project/sglang `python/sglang/multimodal_gen/runtime/models/dits/llada_image.py` (the same
  `LLaDAImageQueryFormerModel` / `LLaDAImageTextProjectionModel`). diffusers loads the two
  folders with `from_pretrained`, sglang with its `PlainStateDictComponentLoader`
  (`runtime/pipelines/llada_image.py`): the stored names are the module paths. QueryFormer:
  `meta_queries`, `query_blocks.N.cross_attn.{in_proj_weight,in_proj_bias,out_proj.weight,
  out_proj.bias}`, `query_blocks.N.mlp.{fc1,fc2}.{weight,bias}` (norm_q/norm_k/norm1 are
  LayerNorms without affine). TextProjection: `layers.N.self_attn.{q,k,v,out}_proj.{weight,
  bias}`, `layers.N.mlp.{fc1,fc2}.{weight,bias}`, `projector.{weight,bias}`; its per-head
  q_norm/k_norm and layer_norm1/2 are RMSNorm(elementwise_affine=False): no weight.
* Key renaming: the one map found, sglang's `configs/models/dits/llada_image.py`
  `param_names_mapping`, fuses the DiT's `attention.to_q/k/v` and `feed_forward.w1/w3`; it does
  not touch queryformer/ or text_projection/. No diffusers conversion script for LLaDA-Image
  was found.
* Config keys: the released `queryformer/config.json` (`LLaDAImageQueryFormerModel`: dropout,
  hidden_size, intermediate_size, norm_eps, num_attention_heads, num_hidden_layers,
  num_queries) and `text_projection/config.json` (`LLaDAImageTextProjectionModel`:
  attention_dropout, hidden_size, intermediate_size, norm_eps, num_attention_heads,
  num_hidden_layers, projection_dim), as copied in shine96/LLaDa-Image_ComfyUI
  `configs/{queryformer,text_projection,text_encoder}_config.json` and `configs/model_index.json`
  (257, 274, 1,504 and 659 bytes: the sizes the manifest below gives for the released files).
* No published tensor-name list of the released files was found. The published file list
  (T8mars/LLaDA-Image `manifests/llada-image-turbo.source.json`, Hub revision f4afc52d…) gives
  the sizes: queryformer 101,749,704 bytes = the bf16 bytes of exactly the tensors above for the
  released config (101,748,736) + a 968-byte header for 9 tensors; text_projection 652,457,384 =
  652,449,792 + 7,592 bytes of header (74 tensors; q/k norm weights would add 12 more). It also
  lists `text_encoder/model.safetensors.index.json` with 9 shards.

    report = check_snapshot(root, num_queries=256, out_dim=2560)   # UserError names the file
    args = read_config(folder, TEXT_PROJECTION)                     # constructor arguments
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gguf_trainer.base.errors import UserError

from .t5 import read_safetensors_header

WEIGHTS_FILE = "diffusion_pytorch_model.safetensors"
CONFIG_FILE = "config.json"
TE_INDEX = "model.safetensors.index.json"
AGAIN = "download the teacher snapshot again"


def _linear(out: dict, name: str, n_in: int, n_out: int) -> None:
    out[f"{name}.weight"], out[f"{name}.bias"] = (n_out, n_in), (n_out,)


def _queryformer_tensors(a: dict) -> dict[str, tuple[int, ...]]:
    h, inter = a["hidden_size"], a["intermediate_size"]
    out: dict[str, tuple[int, ...]] = {"meta_queries": (a["num_queries"], h)}
    for i in range(a["num_hidden_layers"]):
        p = f"query_blocks.{i}."
        out[p + "cross_attn.in_proj_weight"] = (3 * h, h)  # rows: q | k | v
        out[p + "cross_attn.in_proj_bias"] = (3 * h,)
        _linear(out, p + "cross_attn.out_proj", h, h)
        _linear(out, p + "mlp.fc1", h, inter)
        _linear(out, p + "mlp.fc2", inter, h)
    return out


def _text_projection_tensors(a: dict) -> dict[str, tuple[int, ...]]:
    h, inter = a["hidden_size"], a["intermediate_size"]
    out: dict[str, tuple[int, ...]] = {}
    for i in range(a["num_hidden_layers"]):
        p = f"layers.{i}."
        for k in ("q_proj", "k_proj", "v_proj", "out_proj"):
            _linear(out, p + "self_attn." + k, h, h)
        _linear(out, p + "mlp.fc1", h, inter)
        _linear(out, p + "mlp.fc2", inter, h)
    _linear(out, "projector", h, a["projection_dim"])
    return out


@dataclass(frozen=True)
class ModuleLayout:
    """One released component: its folder, diffusers class name, the config keys that shape
    it (all required, with `norm_eps`: a missing one is not guessed), those it may carry
    without effect, and {stored name: shape} for its constructor arguments."""

    folder: str
    class_name: str
    int_keys: tuple[str, ...]
    inert_keys: tuple[str, ...]  # dropout probabilities: inference never applies them
    tensors: Callable[[dict], dict[str, tuple[int, ...]]]


QUERYFORMER = ModuleLayout(
    "queryformer", "LLaDAImageQueryFormerModel",
    ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "num_queries"),
    ("dropout",), _queryformer_tensors)
TEXT_PROJECTION = ModuleLayout(
    "text_projection",
    "LLaDAImageTextProjectionModel",
    (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_hidden_layers",
        "projection_dim",
    ),
    ("attention_dropout",),
    _text_projection_tensors,
)
# gguf-trainer's own names before the release was matched: a config with these was written for
# a layout the release does not have.
OLD_KEYS = ("num_layers", "layer_norm_eps", "rms_norm_eps")


def read_json(path: Path) -> dict:
    """A JSON object, or UserError naming the file."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} is missing; {AGAIN}.") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{path} cannot be read as JSON ({e}); {AGAIN}.") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} is not a JSON object; {AGAIN}.")
    return value


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_config(folder, layout: ModuleLayout) -> dict:
    """Constructor arguments (the released keys: `num_hidden_layers`, `norm_eps`, ...) from
    `<folder>/config.json`. Refused, naming the file: another class, a missing or unknown key,
    a value that cannot be built."""
    path = Path(folder) / CONFIG_FILE
    raw = read_json(path)
    known = set(layout.int_keys) | set(layout.inert_keys) | {"norm_eps"}
    unknown = sorted(k for k in raw if not k.startswith("_") and k not in known)
    old = [k for k in unknown if k in OLD_KEYS]
    if old:
        raise UserError(
            f"{path} uses keys {old} of an older gguf-trainer layout, not the released "
            f"{layout.class_name} keys (num_hidden_layers, norm_eps); {AGAIN}."
        )
    if raw.get("_class_name") != layout.class_name:
        raise UserError(
            f"{path} describes {raw.get('_class_name')!r}, not the released "
            f"{layout.class_name}; {AGAIN}."
        )
    if unknown:  # a key we would not read may change the math: refuse rather than guess
        raise UserError(
            f"{path} has keys {unknown} that gguf-trainer's {layout.class_name} does not "
            f"build; this is not the released LLaDA-Image-Turbo layout."
        )
    missing = [k for k in (*layout.int_keys, "norm_eps") if k not in raw]
    if missing:
        raise UserError(f"{path} lacks {missing}; {AGAIN}.")
    bad = [k for k in layout.int_keys if not _is_int(raw[k]) or raw[k] < 1]
    eps = raw["norm_eps"]
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 < eps < 1:
        bad.append("norm_eps")
    if bad:
        raise UserError(
            f"{path} has unusable values for {bad} "
            f"({', '.join(f'{k}={raw[k]!r}' for k in bad)}); {AGAIN}."
        )
    if raw["hidden_size"] % raw["num_attention_heads"]:
        raise UserError(
            f"{path}: hidden_size {raw['hidden_size']} is not a multiple of "
            f"num_attention_heads {raw['num_attention_heads']}; {AGAIN}."
        )
    args = {k: raw[k] for k in layout.int_keys}
    args["norm_eps"] = float(eps)
    return args


def weights_mismatch(weights: Path, want: dict, have: dict) -> str | None:
    """The one sentence for a weight file whose {name: shape} table `have` is not exactly
    `want` (missing and unexpected names, or shapes), or None when it matches."""
    missing, unexpected = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    if missing or unexpected:

        def names(keys):
            shown = ", ".join(keys[:6]) + (f", … ({len(keys)} in all)" if len(keys) > 6 else "")
            return f"[{shown}]" if keys else "none"

        return (
            f"{weights} does not match its config.json (the released layout): missing "
            f"{names(missing)}, unexpected {names(unexpected)}; {AGAIN}."
        )
    bad = [
        f"{k} {tuple(have[k])} != {want[k]}"
        for k in sorted(want)
        if tuple(have[k]) != tuple(want[k])
    ]
    if bad:
        return (
            f"{weights} has tensors whose shapes differ from its config.json "
            f"({'; '.join(bad[:4])}); {AGAIN}."
        )
    return None


def _stored_bytes(table: dict) -> int:
    return sum(int(t["data_offsets"][1]) - int(t["data_offsets"][0]) for t in table.values())


def _module(root: Path, layout: ModuleLayout) -> tuple[dict, int]:
    folder = root / layout.folder
    args = read_config(folder, layout)
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise UserError(f"{weights} is missing; {AGAIN}.")
    table = read_safetensors_header(weights)
    problem = weights_mismatch(
        weights, layout.tensors(args), {k: t["shape"] for k, t in table.items()}
    )
    if problem:
        raise UserError(problem)
    return args, _stored_bytes(table)


def _text_encoder(te: Path) -> tuple[dict, int, int]:
    """(config, stored bytes, shard count): the config names remote code that is present, and
    every weight file the index names is there and complete (headers only)."""
    config = read_json(te / CONFIG_FILE)
    ref = (
        (config.get("auto_map") or {}).get("AutoModel")
        if isinstance(config.get("auto_map"), dict)
        else None
    )
    if not isinstance(ref, str) or "." not in ref:
        raise UserError(
            f"{te / CONFIG_FILE} has no auto_map.AutoModel entry; this is not the "
            "LLaDA2-MoE text encoder gguf-trainer supports."
        )
    code = te / (ref.rsplit(".", 1)[0].split("--")[-1] + ".py")
    if not code.is_file():
        raise UserError(f"{code} is missing (named by auto_map in {te / CONFIG_FILE}); {AGAIN}.")
    if not _is_int(config.get("hidden_size")):
        raise UserError(f"{te / CONFIG_FILE} has no integer hidden_size; {AGAIN}.")
    index = te / TE_INDEX
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise UserError(f"{index} has no weight_map; {AGAIN}.")
        files = sorted(set(weight_map.values()))
        for name in files:
            if not (te / name).is_file():
                raise UserError(
                    f"{te / name} is missing ({TE_INDEX} names it as a shard of the "
                    "text encoder); run the download again (it resumes)."
                )
    else:
        files = sorted(p.name for p in te.glob("*.safetensors"))
        if not files:
            raise UserError(f"{te} has no *.safetensors weights; {AGAIN}.")
    stored = sum(_stored_bytes(read_safetensors_header(te / name)) for name in files)
    return config, stored, len(files)


@dataclass(frozen=True)
class SnapshotReport:
    root: Path
    hidden_size: int
    te_layers: int | None
    te_shards: int
    queryformer: dict
    text_projection: dict
    weight_bytes: int  # stored tensor bytes of text_encoder + queryformer + text_projection

    def summary(self) -> str:
        qf, tp = self.queryformer, self.text_projection
        layers = f"{self.te_layers} layers, " if self.te_layers else ""
        return (
            f"LLaDA-Image teacher: text encoder hidden {self.hidden_size} "
            f"({layers}{self.te_shards} "
            f"weight file(s)), QueryFormer {qf['num_hidden_layers']} block(s) x "
            f"{qf['num_queries']} "
            f"queries, TextProjection {tp['num_hidden_layers']} layer(s) -> "
            f"{tp['projection_dim']}; "
            f"{self.weight_bytes / 1024**3:.2f} GiB of stored weights"
        )


def check_snapshot(
    root, num_queries: int | None = None, out_dim: int | None = None
) -> SnapshotReport:
    """The snapshot as the loader will read it, from config.json files and safetensors headers
    only; UserError naming the file and the reason for the first thing that would fail.
    `num_queries`/`out_dim`: what the pack's targets need (None: not checked)."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(
            f"the LLaDA-Image teacher snapshot {root} does not exist; download it or set "
            "materials.teacher.path."
        )
    missing = [
        p
        for p in ("text_encoder", QUERYFORMER.folder, TEXT_PROJECTION.folder, "tokenizer")
        if not (root / p).is_dir()
    ]
    if missing:
        raise UserError(
            f"the LLaDA-Image teacher at {root} is incomplete (missing {', '.join(missing)}/); "
            f"{AGAIN}."
        )
    if not any(
        (root / "tokenizer" / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")
    ):
        raise UserError(f"{root / 'tokenizer'} has no tokenizer.json; {AGAIN}.")
    te_config, te_bytes, shards = _text_encoder(root / "text_encoder")
    qf, qf_bytes = _module(root, QUERYFORMER)
    tp, tp_bytes = _module(root, TEXT_PROJECTION)
    hidden = te_config["hidden_size"]
    for layout, args in ((QUERYFORMER, qf), (TEXT_PROJECTION, tp)):
        if args["hidden_size"] != hidden:
            raise UserError(
                f"{root / layout.folder / CONFIG_FILE} has hidden_size {args['hidden_size']} "
                f"but {root / 'text_encoder' / CONFIG_FILE} has {hidden}: the parts come from "
                f"different models; {AGAIN}."
            )
    if num_queries is not None and qf["num_queries"] != num_queries:
        raise UserError(
            f"{root / QUERYFORMER.folder / CONFIG_FILE} has num_queries {qf['num_queries']}; "
            f"this pack's targets are {num_queries} rows per prompt (LLaDA-Image-Turbo)."
        )
    if out_dim is not None and tp["projection_dim"] != out_dim:
        raise UserError(
            f"{root / TEXT_PROJECTION.folder / CONFIG_FILE} has projection_dim "
            f"{tp['projection_dim']}; this pack's targets are {out_dim} wide (LLaDA-Image-Turbo)."
        )
    layers = te_config.get("num_hidden_layers")
    return SnapshotReport(
        root,
        hidden,
        layers if _is_int(layers) else None,
        shards,
        qf,
        tp,
        te_bytes + qf_bytes + tp_bytes,
    )
