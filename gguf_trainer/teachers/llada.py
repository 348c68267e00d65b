"""The LLaDA-Image-Turbo teacher: LLaDA2-MoE (remote code) + QueryFormer + TextProjection.

Owns: loading the teacher from a snapshot folder (after the trust check, with the
transformers-5 stand-ins and the RoPE repair), its placement on the devices, and the forward
that makes the 256 × 2560 `cap_feats` rows per prompt (anchor-trainer §4.1):

    emb = word_embeddings(ids)                     # (B, L, H), teacher tokenizer, right-padded
    q   = QueryFormer(emb, mask)                   # (B, 256, H)
    h   = backbone([emb ; q], 4-D additive mask, positions = cumsum(mask) - 1)
    out = TextProjection(h, key mask)[:, L:]       # (B, 256, 2560)

The mask is never causal: text rows cannot see the query columns, queries see every real row,
nothing sees a pad. Positions count real rows only, so right padding never moves a query.
Must not: know about projects or shards (the pack hands in paths, a prompt formatter, a plan).

    teacher = load_llada_teacher(root, format_prompt=pack.format_prompt, device="cpu")
    rows = teacher.encode(["a red fox"])           # (1, 256, 2560) float32 on the CPU
    teacher.close()
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gguf_trainer.base.errors import UserError

from . import trust
from .llada_compat import install_attn_mask_utils, repair_rotary_tables, rotary_modules
from .llada_layout import check_snapshot
from .placement import GIB, model_bytes, plan_device_map
from .queryformer import QueryFormer, TextProjection, load_module

log = logging.getLogger(__name__)
MAX_LEN_TEACHER = 2048  # anchor-trainer §4.1


def compute_dtype(device: torch.device) -> torch.dtype:
    """bf16 on CUDA (what the snapshot stores); fp32 elsewhere (bf16 matmul on CPUs is very
    slow)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def attention_inputs(text_mask: torch.Tensor, num_queries: int, dtype: torch.dtype):
    """(B, L) text mask (1 = real) -> key mask (B, T), positions (B, T), additive 4-D mask
    (B, 1, T, T) for T = L + num_queries. Text rows cannot see the query columns; no row sees a
    pad column; not causal."""
    b, n = text_mask.shape
    keys = torch.cat(
        [text_mask.to(torch.long), text_mask.new_ones(b, num_queries, dtype=torch.long)], 1
    )
    positions = (keys.cumsum(1) - 1).clamp(min=0)  # right pads repeat the last real position
    allowed = keys.bool()[:, None, :].expand(b, n + num_queries, n + num_queries).clone()
    allowed[:, :n, n:] = False  # text rows never see the queries
    bias = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return keys.bool(), positions, bias[:, None]


def _text_of(item) -> str:
    """A sample record (`.text`), a dict with "text", or a plain string."""
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        return item["text"]
    return item.text


@dataclass
class LLaDATeacher:
    """A loaded teacher. `identity` goes into the shard fingerprint."""

    backbone: torch.nn.Module  # LLaDA2MoeModel (get_decoder()), possibly spread by a device map
    embed: torch.nn.Module
    queryformer: QueryFormer
    projection: TextProjection
    tokenizer: object
    format_prompt: Callable[[str], str]
    device: torch.device
    dtype: torch.dtype
    identity: dict = field(default_factory=dict)
    max_len: int = MAX_LEN_TEACHER
    device_map: dict = field(default_factory=dict)
    is_mock: bool = False
    _model: torch.nn.Module | None = None

    @property
    def num_queries(self) -> int:
        return self.queryformer.meta_queries.shape[0]

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Teacher ids of the formatted prompts, with the tokenizer's own special tokens."""
        enc = self.tokenizer(
            [self.format_prompt(t) for t in texts],
            add_special_tokens=True,
            truncation=True,
            max_length=self.max_len,
        )
        return [list(ids) for ids in enc["input_ids"]]

    def lengths(self, samples, student_ids=None) -> list[int]:
        """Rows each sample costs the teacher: its tokens + the queries."""
        return [
            len(ids) + self.num_queries for ids in self.token_ids([_text_of(s) for s in samples])
        ]

    def targets(self, samples, student_ids=None, vision=None) -> list:
        from .base import TargetRows

        rows = self.encode([_text_of(s) for s in samples])
        return [TargetRows(rows=r) for r in rows]

    @torch.inference_mode()  # the MoE experts refuse autograd
    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """(B, num_queries, projection_dim) float32 on the CPU, one batch, right-padded."""
        ids = self.token_ids(texts)
        n = max(len(x) for x in ids)
        pad = self.tokenizer.pad_token_id or 0
        input_ids = torch.tensor([x + [pad] * (n - len(x)) for x in ids])
        text_mask = torch.tensor([[1] * len(x) + [0] * (n - len(x)) for x in ids])
        emb_device = self.embed.weight.device
        emb = self.embed(input_ids.to(emb_device)).to(self.device, self.dtype)  # (B, L, H)
        q = self.queryformer(emb, text_mask.to(self.device).bool())  # (B, Q, H)
        keys, positions, bias = attention_inputs(text_mask, self.num_queries, self.dtype)
        h = self.backbone(
            inputs_embeds=torch.cat([emb, q], 1),
            attention_mask=bias.to(self.device),
            position_ids=positions.to(self.device),
        ).last_hidden_state
        out = self.projection(h.to(self.device, self.dtype), keys.to(self.device))  # (B, T, P)
        return out[:, n:].float().cpu()

    def close(self) -> None:
        """Drop every weight (and the CUDA cache) so the next stage gets the memory back."""
        for name in ("backbone", "embed", "queryformer", "projection", "_model"):
            setattr(self, name, None)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _backbone_class(te_dir: Path):
    """(config, model class) from the snapshot's own code, named by its config's `auto_map`.
    The class comes straight from the code files (re-imported when they change), never from
    transformers' Auto registry, which keeps the first class it saw for a config class."""
    from transformers import AutoConfig
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    config = AutoConfig.from_pretrained(str(te_dir), trust_remote_code=True)
    ref = (getattr(config, "auto_map", None) or {}).get("AutoModel")
    if not ref:
        raise UserError(
            f"{te_dir / 'config.json'} has no auto_map.AutoModel entry; this is not the "
            "LLaDA2-MoE text encoder gguf-trainer supports."
        )
    return config, get_class_from_dynamic_module(ref, str(te_dir))


def _meta_model(te_dir: Path):
    """The backbone on the meta device, from its config and remote code (no weights)."""
    from accelerate import init_empty_weights

    config, cls = _backbone_class(te_dir)
    with init_empty_weights():
        return cls(config)


def plan_backbone(
    root, budgets: Sequence[tuple[int | str, int]], placement: str = "sequential"
) -> dict:
    """The device map for the snapshot's backbone under `budgets` ((device, bytes) in fill order),
    computed on the meta device before any weight loads. Needs the trust record."""
    root = check_snapshot(root).root
    trust.require_trust(root)
    install_attn_mask_utils()
    model = _meta_model(root / "text_encoder")
    dmap = plan_device_map(model, budgets, placement)
    # A rotary module holds no weights, only the table we repair after loading: keep it on
    # the main device, never offloaded (a re-registered buffer is not in the offload map).
    main = next(iter(dmap.values()))
    dmap.update({name: main for name, _ in rotary_modules(model) if name in dmap})
    log.info(
        "teacher: %.1f GiB of bf16 weights placed %s over %s",
        model_bytes(model) / GIB,
        placement,
        ", ".join(str(d) for d in dict.fromkeys(dmap.values())),
    )
    return dmap


def weights_gib(root, device, num_queries: int | None = None, out_dim: int | None = None) -> float:
    """GiB the teacher's weights take once loaded: the stored tensor bytes (bf16) of the three
    weight folders, scaled to the compute dtype (x2 for fp32 off CUDA). The pre-flight's need,
    from the header check (a snapshot that would fail is refused here, before anything loads)."""
    stored = check_snapshot(root, num_queries, out_dim).weight_bytes
    scale = torch.tensor([], dtype=compute_dtype(torch.device(device))).element_size() / 2
    return stored * scale / GIB


def plan_budgets(plan, device) -> list[tuple[int | str, int]] | None:
    """(device, bytes) in fill order for a hardware.Plan on a CUDA `device`: the chosen card up
    to its budget less activation headroom, every other card up to its total less 1.5 GiB (when
    that leaves > 2 GiB), then the CPU RAM budget. None when no device map is needed: a CPU run
    keeps everything on the CPU."""
    from gguf_trainer.machine.hardware import MIN_HEADROOM_GIB

    device = torch.device(device)
    if device.type != "cuda" or plan.mode not in ("gpu", "offload"):
        return None
    chosen = device.index if device.index is not None else torch.cuda.current_device()
    budgets: list[tuple[int | str, int]] = [
        (chosen, int(max(0.0, plan.gpu_gib - MIN_HEADROOM_GIB) * GIB))
    ]
    from gguf_trainer.machine.distributed import world

    # Launched with one rank per card: the other cards are the other ranks' (data parallel).
    others = range(torch.cuda.device_count()) if not world().is_distributed else ()
    for i in others:
        total = torch.cuda.get_device_properties(i).total_memory
        if i != chosen and total - 1.5 * GIB > 2 * GIB:
            budgets.append((i, int(total - 1.5 * GIB)))
    budgets.append(("cpu", int(plan.cpu_gib * GIB)))
    return budgets


def load_llada_teacher(
    root,
    *,
    format_prompt: Callable[[str], str],
    device="cpu",
    device_map: dict | None = None,
    max_len: int = MAX_LEN_TEACHER,
    project_dir=None,
) -> LLaDATeacher:
    """Load the teacher from its snapshot. Order: the header check (configs, weight names and
    shapes, complete files; nothing loaded), trust check (before any of the snapshot's code is
    imported), the transformers-5 stand-ins, the backbone (placed by `device_map`, default: all
    on `device`), the RoPE repair, QueryFormer/TextProjection (strict), the tokenizer (right
    padding)."""
    from transformers import AutoTokenizer

    root = check_snapshot(root).root
    code_hash = trust.require_trust(root, project_dir)
    device = torch.device(device)
    dtype = compute_dtype(device)
    install_attn_mask_utils()
    dmap = device_map or {"": str(device)}
    config, cls = _backbone_class(root / "text_encoder")
    model = cls.from_pretrained(
        str(root / "text_encoder"), config=config, dtype=dtype, device_map=dmap
    )
    model.eval()
    repair_rotary_tables(model)  # transformers 5 leaves remote models' inv_freq uninitialised
    backbone = model.get_decoder()  # the top-level forward crashes under transformers 5
    qf = load_module(QueryFormer, root / "queryformer", device, dtype)
    tp = load_module(TextProjection, root / "text_projection", device, dtype)
    # trusted with the rest of the snapshot: a custom tokenizer class is code in the same folder
    tok = AutoTokenizer.from_pretrained(str(root / "tokenizer"), trust_remote_code=True)
    tok.padding_side = "right"
    # The shard fingerprint hashes every file of the folders (materials.teacher_identity); this
    # names what ran, for logs and tests.
    identity = {"teacher": "llada_image", "code_hash": code_hash, "max_len": max_len}
    return LLaDATeacher(
        backbone=backbone,
        embed=backbone.get_input_embeddings(),
        queryformer=qf,
        projection=tp,
        tokenizer=tok,
        format_prompt=format_prompt,
        device=device,
        dtype=dtype,
        identity=identity,
        max_len=max_len,
        device_map=dmap,
        _model=model,
    )
