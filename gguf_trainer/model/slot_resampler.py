"""The slot-resampler adapter kind: one seeded query per TEACHER token, for the families whose
teacher does not share the student's tokenizer (engine-families §4, rows 19-21).

Kinds: `qwen35_bridge` (MOSS-Image's slot head, FLUX.3 Klein's optional bank head). Ming-Image
(`ming_image`) is the same trunk with a caption bank in place of the FLUX.3 bank: `cap_query`
for `bank_query`, `out_cap` for `out_bank`, vis_q / vis_in always, and an output that is the
caption rows zero-padded to out_dim followed by the slot rows (llm_adapter.hpp 594-598):
model/ming_adapter.py builds it from this module's SlotBlock and slot_problems.

What the engine reads (ggk 0.9.7 vendor/engine/diffusion/src/model/te/llm_adapter.hpp,
`Qwen35BridgeConfig` 677-751, `Qwen35BridgeAdapter` 753-838; shapes in ggml ne order, the
torch shape reversed; the file names are these under `adapter.`):

    slot_query          ne [W, max_slots]        f32 param (759)      torch (max_slots, W)
    bank_query          ne [W, n_bank]           f32 param (761)      optional: the FLUX.3 bank
    seed_embed.weight   ne [seed_rank, vocab]    Embedding (767)      f16, frozen PCA table
    seed_proj.weight    ne [seed_rank, W]        Linear, no bias (768)
    vis_q.weight        ne [vis_dim, W]          Linear, no bias (769), always declared
    in_proj.weight/bias ne [in_dim, W] / [W]     Linear (770)
    vis_in.weight       ne [vis_dim, W]          Linear, no bias (771), always declared
    blocks.N.*          the resampler Block (193-223: ln_self, self_attn, ln_q, ln_kv,
                        cross_attn, ln_mlp, mlp.0, mlp.2), N < depth = highest N + 1 (741)
    ln_out.weight/bias  ne [W]                   LayerNorm (776)
    out_bank.weight     ne [W, bank_dim]         Linear (778), only with bank_query
    bank_in.weight      ne [in_dim, W]           Linear, no bias (780), the token-aligned bank
    out_proj.weight     ne [W, out_dim]          Linear (783)

The engine's bank is there only when out_bank is (737-740: bank_dim 0 turns n_bank off).
Detection: `slot_query` present and `cap_query` absent (693-696). Forward (793-837), per prompt:

    kv   = in_proj(h) ++ vis_in(v)                              [L + V, W]
    q    = slot_query[:P] + seed_proj(seed_embed[ids]) (+ vis_q(v under each slot))
    q    = (bank_query (+ bank_in(bank_hidden))) ++ q           bank first, when present
    q    = Block(q, kv) x depth     (no masks: every query reads every query and every kv row)
    out  = out_bank(ln_out(q[:n_bank]))  or  out_proj(ln_out(q[n_bank:]))

Training pads a batch: `seed_ids` beyond a sample's P hold PAD_SLOT (-1) and are masked as
self-attention keys, the student pads as cross-attention keys, so each sample's rows equal its
own unpadded run (the engine's). Dtypes at export (export.py): the two queries f32, 1-D and
LayerNorm tensors f32, every other weight f16 (seed_embed included: the engine keeps an f16
embedding table as is).

    cfg = AdapterConfig(kind="qwen35_bridge", in_dim=1024, out_dim=4096, width=1024, depth=6,
                        num_queries=1536, seed_vocab=248320, seed_rank=384, vis_dim=4096)
    m = SlotResampler(cfg); set_seed_table(m, pca_seed(embed_table, 384))
    rows = m(hidden, mask, seed_ids=ids)                         # (B, P, 4096)
"""

from __future__ import annotations

import torch
from torch import nn

from gguf_trainer.model.adapter_blocks import INIT_STD, LN_EPS, ResamplerBlock, as_bool

SLOT_KINDS = ("qwen35_bridge",)
PAD_SLOT = -1  # seed_ids past a sample's slots (never an id: the engine has no pads here)
# The learned bank before the slots, per kind: (query, head, per-row student input).
_LEAD = {"qwen35_bridge": ("bank_query", "out_bank", "bank_in")}
FROZEN = ("seed_embed.weight",)  # a PCA of the teacher's table, exported as computed


def slot_problems(cfg) -> list[str]:
    """Every reason a slot-kind AdapterConfig cannot be built or run, one sentence each."""
    p = []
    if cfg.num_queries <= 0:
        p.append(f"a {cfg.kind} adapter needs num_queries > 0 (its max_slots).")
    if cfg.seed_vocab <= 0 or cfg.seed_rank <= 0:
        p.append(
            f"a {cfg.kind} adapter needs the teacher's vocabulary (seed_vocab) and a PCA rank "
            "(seed_rank) > 0."
        )
    elif cfg.seed_rank > cfg.seed_vocab:
        p.append(f"seed_rank {cfg.seed_rank} exceeds seed_vocab {cfg.seed_vocab}.")
    if cfg.vis_dim <= 0:
        p.append(
            f"a {cfg.kind} adapter needs vis_dim > 0: the engine always declares vis_q/vis_in."
        )
    if (cfg.n_bank > 0) != (cfg.bank_dim > 0):
        p.append("a bank head needs both n_bank and bank_dim > 0 (or both 0 for none).")
    if cfg.bank_align and not cfg.n_bank:
        p.append("bank_align (bank_in) needs a bank head (n_bank > 0).")
    if cfg.taps:
        p.append(f"taps are for a layerwise adapter; set them to () for a {cfg.kind}.")
    return p


def pca_seed(table: torch.Tensor, rank: int, chunk: int = 16384) -> torch.Tensor:
    """The frozen seed table: the teacher's embedding table (V, D) centred, projected on its top
    `rank` principal directions (eigh of the D x D covariance in float64, strongest first, each
    direction's sign fixed so its largest |entry| is positive), scaled to unit RMS. (V, rank)
    float32. Chunked over rows: a 248320 x 4096 table never exists in float64."""
    v, d = table.shape
    if not 0 < rank <= min(v, d):
        raise ValueError(f"PCA rank {rank} must be in 1..{min(v, d)} for a {v} x {d} table")
    mean = torch.zeros(d, dtype=torch.float64)
    for a in range(0, v, chunk):
        mean += table[a : a + chunk].to(torch.float64).sum(0)
    mean /= v
    cov = torch.zeros(d, d, dtype=torch.float64)
    for a in range(0, v, chunk):
        x = table[a : a + chunk].to(torch.float64) - mean
        cov += x.T @ x
    _, vecs = torch.linalg.eigh(cov)  # ascending
    basis = vecs[:, -rank:].flip(1)  # (D, r)
    sign = torch.sign(basis.gather(0, basis.abs().argmax(0, keepdim=True)))
    basis = basis * sign
    out = torch.empty(v, rank, dtype=torch.float64)
    for a in range(0, v, chunk):
        out[a : a + chunk] = (table[a : a + chunk].to(torch.float64) - mean) @ basis
    rms = out.pow(2).mean().sqrt().clamp_min(1e-30)
    return (out / rms).to(torch.float32)


class SlotBlock(ResamplerBlock):
    """The engine's resampler Block (same parameters); with `q_mask` the pad slots of a padded
    batch are masked as self-attention keys, which the engine, running one prompt, never has."""

    def forward(self, q, kv, kv_mask=None, q_mask=None):
        x = self.ln_self(q)
        q = q + self.self_attn(x, x, q_mask)
        q = q + self.cross_attn(self.ln_q(q), self.ln_kv(kv), kv_mask)
        return q + self.mlp(self.ln_mlp(q))


def seeded_slots(module, hidden, mask, seed_ids, vis, vis_mask, vis_slot, vis_at=None):
    """The slot kinds' shared first half (the bridge's and Ming's runners build it alike): one
    query per teacher token up to the batch's longest (slot_query + seed_proj(seed_embed(id)),
    + vis_q of the row under an image slot), and the keys: in_proj of the student rows, then
    vis_in of the vision rows. -> (queries (B, R, W), slot mask (B, R), keys, key mask).
    `vis_at` (B, >= R) bool, training's compact form of vis_slot: True at the image slots, a
    sample's vision row k on its k-th True slot, its rows first in `vis` (the rest padding,
    masked as keys); vis_q is bias-free, so vis_q(0) = 0 off the slots as in the engine."""
    slot_mask = seed_ids >= 0
    r = max(int(slot_mask.sum(1).max()), 1)
    if r > module.config.num_queries:
        raise ValueError(f"{r} slots exceed max_slots {module.config.num_queries}")
    ids = seed_ids[:, :r].long().clamp_min(0)
    slot_mask = slot_mask[:, :r]
    q = module.slot_query[:r].unsqueeze(0) + module.seed_proj(module.seed_embed(ids))
    if vis_slot is not None:
        q = q + module.vis_q(vis_slot[:, :r])
    if vis_at is not None and vis is not None:
        at = vis_at[:, :r].bool()
        counts = at.sum(1)
        vis_mask = torch.arange(vis.shape[1], device=vis.device)[None, :] < counts[:, None]
        if int(counts.sum()) != int(vis_at.sum()):
            raise ValueError("an image slot lies past the batch's slots")
        q = q.index_put(at.nonzero(as_tuple=True), module.vis_q(vis[vis_mask]), accumulate=True)
    kv = module.in_proj(hidden)
    kv_mask = as_bool(mask)
    if vis is not None:
        kv = torch.cat([kv, module.vis_in(vis)], 1)
        if kv_mask is not None or vis_mask is not None:
            b = hidden.shape[0]
            km = kv_mask if kv_mask is not None else hidden.new_ones(b, hidden.shape[1])
            vm = as_bool(vis_mask) if vis_mask is not None else vis.new_ones(b, vis.shape[1])
            kv_mask = torch.cat([km.bool(), vm.bool()], 1)
    return q, slot_mask, kv, kv_mask


class SlotResampler(nn.Module):
    """`qwen35_bridge`: num_queries = max_slots, seed_vocab/seed_rank the PCA seed table,
    vis_dim the mmproj width, n_bank/bank_dim the optional bank head, bank_align its bank_in."""

    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        lead_q, lead_out, lead_in = _LEAD[cfg.kind]
        self._lead = (lead_q, lead_out, lead_in)
        w = cfg.width
        self.slot_query = nn.Parameter(torch.randn(cfg.num_queries, w) * INIT_STD)
        if cfg.n_bank:
            setattr(self, lead_q, nn.Parameter(torch.randn(cfg.n_bank, w) * INIT_STD))
            if cfg.bank_align:
                setattr(self, lead_in, nn.Linear(cfg.in_dim, w, bias=False))
        self.seed_embed = nn.Embedding(cfg.seed_vocab, cfg.seed_rank)
        self.seed_embed.weight.requires_grad_(False)  # set_seed_table installs the PCA
        self.seed_proj = nn.Linear(cfg.seed_rank, w, bias=False)
        self.vis_q = nn.Linear(cfg.vis_dim, w, bias=False)
        self.in_proj = nn.Linear(cfg.in_dim, w)
        self.vis_in = nn.Linear(cfg.vis_dim, w, bias=False)
        self.blocks = nn.ModuleList(SlotBlock(w, cfg.hidden_dim) for _ in range(cfg.depth))
        self.ln_out = nn.LayerNorm(w, eps=LN_EPS)
        if cfg.n_bank:
            setattr(self, lead_out, nn.Linear(w, cfg.bank_dim))
        self.out_proj = nn.Linear(w, cfg.out_dim)

    def forward(self, hidden, mask=None, seed_ids=None, vis=None, rows=None, *, vis_mask=None,
                vis_slot=None, want_bank=False, bank_hidden=None, vis_at=None):
        """hidden (B, L, in_dim) student final-norm states, mask (B, L) True = real; seed_ids
        (B, S) teacher ids, PAD_SLOT past each sample's P slots; vis (B, V, vis_dim) raw mmproj
        rows with vis_mask (B, V) True = real; vis_slot (B, S, vis_dim) the row under each image
        slot, zeros elsewhere; bank_hidden (B, n_bank, in_dim) the student state under each bank
        row (token-aligned bank). -> slot rows (B, R, out_dim), R = the batch's largest P (rows
        past a sample's P are meaningless), or with want_bank the bank (B, n_bank, bank_dim).
        With `rows` (B, R) bool only those slot rows, (N, out_dim) in masked_rows order.
        `vis_at` (B, R) bool: vis_slot's compact form (seeded_slots), which builds vis_mask."""
        if seed_ids is None:
            raise ValueError(f"a {self.config.kind} adapter needs seed_ids (one per slot)")
        lead_q, lead_out, lead_in = self._lead
        n_bank = self.config.n_bank
        if want_bank and not n_bank:
            raise ValueError("this adapter has no bank head")
        q, slot_mask, kv, kv_mask = seeded_slots(self, hidden, mask, seed_ids, vis, vis_mask,
                                                 vis_slot, vis_at)
        q_mask = slot_mask
        if n_bank:
            lead = getattr(self, lead_q).unsqueeze(0).expand(q.shape[0], -1, -1)
            if bank_hidden is not None:
                lead = lead + getattr(self, lead_in)(bank_hidden)
            q = torch.cat([lead, q], 1)
            q_mask = torch.cat([slot_mask.new_ones(q.shape[0], n_bank), slot_mask], 1)
        if bool(q_mask.all()):
            q_mask = None  # nothing padded: the engine's unmasked attention exactly
        for block in self.blocks:
            q = block(q, kv, kv_mask, q_mask)
        if want_bank:
            return getattr(self, lead_out)(self.ln_out(q[:, :n_bank]))
        q = q[:, n_bank:]
        if rows is not None:
            q = q[as_bool(rows)[:, : q.shape[1]]]
        return self.out_proj(self.ln_out(q))


def set_seed_table(module: SlotResampler, table) -> None:
    """Install the frozen seed table (seed_vocab, seed_rank), e.g. pca_seed's."""
    t = torch.as_tensor(table)
    target = module.seed_embed.weight
    if tuple(t.shape) != tuple(target.shape):
        raise ValueError(f"seed table must be {tuple(target.shape)}, got {tuple(t.shape)}")
    with torch.no_grad():
        target.copy_(t.to(target.dtype))
    target.requires_grad_(False)
