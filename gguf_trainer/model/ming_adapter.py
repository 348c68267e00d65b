"""The Ming-Image adapter (`ming_image`): the engine's LLMAdapter::MingAdapter as a module. A
resampler whose query bank is the 256 caption rows (-> the connector's caption tokens, 2560 wide,
the DiT's c_crossattn) followed by one seeded slot per Ling prompt token (-> the directvlm rows,
3840 wide, extra_c_crossattns), so the DiT sees the token count and identity of the 16B text
encoder it was trained on. The slot-resampler trunk (slot_resampler.py) with a caption bank.

What the engine reads (ggk 0.9.7 vendor/engine/diffusion/src/model/te/llm_adapter.hpp,
`MingAdapterConfig` 466-530, `MingAdapter` 533-599; ggml ne order, torch shape reversed; names
under `adapter.`):

    cap_query           ne [W, n_cap]            f32 param (539)       torch (n_cap, W)
    slot_query          ne [W, max_slots]        f32 param (540)       torch (max_slots, W)
    seed_embed.weight   ne [seed_rank, vocab]    Embedding (545)       f16, frozen Ling PCA
    seed_proj.weight    ne [seed_rank, W]        Linear, no bias (546)
    vis_q.weight        ne [vis_dim, W]          Linear, no bias (547), always declared
    in_proj.weight/bias ne [in_dim, W] / [W]     Linear (548)
    vis_in.weight       ne [vis_dim, W]          Linear, no bias (549), always declared
    blocks.N.*          the resampler Block (550-553), depth = highest N + 1 (526)
    ln_out.weight/bias  ne [W]                   LayerNorm (554)
    out_cap.weight/bias ne [W, cap_dim] / [cap_dim]   Linear (555)
    out_proj.weight/bias ne [W, out_dim] / [out_dim]  Linear (556)

and beside them, outside `adapter.`, `tokenizer_json`: the Ling tokenizer.json bytes, one f16
per byte (gk-diffuser.cpp 1285-1310, 1327-1356: the engine has no Ling vocabulary built in).
Selected by `cap_query` (llm_adapter.hpp 481-482). Forward (564-598), per prompt:

    kv   = in_proj(h) ++ vis_in(v)
    q    = cap_query ++ (slot_query[:P] + seed_proj(seed_embed[ids]) + vis_q(v under each slot))
    q    = Block(q, kv) x depth            (no masks)
    out  = pad(out_cap(ln_out(q[:n_cap])), out_dim) ++ out_proj(ln_out(q[n_cap:]))  (n_cap + P rows)

AdapterConfig for this kind: num_queries = max_slots, n_bank = n_cap, bank_dim = cap_dim,
out_dim = the direct width, seed_vocab / seed_rank / vis_dim as the slot kinds. A padded batch
masks the pad slots as self-attention keys and the student pads as cross-attention keys, so
each sample's rows equal its own unpadded (the engine's) run.

    m = MingAdapter(cfg); set_seed_table(m, pca_seed(ling_table, 512))
    caption, slots = m.heads(hidden, mask, seed_ids=ids)      # (B, n_cap, cap_dim), (B, R, out_dim)
"""

from __future__ import annotations

import torch
from torch import nn

from gguf_trainer.model.adapter_blocks import INIT_STD, LN_EPS, as_bool
from gguf_trainer.model.slot_resampler import SlotBlock, seeded_slots, slot_problems

KIND = "ming_image"
TOKENIZER_TENSOR = "tokenizer_json"  # outside adapter.*: the engine reads it by this name


def ming_problems(cfg) -> list[str]:
    """Every reason a ming_image AdapterConfig cannot be built or run, one sentence each."""
    p = [s for s in slot_problems(cfg) if "bank" not in s]
    if cfg.n_bank <= 0 or cfg.bank_dim <= 0:
        p.append("a ming_image adapter needs its caption bank: n_bank (256) and bank_dim (2560) "
                 "> 0.")
    if cfg.bank_dim > cfg.out_dim:
        p.append("the engine pads the caption rows to out_dim: bank_dim must be <= out_dim.")
    if cfg.bank_align:
        p.append("a ming_image adapter has no bank_in; set bank_align off.")
    return p


class MingAdapter(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        w = cfg.width
        self.cap_query = nn.Parameter(torch.randn(cfg.n_bank, w) * INIT_STD)
        self.slot_query = nn.Parameter(torch.randn(cfg.num_queries, w) * INIT_STD)
        self.seed_embed = nn.Embedding(cfg.seed_vocab, cfg.seed_rank)
        self.seed_embed.weight.requires_grad_(False)  # set_seed_table installs the PCA
        self.seed_proj = nn.Linear(cfg.seed_rank, w, bias=False)
        self.vis_q = nn.Linear(cfg.vis_dim, w, bias=False)
        self.in_proj = nn.Linear(cfg.in_dim, w)
        self.vis_in = nn.Linear(cfg.vis_dim, w, bias=False)
        self.blocks = nn.ModuleList(SlotBlock(w, cfg.hidden_dim) for _ in range(cfg.depth))
        self.ln_out = nn.LayerNorm(w, eps=LN_EPS)
        self.out_cap = nn.Linear(w, cfg.bank_dim)
        self.out_proj = nn.Linear(w, cfg.out_dim)

    def trunk(self, hidden, mask=None, seed_ids=None, vis=None, *, vis_mask=None, vis_slot=None,
              vis_at=None):
        """hidden (B, L, in_dim) student final-norm states, mask (B, L) True = real; seed_ids
        (B, S) Ling ids, PAD_SLOT (-1) past each sample's P; vis (B, V, vis_dim) the Ling vision
        rows with vis_mask; vis_slot (B, S, vis_dim) the row under each image slot, zeros
        elsewhere, or `vis_at` (B, R) its compact form (slot_resampler.seeded_slots).
        -> ln_out of the queries (B, n_cap + R, W) and the slot mask (B, R)."""
        if seed_ids is None:
            raise ValueError("a ming_image adapter needs seed_ids (the Ling ids, one per slot)")
        q, slot_mask, kv, kv_mask = seeded_slots(self, hidden, mask, seed_ids, vis, vis_mask,
                                                 vis_slot, vis_at)
        b, n_cap = q.shape[0], self.config.n_bank
        q = torch.cat([self.cap_query.unsqueeze(0).expand(b, -1, -1), q], 1)
        q_mask = torch.cat([slot_mask.new_ones(b, n_cap), slot_mask], 1)
        if bool(q_mask.all()):
            q_mask = None  # nothing padded: the engine's unmasked attention exactly
        for block in self.blocks:
            q = block(q, kv, kv_mask, q_mask)
        return self.ln_out(q), slot_mask

    def heads(self, hidden, mask=None, seed_ids=None, vis=None, rows=None, **kw):
        """(caption (B, n_cap, cap_dim), slot rows (B, R, out_dim)); with `rows` (B, R) bool the
        slot rows are (N, out_dim) in masked_rows order."""
        q, _ = self.trunk(hidden, mask, seed_ids, vis, **kw)
        n_cap = self.config.n_bank
        slots = q[:, n_cap:]
        if rows is not None:
            slots = slots[as_bool(rows)[:, : slots.shape[1]]]
        return self.out_cap(q[:, :n_cap]), self.out_proj(slots)

    def forward(self, hidden, mask=None, seed_ids=None, vis=None, rows=None, **kw):
        """The engine's layout, (B, n_cap + R, out_dim): the caption rows zero-padded to out_dim
        (llm_adapter.hpp 597), then the slot rows (rows past a sample's P are meaningless)."""
        cap, slots = self.heads(hidden, mask, seed_ids, vis, rows=None, **kw)
        pad = cap.new_zeros(*cap.shape[:2], self.config.out_dim - cap.shape[-1])
        return torch.cat([torch.cat([cap, pad], -1), slots], 1)


def tokenizer_bytes_tensor(text: str):
    """The `tokenizer_json` tensor: the UTF-8 bytes of tokenizer.json, one f16 value each (the
    form the engine's read_embedded_json converts back, gk-diffuser.cpp 1291-1296)."""
    import numpy as np

    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.float16)


def tokenizer_from_tensor(values) -> str:
    """The tokenizer.json text a `tokenizer_json` tensor carries (the engine's reading)."""
    import numpy as np

    raw = np.rint(np.asarray(values, dtype=np.float32)).astype(np.uint8).tobytes()
    return raw.rstrip(b"\0").decode("utf-8")
