"""The released inclusionAI/Ming-Image-0.1-Design snapshot, read into teachers/ming.py's
MingTextEncoder under the names ggk 0.9.7's MingImageTextRunner reads (ming_image_te.hpp, `T:`).

The release keeps the text encoder in three folders (the model's own loader,
modeling_bailingmm2.py BailingMM2NativeForConditionalGeneration.from_pretrained and
load_image_gen_modules):

  mllm/       config.json {"llm_config": Ling-mini-2.0's BailingMoeV2 keys, "vision_config": the
              Qwen2.5-VL tower's, "mlp_depth"}, model-*.safetensors + model.safetensors.index.json:
              model.model.word_embeddings.weight, model.model.layers.N.*, model.model.norm.weight,
              model.lm_head.weight, vision.*, linear_proj.{0,2}.*
  connector/  a Qwen2 causal LM (AutoModelForCausalLM, subfolder "connector"): config.json,
              model.layers.N.*, model.norm.weight (+ model.embed_tokens, lm_head: unused)
  mlp/        config.json (img_gen_scales, diffusion_c_input_dim, diffusion_inner_dim,
              selected_hidden_states_layers, connector_norm, use_* switches), model.safetensors:
              query_tokens_dict.16x16, proj_in.*, proj_out.*, proj_directvlm.{0,1}.*, mlp.* (the
              DiT side's, unused)

A Bailing layer's names are the model's own (modeling_bailing_moe_v2.py): attention.
{query_key_value, dense, q_norm, k_norm}, input_layernorm, post_attention_layernorm; layer 0's
dense mlp.{gate,up,down}_proj; a MoE layer's mlp.gate.{weight, expert_bias}, mlp.image_gate.*,
mlp.audio_gate.* (unused: no audio), mlp.experts.E.{gate,up,down}_proj.weight and
mlp.shared_experts.*. The engine's names differ in four places, mapped here: embed_tokens for
word_embeddings, thinker./connector. for model.model./model., `gate.proj.weight` for the router
weight (T:404-405), and the experts fused per layer as `experts.gate_up_proj.weight` [E, 2I, H]
(gate rows first: ggml_swiglu's order) and `experts.down_proj.weight` [E, H, I] (T:381-384).

    cfg = released_config(root)                     # MingConfig from the three config.json
    state = released_state(root, cfg)               # {engine name: tensor}
    table = released_embed_table(root)              # the Ling table (the seed PCA)
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from gguf_trainer.base.errors import UserError

log = logging.getLogger(__name__)

MLLM, CONNECTOR, MLP = "mllm", "connector", "mlp"
EMBED = "model.model.word_embeddings.weight"
# The values ggk 0.9.7 hard-codes instead of reading them (T:160-179, llm.hpp 256-269): a release
# whose config says otherwise is read as its config says, and the engine differs (logged).
ENGINE_FIXED = {"n_group": 8, "topk_group": 4, "top_k": 8, "routed_scaling": 2.5,
                "rope_theta": 600000.0, "eps": 1e-6, "conn_theta": 1000000.0}
_LAYER = re.compile(r"model\.model\.layers\.(\d+)\.(.+)")
_SKIP_MLLM = ("model.lm_head.", "vision.", "linear_proj.")


def is_released(root: Path) -> bool:
    return (Path(root) / MLLM / "config.json").is_file()


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} is missing; download the teacher snapshot again.") from None
    except ValueError:
        raise UserError(f"{path} is not JSON; download the teacher snapshot again.") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a config object; download the teacher again.")
    return data


def released_config(root: Path):
    """MingConfig of a released snapshot; one sentence for what the engine cannot run."""
    from gguf_trainer.teachers.ming import MingConfig

    root = Path(root)
    llm = _json(root / MLLM / "config.json").get("llm_config")
    conn = _json(root / CONNECTOR / "config.json")
    mlp = _json(root / MLP / "config.json")
    if not isinstance(llm, dict):
        raise UserError(f"{root / MLLM / 'config.json'} has no llm_config; download the "
                        "teacher again.")
    scales = mlp.get("img_gen_scales", [4, 8, 16])  # the model's own default
    layers = mlp.get("selected_hidden_states_layers")
    try:
        n_layers = int(llm["num_hidden_layers"])
        if len(scales) != 1:
            raise UserError(f"{root / MLP / 'config.json'} has img_gen_scales {scales}; the "
                            "engine runs one query scale (16x16).")
        if not (mlp.get("use_vlm_directvlm_condition") and
                mlp.get("use_learnable_token_condition", True)):
            raise UserError(f"{root / MLP / 'config.json'} turns off a conditioning stream; the "
                            "engine needs both the caption and the directvlm rows.")
        if not layers or layers[-1] != n_layers or len(layers) not in (1, 3):
            raise UserError(f"{root / MLP / 'config.json'}: selected_hidden_states_layers "
                            f"{layers} must end at the final norm ({n_layers}) with 1 or 3 "
                            "states, as the engine reads them.")
        if float(llm.get("partial_rotary_factor", 0.5)) != 0.5:
            raise UserError(f"{root / MLP / 'config.json'}: the engine rotates half of each "
                            "head (partial_rotary_factor 0.5).")
        if llm.get("use_qkv_bias") or llm.get("use_bias"):
            raise UserError(f"{root / MLLM / 'config.json'}: the engine's Bailing attention has "
                            "no biases (use_qkv_bias / use_bias).")
        heads = int(llm["num_attention_heads"])
        cfg = MingConfig(
            hidden=int(llm["hidden_size"]), intermediate=int(llm["intermediate_size"]),
            moe_intermediate=int(llm["moe_intermediate_size"]), layers=n_layers, heads=heads,
            kv_heads=int(llm["num_key_value_heads"]),
            head_dim=int(llm.get("head_dim") or int(llm["hidden_size"]) // heads),
            experts=int(llm["num_experts"]), shared_experts=int(llm.get("num_shared_experts", 0)),
            first_dense=int(llm.get("first_k_dense_replace", 0)), vocab=int(llm["vocab_size"]),
            n_group=int(llm["n_group"]), topk_group=int(llm["topk_group"]),
            top_k=int(llm["num_experts_per_tok"]),
            routed_scaling=float(llm["routed_scaling_factor"]),
            rope_theta=float(llm["rope_theta"]), eps=float(llm["rms_norm_eps"]),
            conn_hidden=int(conn["hidden_size"]), conn_layers=int(conn["num_hidden_layers"]),
            conn_heads=int(conn["num_attention_heads"]),
            conn_kv_heads=int(conn["num_key_value_heads"]),
            conn_intermediate=int(conn["intermediate_size"]),
            conn_head_dim=int(conn.get("head_dim") or int(conn["hidden_size"])
                              // int(conn["num_attention_heads"])),
            conn_theta=float(conn.get("rope_theta", 1000000.0)),
            num_queries=int(scales[0]) ** 2, caption_dim=int(mlp["diffusion_c_input_dim"]),
            diffusion_dim=int(mlp["diffusion_inner_dim"]),
            direct_states=tuple(int(i) for i in layers[:-1]),
            caption_l2=bool(mlp.get("connector_norm", True)))  # the model's own default
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{root}: the Ming-Image configs lack or garble {e}; download the "
                        "teacher again.") from None
    differ = {k: getattr(cfg, k) for k, v in ENGINE_FIXED.items() if getattr(cfg, k) != v}
    if differ:
        log.warning("the released config sets %s where ggk 0.9.7 hard-codes %s: targets follow "
                    "the config", differ, {k: ENGINE_FIXED[k] for k in differ})
    if cfg.caption_l2:
        log.warning("mlp/config.json sets connector_norm: the caption targets are L2-normalised "
                    "as the model's own code does; ggk 0.9.7's full text encoder does not")
    return cfg


def weight_map(folder: Path) -> dict[str, str]:
    """{tensor name: file} of one component folder: its model.safetensors.index.json, else
    its single model.safetensors."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        wmap = _json(index).get("weight_map")
        if not isinstance(wmap, dict):
            raise UserError(f"{index} is not a weight index; download the teacher again.")
        for name in set(wmap.values()):
            if not (folder / name).is_file():
                raise UserError(f"{folder / name} is missing (named by {index.name}); download "
                                "the teacher again.")
        return dict(wmap)
    single = folder / "model.safetensors"
    if not single.is_file():
        raise UserError(f"{folder} holds no model.safetensors; download the teacher again.")
    with safe_open(str(single), "pt") as f:
        return dict.fromkeys(f.keys(), single.name)


def _read(folder: Path, names: dict[str, str]) -> dict:
    """{source name: tensor} of the names `names` maps to files, one file open at a time."""
    from safetensors import safe_open

    out = {}
    for file in sorted(set(names.values())):
        with safe_open(str(folder / file), "pt") as f:
            for name, where in names.items():
                if where == file:
                    out[name] = f.get_tensor(name)
    return out


def mllm_name(name: str) -> str | None:
    """The engine's name of one mllm/ tensor (None: not the text encoder's, or an expert,
    which released_state fuses)."""
    if name == EMBED:
        return "thinker.embed_tokens.weight"
    if name == "model.model.norm.weight":
        return "thinker.norm.weight"
    m = _LAYER.fullmatch(name)
    if m is None or name.startswith(_SKIP_MLLM):
        return None
    layer, rest = m.groups()
    if rest.startswith(("mlp.audio_gate.", "mlp.experts.")):
        return None
    for gate in ("gate", "image_gate"):
        if rest == f"mlp.{gate}.weight":
            rest = f"mlp.{gate}.proj.weight"
    return f"thinker.layers.{layer}.{rest}"


def connector_name(name: str) -> str | None:
    stem = name.removeprefix("model.")
    if stem.startswith("layers.") or stem == "norm.weight":
        return "connector." + stem
    return None  # embed_tokens, lm_head: the connector runs on embeddings


def mlp_name(name: str, num_queries: int) -> str | None:
    side = round(num_queries ** 0.5)
    if name == f"query_tokens_dict.{side}x{side}":
        return "query_tokens"
    if name.startswith(("proj_in.", "proj_out.", "proj_directvlm.")):
        return name
    return None  # mlp.*: the DiT side's


class ReleasedWeights:
    """The text encoder's tensors of a released snapshot, read from its shards in parts: the
    resident ones (table, norms, query tokens, projections) and one thinker or connector layer
    at a time, so a teacher that streams its layers (teachers/ming_stream.py) holds one layer
    beside the resident ones. Only the safetensors headers are read up front."""

    def __init__(self, root: Path, cfg):
        self.root, self.cfg = Path(root), cfg
        self.maps = {c: weight_map(self.root / c) for c in (MLLM, CONNECTOR, MLP)}
        name_of = {MLLM: mllm_name, CONNECTOR: connector_name,
                   MLP: lambda n: mlp_name(n, cfg.num_queries)}
        # {(component, engine name): source name} of every tensor read as stored
        self.plain = {(c, name_of[c](n)): n for c, wmap in self.maps.items() for n in wmap
                      if name_of[c](n) is not None}

    def _get(self, parts: dict, dtype, device) -> dict:
        """{engine name: tensor} of {engine name: (component, source name)}, one file open at
        a time, each tensor cast and moved as it is read."""
        from safetensors import safe_open

        out = {}
        by_file = {}
        for name, (comp, src) in parts.items():
            by_file.setdefault((comp, self.maps[comp][src]), []).append((name, src))
        for (comp, file), names in sorted(by_file.items()):
            with safe_open(str(self.root / comp / file), "pt") as f:
                for name, src in names:
                    out[name] = _cast(f.get_tensor(src), dtype, device)
        return out

    def resident(self, dtype=None, device="cpu") -> dict:
        """{engine name: tensor} of everything outside thinker.layers.N / connector.layers.N."""
        return self._get({n: (c, src) for (c, n), src in self.plain.items()
                          if not n.startswith(("thinker.layers.", "connector.layers."))},
                         dtype, device)

    def layer(self, stack: str, i: int, dtype=None, device="cpu") -> dict:
        """{name inside the layer: tensor} of `stack` ("thinker" or "connector") layer `i`;
        a thinker MoE layer's experts fused as the engine reads them."""
        pre, comp = f"{stack}.layers.{i}.", MLLM if stack == "thinker" else CONNECTOR
        got = self._get({n: (c, src) for (c, n), src in self.plain.items()
                         if c == comp and n.startswith(pre)}, dtype, device)
        out = {n.removeprefix(pre): t for n, t in got.items()}
        if stack == "thinker" and i >= self.cfg.first_dense:
            out.update(self._experts(i, dtype, device))
        return out

    def _experts(self, layer: int, dtype, device) -> dict:
        """gate_up (E, 2I, H), gate rows first, and down (E, H, I) of one layer, each expert
        copied into the fused tensor as it is read (no second copy of the bank)."""
        import torch
        from safetensors import safe_open

        cfg, folder, wmap = self.cfg, self.root / MLLM, self.maps[MLLM]
        pre = f"model.model.layers.{layer}.mlp.experts."
        need = [f"{pre}{e}.{p}.weight" for e in range(cfg.experts)
                for p in ("gate_proj", "up_proj", "down_proj")]
        lost = next((n for n in need if n not in wmap), None)
        if lost is not None:
            raise UserError(f"{folder} lacks {lost}; download the teacher again.")
        e, i, h = cfg.experts, cfg.moe_intermediate, cfg.hidden
        files = {wmap[n] for n in need}
        gate_up = down = None
        for file in sorted(files):
            with safe_open(str(folder / file), "pt") as f:
                for n in need:
                    if wmap[n] != file:
                        continue
                    t = f.get_tensor(n)
                    if gate_up is None:
                        kw = {"dtype": dtype or t.dtype, "device": device}
                        gate_up, down = torch.empty(e, 2 * i, h, **kw), torch.empty(e, h, i, **kw)
                    k, part = n[len(pre):].split(".", 1)
                    k = int(k)
                    dst = {"gate_proj.weight": gate_up[k, :i], "up_proj.weight": gate_up[k, i:],
                           "down_proj.weight": down[k]}[part]
                    if tuple(t.shape) != tuple(dst.shape):
                        raise UserError(f"{folder}: {n} is {tuple(t.shape)}, not the config's "
                                        f"{tuple(dst.shape)}; download the teacher again.")
                    dst.copy_(t)
        return {"mlp.experts.gate_up_proj.weight": gate_up, "mlp.experts.down_proj.weight": down}

    def layer_shapes(self, stack: str, i: int) -> dict:
        """{name inside the layer: shape} from the headers (the experts' fused shapes as the
        config gives them; `_experts` checks each expert against them when it reads)."""
        from safetensors import safe_open

        pre, comp = f"{stack}.layers.{i}.", MLLM if stack == "thinker" else CONNECTOR
        by_file, out = {}, {}
        for (c, n), src in self.plain.items():
            if c == comp and n.startswith(pre):
                by_file.setdefault(self.maps[c][src], []).append((n, src))
        for file, names in sorted(by_file.items()):
            with safe_open(str(self.root / comp / file), "pt") as f:
                for n, src in names:
                    out[n.removeprefix(pre)] = tuple(f.get_slice(src).get_shape())
        if stack == "thinker" and i >= self.cfg.first_dense:
            ex = f"model.model.layers.{i}.mlp.experts."
            lost = next((n for e in range(self.cfg.experts)
                         for p in ("gate_proj", "up_proj", "down_proj")
                         if (n := f"{ex}{e}.{p}.weight") not in self.maps[MLLM]), None)
            if lost is not None:
                raise UserError(f"{self.root / MLLM} lacks {lost}; download the teacher again.")
            e, inner, h = self.cfg.experts, self.cfg.moe_intermediate, self.cfg.hidden
            out["mlp.experts.gate_up_proj.weight"] = (e, 2 * inner, h)
            out["mlp.experts.down_proj.weight"] = (e, h, inner)
        return out


def streamed_bytes(root: Path, cfg) -> int:
    """What the streamed teacher (ming_stream.py) holds in RAM, from the headers: the tensors
    it keeps resident plus its largest layer (the experts fused as read), in the dtype it runs
    in. The shards' other tensors (the vision tower, the DiT's) it never reads."""
    import math

    from safetensors import safe_open

    weights, by_file, numel = ReleasedWeights(root, cfg), {}, 0
    for (comp, name), src in weights.plain.items():
        if not name.startswith(("thinker.layers.", "connector.layers.")):
            by_file.setdefault((comp, weights.maps[comp][src]), []).append(src)
    for (comp, file), names in sorted(by_file.items()):
        with safe_open(str(Path(root) / comp / file), "pt") as f:
            numel += sum(math.prod(f.get_slice(src).get_shape()) for src in names)
    layers = [sum(math.prod(s) for s in weights.layer_shapes(stack, i).values())
              for stack, n in (("thinker", cfg.layers), ("connector", cfg.conn_layers))
              for i in range(n)]
    return (numel + max(layers, default=0)) * stored_dtype(root).itemsize


def _cast(t, dtype, device):
    return t.to(device=device, dtype=dtype or t.dtype)


def released_state(root: Path, cfg, dtype=None) -> dict:
    """{engine name: tensor} of the whole text encoder, experts fused per layer; `dtype` casts
    (ReleasedWeights' parts put together: the streamed teacher reads the very same tensors)."""
    weights = ReleasedWeights(root, cfg)
    state = weights.resident(dtype)
    for stack, n in (("thinker", cfg.layers), ("connector", cfg.conn_layers)):
        for i in range(n):
            state.update({f"{stack}.layers.{i}.{k}": t
                          for k, t in weights.layer(stack, i, dtype).items()})
    return state


def released_embed_table(root: Path):
    """The Ling embedding table (vocab, hidden) as stored, read alone."""
    folder = Path(root) / MLLM
    wmap = weight_map(folder)
    if EMBED not in wmap:
        raise UserError(f"{folder} has no {EMBED}; download the teacher again.")
    return _read(folder, {EMBED: wmap[EMBED]})[EMBED]


def stored_dtype(root: Path):
    """The dtype the text encoder runs in: float32 when the thinker's table is stored so,
    else bfloat16 (the release's own; 16B parameters)."""
    import torch
    from safetensors import safe_open

    folder = Path(root) / MLLM
    wmap = weight_map(folder)
    with safe_open(str(folder / wmap[EMBED]), "pt") as f:
        dt = f.get_slice(EMBED).get_dtype()
    return torch.float32 if dt in ("F32", "F64") else torch.bfloat16
