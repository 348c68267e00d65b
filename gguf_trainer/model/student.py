"""The pig_clip student: a Qwen3 text stack read from GGUF and run as the ggk engine runs it.

Owns: reading a student GGUF (HF or llama.cpp tensor names, any ggml type) into float32
arrays, deriving the Qwen3 config from shapes as the engine does (engine-contract §3.1,
§5.1), building a frozen transformers `Qwen3Model` from them, loading the student tokenizer
and batching id lists. The ids themselves are the engine's: its Qwen2 BPE port
(engine/qwen_bpe.py) over a pack's template pieces (`pack.student_ids`, engine/template_ids.py),
never the Hugging Face tokenizer's joined-string path.
Must not: know about projects, packs or adapters, or reimplement the Qwen3 forward
(transformers' Qwen3Model with the engine's config computes the same function).

Usage:
    student = load_student("pig_clip-f16.gguf", tokenizer_dir)
    ids = pack.student_ids(engine_bpe(student.tokenizer).encode, Sample("a cat"))
    ids, keep = pad_batch([ids])
    states = student.hidden(ids, keep)  # (B, L, 1024) final-RMSNorm output
"""

from __future__ import annotations

import functools
import logging
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import transformers
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.gguf_read import GGUFFile, read_gguf
from gguf_trainer.engine.qwen_ids import PAD_ID

log = logging.getLogger(__name__)

HEAD_DIM = 128  # fixed by the engine, whatever the file says
ROPE_THETA = 1_000_000.0
RMS_EPS = 1e-6
MAX_POSITIONS = 40960  # Qwen3-0.6B's config; the engine itself has no limit
SHIPPED_FILE = "pig_clip-f16.gguf"

# llama.cpp names -> HF names without "model." (engine-contract §5.1). Dicts, not code.
LLAMACPP_GLOBAL = {"token_embd.weight": "embed_tokens.weight", "output_norm.weight": "norm.weight"}
LLAMACPP_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
IGNORED_NAMES = ("output.weight", "lm_head.weight", "model.lm_head.weight")  # tied embeddings
LAYER_PARTS = tuple(f"{part}.weight" for part in LLAMACPP_LAYER.values())
_BLK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_LAYER = re.compile(r"layers\.(\d+)\.")


# ---------------------------------------------------------------- reading the GGUF


def _open_reader(path: Path) -> GGUFFile:
    if not path.is_file():
        raise UserError(f"{path} does not exist; choose {SHIPPED_FILE} in Setup → Student.")
    # Bounded (every count checked against the file: a short, garbled or truncated file is
    # "truncated or not a GGUF file; re-download ...") and fast on the file's vocabulary.
    return read_gguf(path, fix=f"re-download {SHIPPED_FILE}")


def hf_name(gguf_name: str) -> str | None:
    """The HF state-dict name (without "model.") for a student tensor name, or None if the
    name is not part of the Qwen3 text stack."""
    if gguf_name.startswith("model."):
        return gguf_name[len("model.") :]
    if gguf_name in LLAMACPP_GLOBAL:
        return LLAMACPP_GLOBAL[gguf_name]
    match = _BLK.fullmatch(gguf_name)
    if match and match.group(2) in LLAMACPP_LAYER:
        index, part, kind = match.groups()
        return f"layers.{index}.{LLAMACPP_LAYER[part]}.{kind}"
    return None


def _dequantized(tensor, path: Path) -> np.ndarray:
    """float32 array in torch shape order (GGUF ne reversed), owned by us (not the mmap)."""
    shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
    if tensor.tensor_type == GGMLQuantizationType.F32:
        return np.array(tensor.data, dtype=np.float32).reshape(shape)
    try:
        values = dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError:  # gguf has no numpy decoder for some IQ types
        raise UserError(
            f"{path}: tensor {tensor.name} has type {tensor.tensor_type.name}, which this trainer "
            f"cannot read; use {SHIPPED_FILE}."
        ) from None
    return values.astype(np.float32, copy=False).reshape(shape)


def _file_dtype(shapes_types: list[tuple[int, int, str]]) -> str:
    """The dominant type among 2-D weights: most tensors, ties broken by most elements."""
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for ndim, size, type_name in shapes_types:
        if ndim == 2:
            counts[type_name] += 1
            sizes[type_name] += size
    if not counts:
        return "none"
    return max(counts, key=lambda t: (counts[t], sizes[t]))


def read_student_tensors(path) -> tuple[dict[str, np.ndarray], dict]:
    """Read a pig_clip GGUF into {HF name without "model.": float32 array}, plus an info dict
    {"file_dtype", "tensor_types", "n_tensors"}. Refuses files that are not a Qwen3 stack."""
    path = Path(path)
    reader = _open_reader(path)
    tensors: dict[str, np.ndarray] = {}
    unknown: list[str] = []
    kinds: list[tuple[int, int, str]] = []
    for tensor in reader.tensors:
        kinds.append((len(tensor.shape), int(tensor.n_elements), tensor.tensor_type.name))
        if tensor.name in IGNORED_NAMES:
            continue
        name = hf_name(tensor.name)
        if name is None:
            unknown.append(tensor.name)
            continue
        tensors[name] = _dequantized(tensor, path)
    if unknown:
        log.warning("%s: ignoring %d tensors that are not part of the Qwen3 stack (%s)",
                    path, len(unknown), ", ".join(unknown[:5]))
    _check_layout(tensors, path)
    info = {
        "file_dtype": _file_dtype(kinds),
        "tensor_types": dict(Counter(kind[2] for kind in kinds)),
        "n_tensors": len(reader.tensors),
    }
    return tensors, info


def read_embed_table(path) -> np.ndarray:
    """Only the student's token embedding table (vocab, hidden) as float32 (vision_proj fit)."""
    path = Path(path)
    for tensor in _open_reader(path).tensors:
        if hf_name(tensor.name) == "embed_tokens.weight":
            return _dequantized(tensor, path)
    raise UserError(f"{path} has no model.embed_tokens.weight or token_embd.weight, so it is not a "
                    f"Qwen3 (pig_clip) student; choose {SHIPPED_FILE}.")


def _check_layout(tensors: dict[str, np.ndarray], path: Path) -> None:
    if "embed_tokens.weight" not in tensors:
        raise UserError(
            f"{path} is not a Qwen3 (pig_clip) student: it has no model.embed_tokens.weight "
            f"or token_embd.weight; choose {SHIPPED_FILE}."
        )
    if "norm.weight" not in tensors:
        raise UserError(
            f"{path} has neither model.norm.weight nor output_norm.weight, so the engine would "
            f"feed un-normed states to the adapter; use the complete {SHIPPED_FILE}."
        )
    biases = sorted(name for name in tensors if name.endswith(".bias"))
    if biases:
        raise UserError(f"{path} has bias tensors ({biases[0]}…), so it is not a Qwen3 (pig_clip) "
                        f"student; choose {SHIPPED_FILE}.")
    indices = {int(m.group(1)) for name in tensors if (m := _LAYER.match(name))}
    n_layers = max(indices) + 1 if indices else 0
    wanted = [f"layers.{i}.{part}" for i in range(max(n_layers, 1)) for part in LAYER_PARTS]
    missing = [name for name in wanted if name not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UserError(f"{path} is not a Qwen3 (pig_clip) student: model.{missing[0]} is "
                        f"missing{more}; choose {SHIPPED_FILE}.")


# ---------------------------------------------------------------- config


def qwen3_config(*, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int,
                 intermediate: int, head_dim: int = HEAD_DIM) -> transformers.Qwen3Config:
    """The Qwen3Config the engine effectively runs: theta 1e6, eps 1e-6, no bias, SiLU."""
    return transformers.Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        intermediate_size=intermediate, rope_theta=ROPE_THETA, rms_norm_eps=RMS_EPS,
        hidden_act="silu", attention_bias=False, tie_word_embeddings=True,
        max_position_embeddings=MAX_POSITIONS, use_sliding_window=False,
    )


def _config_from_shapes(tensors: dict[str, np.ndarray]) -> transformers.Qwen3Config:
    """As the engine detects it (engine-contract §3.1)."""
    vocab, hidden = tensors["embed_tokens.weight"].shape
    q_rows = tensors["layers.0.self_attn.q_proj.weight"].shape[0]
    k_rows = tensors["layers.0.self_attn.k_proj.weight"].shape[0]
    layers = 1 + max(int(m.group(1)) for name in tensors if (m := _LAYER.match(name)))
    heads, kv_heads = q_rows // HEAD_DIM, k_rows // HEAD_DIM
    if q_rows % HEAD_DIM or k_rows % HEAD_DIM or kv_heads == 0 or heads % kv_heads:
        raise UserError(f"the student's q_proj/k_proj have {q_rows}/{k_rows} rows, which is not a "
                        f"Qwen3 layout with {HEAD_DIM}-dim heads; choose {SHIPPED_FILE}.")
    if layers == 28 and heads != 16:  # the engine forces 16 heads for 28 layers
        raise UserError(f"the student has 28 layers but {heads} query heads; the engine runs "
                        f"28-layer students with 16, so choose {SHIPPED_FILE}.")
    return qwen3_config(vocab=vocab, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
                        intermediate=tensors["layers.0.mlp.gate_proj.weight"].shape[0])


def rope_theta(config) -> float | None:
    """RoPE base from either config style (transformers 5 rope_parameters, 4.x rope_theta)."""
    params = getattr(config, "rope_parameters", None) or {}
    return params.get("rope_theta", getattr(config, "rope_theta", None))


def _engine_facts(config) -> dict:
    """The config fields that change the forward; the engine fixes or derives all of them."""
    params = getattr(config, "rope_parameters", None) or {}
    return {
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": getattr(config, "head_dim", None)
        or config.hidden_size // config.num_attention_heads,
        "rope_theta": rope_theta(config), "rope_type": params.get("rope_type", "default"),
        "rms_norm_eps": config.rms_norm_eps, "hidden_act": config.hidden_act,
        "attention_bias": config.attention_bias,
        "layer_types": sorted(set(getattr(config, "layer_types", None) or ["full_attention"])),
    }


def _config_from_json(json_path: Path, engine) -> transformers.Qwen3Config:
    try:
        config = transformers.Qwen3Config.from_json_file(json_path)
    except (OSError, ValueError, TypeError) as exc:  # unreadable or not a config object
        raise UserError(
            f"{json_path} is not a readable model config ({exc}); fix or remove it."
        ) from None
    want, got = _engine_facts(engine), _engine_facts(config)
    diffs = [f"{key}={got[key]!r} (engine: {want[key]!r})" for key in want if got[key] != want[key]]
    if diffs:
        raise UserError(f"{json_path} does not match the student GGUF as the engine runs it: "
                        f"{'; '.join(diffs)}; remove it or use the matching tokenizer folder.")
    return config


def student_config(tensors: dict[str, np.ndarray], tokenizer_dir=None) -> transformers.Qwen3Config:
    """tokenizer_dir/config.json when present (checked against the tensors), else the
    config the engine derives from the tensor shapes."""
    engine = _config_from_shapes(tensors)
    json_path = Path(tokenizer_dir) / "config.json" if tokenizer_dir is not None else None
    config = _config_from_json(json_path, engine) if json_path and json_path.is_file() else engine
    _check_shapes(config, tensors)
    return config


def _check_shapes(config: transformers.Qwen3Config, tensors: dict[str, np.ndarray]) -> None:
    with torch.device("meta"):
        model = transformers.Qwen3Model(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    found = {name: tuple(arr.shape) for name, arr in tensors.items()}
    extra = sorted(set(found) - set(expected))
    bad = [f"model.{name} is {found.get(name, 'missing')}, expected {shape}"
           for name, shape in expected.items() if found.get(name) != shape]
    if extra or bad:
        what = bad[0] if bad else f"unexpected tensor model.{extra[0]}"
        raise UserError(f"the student GGUF is not a consistent Qwen3 stack ({what}); "
                        f"choose {SHIPPED_FILE}.")


# ---------------------------------------------------------------- model


def build_model(config, tensors: dict[str, np.ndarray], device="cpu",
                dtype: torch.dtype = torch.float32) -> transformers.Qwen3Model:
    """A frozen Qwen3Model holding `tensors`. Built on the meta device and filled with
    assign=True, so fp32 CPU weights share the arrays' memory (no init, no extra copy)."""
    device = torch.device(device)
    with torch.device("meta"):
        model = transformers.Qwen3Model(config)
    state = {name: torch.from_numpy(arr).to(device=device, dtype=dtype)
             for name, arr in tensors.items()}
    model.load_state_dict(state, strict=True, assign=True)
    # The rotary inverse frequencies are non-persistent buffers: recompute them (in fp32).
    model.rotary_emb = type(model.rotary_emb)(config=config).to(device)
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    model.eval().requires_grad_(False)
    return model


class Student:
    """A loaded pig_clip student: frozen model + tokenizer, and the engine's hidden-state tap."""

    def __init__(self, model: transformers.Qwen3Model, tokenizer, file_dtype: str):
        self.model = model
        self.tokenizer = tokenizer
        self.config = model.config
        self.hidden_size = int(model.config.hidden_size)
        self.file_dtype = file_dtype
        self.device = model.embed_tokens.weight.device
        self.dtype = model.embed_tokens.weight.dtype

    @torch.no_grad()
    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               splices: Sequence[tuple[int, int, torch.Tensor]] | None = None,
               position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Final-RMSNorm states, float32 (B, L, hidden). `splices` (batch_index, start, rows)
        replace the input embeddings at start..start+n-1 of that sample (vision splicing).
        `attention_mask` False marks keys no row may attend to (batch and template pads);
        `position_ids` (B, L) the rope positions (None: 0..L-1; FLUX.3 puts its pads at 1)."""
        input_ids = input_ids.to(self.device)
        embeds = self.model.embed_tokens(input_ids)  # (B, L, D), a fresh tensor
        for index, start, rows in splices or ():
            if not 0 <= start <= start + rows.shape[0] <= embeds.shape[1]:
                raise ValueError(f"splice of {rows.shape[0]} rows at {start} is outside "
                                 f"a sequence of {embeds.shape[1]}")
            embeds[index, start : start + rows.shape[0]] = rows.to(self.device, self.dtype)
        keep = attention_mask.to(self.device, torch.bool)
        pos = None if position_ids is None else position_ids.to(self.device)
        out = self.model(inputs_embeds=embeds, attention_mask=keep, position_ids=pos,
                         use_cache=False)
        return out.last_hidden_state.float()

    def embed_table(self) -> torch.Tensor:
        """(vocab, hidden) float32 on CPU. Shares memory with the model for an fp32 CPU
        student: do not modify it in place."""
        return self.model.embed_tokens.weight.detach().to("cpu", torch.float32)


def load_student(
    gguf_path, tokenizer_dir, device="cpu", dtype: torch.dtype | None = None
) -> Student:
    """Load pig_clip for training: fp32 off CUDA (bf16 CPU matmul is far slower), bf16 on CUDA."""
    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    tensors, info = read_student_tensors(gguf_path)
    config = student_config(tensors, tokenizer_dir)
    model = build_model(config, tensors, device, dtype)
    del tensors
    tokenizer = load_tokenizer(tokenizer_dir)
    if info["file_dtype"] != "F16":
        log.warning(
            "training against %s; the recipes train against %s", info["file_dtype"], SHIPPED_FILE
        )
    if len(tokenizer) > config.vocab_size:
        log.warning(
            "the tokenizer has %d ids but the student embeds only %d; higher ids will fail",
            len(tokenizer),
            config.vocab_size,
        )
    n_params = sum(p.numel() for p in model.parameters())
    log.info(
        "student %s: %d layers, hidden %d, %d heads / %d kv, %.1fM params, %s on %s as %s",
        gguf_path,
        config.num_hidden_layers,
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        n_params / 1e6,
        info["file_dtype"],
        device,
        dtype,
    )
    return Student(model, tokenizer, info["file_dtype"])


# ---------------------------------------------------------------- tokenizer


@functools.lru_cache(maxsize=4)
def _cached_tokenizer(folder: str, stamp: tuple):
    try:
        return transformers.AutoTokenizer.from_pretrained(folder, padding_side="right")
    except (OSError, ValueError) as exc:  # no or broken tokenizer files
        raise UserError(
            f"{folder} has no usable Qwen tokenizer ({exc}); choose the pig_clip tokenizer folder."
        ) from None


def load_tokenizer(tokenizer_dir):
    """AutoTokenizer with right padding. Cached per folder (and file times): do not mutate it."""
    folder = Path(tokenizer_dir).resolve()
    if not folder.is_dir():
        raise UserError(f"{tokenizer_dir} is not a folder; choose the pig_clip tokenizer folder.")
    stamp = tuple(sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()))
    return _cached_tokenizer(str(folder), stamp)


def pad_batch(
    id_lists: Sequence[Sequence[int]], pad_id: int = PAD_ID
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (B, L) LongTensor and a (B, L) BoolTensor, True at real tokens."""
    length = max((len(row) for row in id_lists), default=0)
    ids = torch.full((len(id_lists), length), pad_id, dtype=torch.long)
    keep = torch.zeros((len(id_lists), length), dtype=torch.bool)
    for i, row in enumerate(id_lists):
        ids[i, : len(row)] = torch.as_tensor(list(row), dtype=torch.long)
        keep[i, : len(row)] = True
    return ids, keep
