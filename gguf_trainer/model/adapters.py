"""The adapter modules the ggk engine can run, and `load_gguf` to rebuild one from a file.

Owns: `AdapterConfig`, the module layout and parameter names of engine-contract §1.4 (they are
the GGUF tensor names after `adapter.`), and the forward math of §2. Must not know about
projects, packs or files other than the adapter GGUF (style.md §1: built from numbers).

    cfg = AdapterConfig(kind="seeded_resampler", in_dim=1024, out_dim=4096, width=1024,
                        depth=6, num_queries=120, seed_vocab=32128)
    out = build_adapter(cfg)(hidden, mask, seed_ids=ids)          # (B, 120, 4096)
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, fields

import torch
from torch import nn

from gguf_trainer.base.errors import UserError
from gguf_trainer.model.adapter_blocks import (
    HEAD_DIM,
    INIT_STD,
    LN_EPS,
    ResamplerBlock,
    TokenBlock,
    as_bool,
    gather_rows,
)
from gguf_trainer.model.adapter_file import (
    open_adapter,
    read_adapter,
    read_adapter_arrays,
    trainer_kind,
)
from gguf_trainer.model.ming_adapter import KIND as MING_KIND
from gguf_trainer.model.ming_adapter import MingAdapter, ming_problems
from gguf_trainer.model.slot_resampler import FROZEN, SLOT_KINDS, SlotResampler, slot_problems

log = logging.getLogger(__name__)

KINDS = ("resampler", "seeded_resampler", "token_aligned", "token_aligned_vision", "layerwise",
         *SLOT_KINDS, MING_KIND)
# SLOT_KINDS (slot_resampler.py): one seeded query per teacher token, for teachers that do not
# share the student's tokenizer (qwen35_bridge: MOSS-Image, FLUX.3 Klein's bank).
# layerwise: the token-aligned trunk whose out_proj and skip emit a stack of n teacher taps
# (engine-families §4; llm_adapter.hpp 54-61, 114-115, 260-263).
TOKEN_ALIGNED_KINDS = ("token_aligned", "token_aligned_vision", "layerwise")
# The kinds that may carry vision_proj + vis_in: token_aligned_vision always, layerwise when
# vis_dim > 0 (Fibo 2.0 edits: the 15-tap stack with reference images, fibo2.hpp 217-221).
VISION_KINDS = ("token_aligned_vision", "layerwise")


@dataclass(frozen=True)
class AdapterConfig:
    kind: str
    in_dim: int
    out_dim: int
    width: int
    depth: int
    num_queries: int = 0  # resampler kinds
    seed_vocab: int = 0  # seeded_resampler (T5 v1.1: 32128)
    vis_dim: int = 0  # token_aligned_vision; layerwise with the vision extension when > 0
    mlp_hidden: int = 0  # 0 -> 4 * width
    # seeded_resampler: 0 = full t5_embed table, r = t5_embed_a (V, r) + t5_embed_b
    seed_rank: int = 0
    # layerwise: the teacher's 1-based tap layers, ascending; out_dim = len(taps) x teacher width,
    # each output row the taps' states concatenated in this order (the engine's stack).
    taps: tuple[int, ...] = ()
    # slot kinds: the optional bank head (FLUX.3 Klein: n_bank rows of bank_dim 20480), and
    # bank_align = its bank_in (each bank row also reads the student state of its token).
    n_bank: int = 0
    bank_dim: int = 0
    bank_align: bool = False

    def __post_init__(self):
        object.__setattr__(self, "taps", tuple(int(t) for t in self.taps))  # JSON gives a list

    @property
    def hidden_dim(self) -> int:
        """The MLP hidden size actually built."""
        return self.mlp_hidden or 4 * self.width

    @property
    def heads(self) -> int:
        return self.width // HEAD_DIM

    @property
    def tap_dim(self) -> int:
        """Layerwise: the teacher width of one tap (out_dim / n); else out_dim."""
        return self.out_dim // len(self.taps) if self.taps else self.out_dim

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> AdapterConfig:
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown AdapterConfig keys: {sorted(unknown)}")
        return cls(**d)

    def validate(self) -> list[str]:
        """Every reason this config cannot be built or run by the engine, one sentence each."""
        p = []
        if self.kind not in KINDS:
            return [f"adapter kind {self.kind!r} is unknown; use one of {', '.join(KINDS)}."]
        for name in ("in_dim", "out_dim", "width", "depth"):
            if getattr(self, name) <= 0:
                p.append(f"adapter {name} must be positive, got {getattr(self, name)}.")
        for name in ("num_queries", "seed_vocab", "vis_dim", "mlp_hidden", "seed_rank"):
            if getattr(self, name) < 0:
                p.append(f"adapter {name} must not be negative, got {getattr(self, name)}.")
        if self.width % HEAD_DIM:
            p.append(
                f"adapter width {self.width} must be a multiple of {HEAD_DIM} "
                "(the engine's head size)."
            )
        if self.kind == MING_KIND:  # ming_adapter.py: the slot trunk with a caption bank
            return p + ming_problems(self)
        if self.kind in SLOT_KINDS:
            return p + slot_problems(self)
        if self.n_bank or self.bank_dim or self.bank_align:
            p.append(f"a bank head belongs to the slot kinds; a {self.kind} has none.")
        resampler = self.kind not in TOKEN_ALIGNED_KINDS
        if resampler and self.num_queries <= 0:
            p.append(f"a {self.kind} needs num_queries > 0.")
        if self.kind == "seeded_resampler" and self.seed_vocab <= 0:
            p.append("a seeded_resampler needs seed_vocab > 0 (32128 for T5 v1.1).")
        if self.kind == "resampler" and self.seed_vocab:
            p.append("a resampler has no seed table; set seed_vocab to 0 or use seeded_resampler.")
        if not resampler and (self.num_queries or self.seed_vocab):
            p.append(f"a {self.kind} adapter has no queries or seed table; set both to 0.")
        if self.kind == "token_aligned_vision" and self.vis_dim <= 0:
            p.append("a token_aligned_vision adapter needs vis_dim > 0 (the mmproj width).")
        if self.kind not in VISION_KINDS and self.vis_dim:
            p.append(
                f"vis_dim is only for token_aligned_vision or a layerwise adapter with the vision "
                f"extension; set it to 0 for a {self.kind}."
            )
        if self.kind == "layerwise":
            p += _tap_problems(self.taps, self.out_dim)
        elif self.taps:
            p.append(f"taps are for a layerwise adapter; set them to () for a {self.kind}.")
        if self.seed_rank and self.kind != "seeded_resampler":
            p.append(f"seed_rank factorizes a seed table; a {self.kind} has none, set it to 0.")
        elif self.seed_rank > min(self.seed_vocab, self.width) > 0:
            p.append(
                f"seed_rank {self.seed_rank} exceeds min(seed_vocab, width) = "
                f"{min(self.seed_vocab, self.width)}; a factorized table cannot have more rank."
            )
        return p


def _tap_problems(taps: tuple[int, ...], out_dim: int) -> list[str]:
    # The engine declares layer_map only for n > 1 (llm_adapter.hpp 260-263): one tap is a
    # plain token-aligned adapter.
    if len(taps) < 2:
        return [f"a layerwise adapter needs at least 2 taps, got {list(taps)}."]
    p = []
    if any(t <= 0 for t in taps) or list(taps) != sorted(set(taps)):
        p.append(
            f"layerwise taps must be distinct positive layer numbers in ascending order "
            f"(the engine's stack order), got {list(taps)}."
        )
    if out_dim % len(taps):
        p.append(f"layerwise out_dim {out_dim} must be {len(taps)} taps x the teacher width.")
    return p



class ResamplerAdapter(nn.Module):
    """`resampler` (seedless) and `seeded_resampler`: learned queries read the student states."""

    def __init__(self, cfg: AdapterConfig):
        super().__init__()
        self.config = cfg
        self.query = nn.Parameter(torch.randn(cfg.num_queries, cfg.width) * INIT_STD)  # (Q, W)
        if cfg.kind == "seeded_resampler" and cfg.seed_rank:
            # Factorized seed (engine-families §4): seed = t5_embed_b(t5_embed_a[id]).
            self.t5_embed_a = nn.Embedding(cfg.seed_vocab, cfg.seed_rank)
            self.t5_embed_b = nn.Linear(cfg.seed_rank, cfg.width, bias=False)
            nn.init.normal_(self.t5_embed_a.weight, std=INIT_STD)
        elif cfg.kind == "seeded_resampler":
            self.t5_embed = nn.Embedding(cfg.seed_vocab, cfg.width)
            nn.init.normal_(self.t5_embed.weight, std=INIT_STD)
        self.in_proj = nn.Linear(cfg.in_dim, cfg.width)
        self.blocks = nn.ModuleList(
            ResamplerBlock(cfg.width, cfg.hidden_dim) for _ in range(cfg.depth)
        )
        self.ln_out = nn.LayerNorm(cfg.width, eps=LN_EPS)
        self.out_proj = nn.Linear(cfg.width, cfg.out_dim)

    def forward(self, hidden, mask=None, seed_ids=None, vis=None, rows=None):
        """hidden (B, L, in_dim), mask (B, L) True = real, seed_ids (B, Q) -> (B, Q, out_dim);
        with `rows` (B, Q) bool (training: the supervised slots) only those rows, (N, out_dim)
        in masked_rows order, each equal to the full forward's."""
        if vis is not None:
            raise ValueError("a resampler takes no vision embeds")
        seeded = self.config.kind == "seeded_resampler"
        if seeded != (seed_ids is not None):
            raise ValueError(f"{self.config.kind} {'needs' if seeded else 'takes no'} seed_ids")
        kv = self.in_proj(hidden)  # (B, L, W), shared by all blocks
        q = self.query.unsqueeze(0).expand(hidden.shape[0], -1, -1)  # (B, Q, W)
        if seeded:
            q = q + self.seed(seed_ids)
        mask = None if mask is None else mask.to(torch.bool)
        for block in self.blocks[:-1]:
            q = block(q, kv, mask)
        q = self.blocks[-1](q, kv, mask, rows=as_bool(rows))
        return self.out_proj(self.ln_out(q))

    def seed(self, seed_ids: torch.Tensor) -> torch.Tensor:
        """The seed rows added to the queries: the full table's, or B(A[id]) when factorized."""
        if self.config.seed_rank:
            return self.t5_embed_b(self.t5_embed_a(seed_ids))
        return self.t5_embed(seed_ids)


class TokenAlignedAdapter(nn.Module):
    """`token_aligned` (text-only families: no vision tensors in the file),
    `token_aligned_vision` (plus the frozen vision_proj and vis_in) and `layerwise` (out_proj
    and skip n x the teacher width, plus the `layer_map` buffer of tap numbers that the engine
    loads as f32 [n] and never reads; with vis_dim > 0 also vision_proj and vis_in): one output
    row per student token, plus the skip path."""

    def __init__(self, cfg: AdapterConfig):
        super().__init__()
        self.config = cfg
        vision = cfg.kind in VISION_KINDS and cfg.vis_dim > 0
        if vision:
            # Applied by the engine to mmproj embeds before the student, never in forward().
            self.vision_proj = nn.Linear(cfg.vis_dim, cfg.in_dim, bias=False)
            self.vision_proj.weight.requires_grad_(False)
        self.in_proj = nn.Linear(cfg.in_dim, cfg.width)
        if vision:
            self.vis_in = nn.Linear(cfg.vis_dim, cfg.width, bias=False)
        self.blocks = nn.ModuleList(TokenBlock(cfg.width, cfg.hidden_dim) for _ in range(cfg.depth))
        self.ln_out = nn.LayerNorm(cfg.width, eps=LN_EPS)
        self.out_proj = nn.Linear(cfg.width, cfg.out_dim)
        nn.init.zeros_(self.out_proj.weight)  # starts as the skip path alone
        nn.init.zeros_(self.out_proj.bias)
        self.skip = nn.Linear(cfg.in_dim, cfg.out_dim)
        if cfg.kind == "layerwise":  # a buffer: in the state dict (exported), never trained
            self.register_buffer("layer_map", torch.tensor(cfg.taps, dtype=torch.float32))

    def forward(self, hidden, mask=None, seed_ids=None, vis=None, rows=None):
        """hidden (B, L, in_dim), mask (B, L), vis (B, L, vis_dim) raw embeds, zeros off-image
        -> (B, L, out_dim). Pad rows are computed but meaningless. With `rows` (B, L) bool
        (training: the supervised tokens) only those rows, (N, out_dim) in masked_rows order."""
        if seed_ids is not None:
            raise ValueError("a token-aligned adapter takes no seed_ids")
        x = self.in_proj(hidden)  # (B, L, W)
        if vis is not None:
            if not hasattr(self, "vis_in"):
                raise ValueError("a text-only token-aligned adapter takes no vision embeds")
            x = x + self.vis_in(vis)
        mask = None if mask is None else mask.to(torch.bool)
        for block in self.blocks[:-1]:
            x = block(x, mask)
        rows = as_bool(rows)
        x = self.blocks[-1](x, mask, rows=rows)
        return self.out_proj(self.ln_out(x)) + self.skip(gather_rows(rows, hidden))  # raw states


def build_adapter(cfg: AdapterConfig) -> nn.Module:
    """A fresh module; deterministic given torch's global RNG. UserError for a bad config."""
    problems = cfg.validate()
    if problems:
        raise UserError("adapter settings are invalid: " + " ".join(problems))
    if cfg.kind in TOKEN_ALIGNED_KINDS:
        return TokenAlignedAdapter(cfg)
    if cfg.kind == MING_KIND:
        return MingAdapter(cfg)
    if cfg.kind in SLOT_KINDS:
        return SlotResampler(cfg)
    return ResamplerAdapter(cfg)


def start_output(module: nn.Module, mean: torch.Tensor, skip=None) -> None:
    """Where step 0 starts, for every kind: `out_proj` zero, so the blocks' output is ignored
    at first (trainer5's recipe), and the rows the adapter predicts are either the per-dim
    `mean` of the training targets (bias = mean; a token-aligned `skip` zeroed) or, with
    `skip` = (weight (out, in), bias (out,)), that least-squares linear map of the student
    states in the skip path (out_proj bias 0). Both start at or above the mean baseline."""
    with torch.no_grad():
        module.out_proj.weight.zero_()
        if skip is not None:
            if not hasattr(module, "skip"):
                raise ValueError(f"a {module.config.kind} adapter has no skip path")
            module.out_proj.bias.zero_()
            module.skip.weight.copy_(skip[0])
            module.skip.bias.copy_(skip[1])
            return
        module.out_proj.bias.copy_(torch.as_tensor(mean, dtype=module.out_proj.bias.dtype))
        if hasattr(module, "skip"):
            module.skip.weight.zero_()
            module.skip.bias.zero_()


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Everything except the frozen vision_proj (vision kinds) and seed table (slot kinds)."""
    return [
        p for n, p in module.named_parameters()
        if not n.startswith("vision_proj.") and n not in FROZEN
    ]


def set_vision_proj(module: nn.Module, weight) -> None:
    """Install the frozen vis_dim -> in_dim map (weight (in_dim, vis_dim)) used to build the
    student's training states; the engine applies the same map to mmproj embeds."""
    w = torch.as_tensor(weight)
    target = module.vision_proj.weight
    if tuple(w.shape) != tuple(target.shape):
        raise ValueError(f"vision_proj weight must be {tuple(target.shape)}, got {tuple(w.shape)}")
    with torch.no_grad():
        target.copy_(w.to(target.dtype))
    target.requires_grad_(False)


def load_gguf(path, device="cpu") -> nn.Module:
    """Rebuild the module the way the engine reads the file: variant from tensor names,
    geometry from shapes, float32 weights. Sets `.config` and `.metadata` (the GGUF KVs).
    UserError for a file the engine would refuse or gguf-trainer cannot rebuild. The file is
    opened once: the view, then (when it loads) the arrays, from one reader."""
    reader = open_adapter(path)
    view = read_adapter(path, reader)
    if view.refusals:
        raise UserError(
            f"{path} would be refused by the engine: {view.refusals[0]} "
            f"(run `gguf-trainer inspect {path}` for all {len(view.refusals)} problem(s))."
        )
    kind = trainer_kind(view)
    if kind is None:
        raise UserError(
            f"{path} is a {view.kind} adapter that gguf-trainer cannot rebuild; only resampler, "
            "seeded_resampler (full or factorized), token-aligned files with skip (text-only, "
            "or with both vision_proj and vis_in), layerwise files with skip (text-only, or "
            "with both vision_proj and vis_in), qwen35_bridge and ming_image files load."
        )
    for problem in view.problems:  # dtype policy only: the engine converts and still runs the file
        log.warning("%s: %s", path, problem)
    mlp_hidden = 0 if view.mlp_hidden == 4 * view.width else view.mlp_hidden  # 0 = the default 4W
    cfg = AdapterConfig(
        kind=kind,
        in_dim=view.in_dim,
        out_dim=view.out_dim,
        width=view.width,
        depth=view.depth,
        num_queries=view.num_queries,
        seed_vocab=view.t5_vocab,
        vis_dim=view.vis_dim,
        mlp_hidden=mlp_hidden,
        seed_rank=view.embed_rank,
        taps=view.taps,
        n_bank=view.n_bank,
        bank_dim=view.bank_dim,
        bank_align=view.bank_align,
    )
    with torch.random.fork_rng(devices=[]):  # loading must not move the caller's RNG
        module = build_adapter(cfg)
    arrays = read_adapter_arrays(path, reader)
    del reader  # the arrays are copies: drop the mapping before a caller renames the file
    state = {k: torch.from_numpy(arrays[k]) for k in module.state_dict()}
    module.load_state_dict(state, strict=True)
    module.metadata = dict(view.metadata)
    return module.to(device).eval()
