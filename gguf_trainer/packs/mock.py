"""Mock teachers: synthetic targets with each pack's real row shapes.

Each is a fixed random function of the prompt that an adapter can learn from the
student's states (its eval beats the per-dimension mean baseline), so the whole
pipeline can be exercised without the real multi-GB teacher. Never a usable adapter.
The functions are deterministic (fixed seeds, CPU fp32), so shards are reproducible.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np
import torch

from ..teachers.base import TargetRows
from .base import MockIdentity

_BUCKETS = 251  # token ids are hashed into this many feature rows
_FEAT = 32


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class MockQueryTeacher:
    """Resampler targets [num_queries, out_dim]: a shared large offset per dimension (like
    LLaDA's rows, where plain cosine is ~0.99 for any prediction), a per-query pattern and a
    prompt-dependent part from the mean of hashed token features."""

    is_mock = True

    def __init__(self, pack_id: str, num_queries: int, out_dim: int, seed: int = 1234):
        g = _generator(seed)
        self.identity = MockIdentity(pack_id, extra={"rows": [num_queries, out_dim]}).as_dict()
        self.feat = torch.randn(_BUCKETS, _FEAT, generator=g)
        self.proj = torch.randn(_FEAT, out_dim, generator=g) / _FEAT**0.5
        self.qscale = torch.randn(num_queries, 1, generator=g)
        self.qbias = 0.5 * torch.randn(num_queries, out_dim, generator=g)
        self.offset = 20.0 + 2.0 * torch.randn(out_dim, generator=g)
        self.num_queries = num_queries

    def lengths(self, samples, student_ids) -> list[int]:
        return [len(ids) + self.num_queries for ids in student_ids]

    def targets(self, samples, student_ids, vision=None) -> list[TargetRows]:
        out = []
        for ids in student_ids:
            z = torch.tanh(self.feat[torch.tensor(ids) % _BUCKETS].mean(0)) @ self.proj  # (D,)
            out.append(TargetRows(rows=self.offset + self.qbias + self.qscale * z))
        return out


def t5_like_ids(text: str, window: int, vocab: int) -> list[int]:
    """A stand-in for T5 sentencepiece: word hashes + EOS(1), padded with 0 to `window`."""
    ids = [2 + zlib.crc32(w.encode("utf-8")) % (vocab - 2) for w in text.split()][: window - 1] + [
        1
    ]
    return ids + [0] * (window - len(ids))


class MockSlotTeacher:
    """Seeded-resampler targets: one row per real T5-window slot (words + EOS), built from
    the slot's id, its position and its left neighbour (context mixing)."""

    is_mock = True

    def __init__(self, pack_id: str, window: int, vocab: int, out_dim: int, seed: int = 4321):
        g = _generator(seed)
        self.identity = MockIdentity(
            pack_id, extra={"window": window, "out_dim": out_dim}
        ).as_dict()
        self.window, self.vocab = window, vocab
        self.feat = torch.randn(_BUCKETS, _FEAT, generator=g)
        self.proj = torch.randn(_FEAT, out_dim, generator=g) / _FEAT**0.5
        self.pos = torch.randn(window, out_dim, generator=g)

    def lengths(self, samples, student_ids) -> list[int]:
        return [sum(1 for i in t5_like_ids(s.text, self.window, self.vocab) if i) for s in samples]

    def targets(self, samples, student_ids, vision=None) -> list[TargetRows]:
        out = []
        for sample in samples:
            ids = t5_like_ids(sample.text, self.window, self.vocab)
            n = sum(1 for i in ids if i)
            rows = self.feat[torch.tensor(ids[:n]) % _BUCKETS] @ self.proj + self.pos[:n]
            rows = rows + 0.5 * torch.cat([torch.zeros_like(rows[:1]), rows[:-1]])
            out.append(TargetRows(rows=rows, seed_ids=ids))
        return out


class MockTokenTeacher:
    """Token-aligned targets: one row per student token, from the token's id, its position and
    a causal running mix of earlier rows (like a decoder's final states)."""

    is_mock = True

    def __init__(self, pack_id: str, out_dim: int, sup_start: int, seed: int = 2718):
        g = _generator(seed)
        self.identity = MockIdentity(pack_id, extra={"out_dim": out_dim}).as_dict()
        self.feat = torch.randn(_BUCKETS, _FEAT, generator=g)
        self.proj = torch.randn(_FEAT, out_dim, generator=g) / _FEAT**0.5
        self.sup_start = sup_start

    def lengths(self, samples, student_ids) -> list[int]:
        return [len(ids) for ids in student_ids]

    def _base(self, ids) -> torch.Tensor:
        return self.feat[torch.tensor(ids) % _BUCKETS] @ self.proj  # (L, D)

    def _rows(self, base: torch.Tensor, sup_start: int) -> TargetRows:
        steps = torch.arange(1, base.shape[0] + 1, dtype=torch.float32)[:, None]
        rows = 0.6 * base + 0.4 * torch.cumsum(base, 0) / steps
        return TargetRows(rows=rows, sup_start=min(sup_start, base.shape[0] - 1))

    def targets(self, samples: Sequence, student_ids, vision=None) -> list[TargetRows]:
        return [self._rows(self._base(ids), self.sup_start) for ids in student_ids]


MOCK_VOCAB = 4096  # ids of the mock teacher's token table (the shared vocabulary of the fit)
_VIS_FEAT = 48  # features per 32-px image cell


def cell_features(pixels: np.ndarray, cell: int = 32) -> torch.Tensor:
    """(gh·gw, 48) features of a preprocessed image (3, H, W), one row per `cell`² merge cell,
    row-major like the vision tower's merged tokens: mean colour, mean square, the 2×2
    sub-cell means of the grey level, and sinusoids of the cell position."""
    c, h, w = pixels.shape
    gh, gw = h // cell, w // cell
    x = torch.from_numpy(np.ascontiguousarray(pixels, dtype=np.float32))
    blocks = x.reshape(c, gh, cell, gw, cell).permute(1, 3, 0, 2, 4).reshape(gh * gw, c, cell, cell)
    mean, sq = blocks.mean((2, 3)), blocks.pow(2).mean((2, 3))
    half = cell // 2
    grey = blocks.mean(1).reshape(-1, 2, half, 2, half).mean((2, 4)).reshape(-1, 4)
    r = (torch.arange(gh, dtype=torch.float32)[:, None].expand(gh, gw).reshape(-1, 1) + 0.5) / gh
    q = (torch.arange(gw, dtype=torch.float32)[None, :].expand(gh, gw).reshape(-1, 1) + 0.5) / gw
    k = torch.arange(1, 10, dtype=torch.float32)[None, :] * math.pi
    pos = torch.cat(
        [torch.sin(k * r), torch.cos(k * r), torch.sin(k * q), torch.cos(k * q), r, q], 1
    )[:, : _VIS_FEAT - 10]
    return torch.cat([mean, sq, grey, pos], 1)  # (N, 48)


class MockVisionTokenTeacher(MockTokenTeacher):
    """Token-aligned targets for an image-aware pack (MageFlow). A mock vision tower with the
    real shapes (one vis_dim row per 32-px merge cell of the engine-preprocessed image) whose
    rows live in the span of the mock teacher's token table (as mmproj rows live in the LLM's
    input space); image-token targets come from those raw rows, so only a model that sees
    them (vis_in, or the spliced student states) can predict them."""

    def __init__(
        self,
        pack_id: str,
        out_dim: int,
        vis_dim: int,
        preprocess,
        sup_start_text: int,
        sup_start_image: int,
        seed: int = 2718,
    ):
        super().__init__(pack_id, out_dim, sup_start_text, seed)
        g = _generator(seed + 1)
        self.identity = MockIdentity(
            pack_id, version=2, extra={"out_dim": out_dim, "vis_dim": vis_dim}
        ).as_dict()
        self.table = torch.randn(MOCK_VOCAB, vis_dim, generator=g)
        pick = torch.randperm(MOCK_VOCAB, generator=g)[:_VIS_FEAT]
        self.vis_basis = self.table[pick] / _VIS_FEAT**0.5  # (48, vis)
        self.vis_mix = torch.randn(vis_dim, out_dim, generator=g) / vis_dim**0.5
        self.preprocess, self.sup_image = preprocess, sup_start_image

    def embed_table(self) -> torch.Tensor:
        return self.table

    def vision(self, images: Sequence) -> list[torch.Tensor]:
        """Raw vision rows (n_i, vis_dim) float32 for each image path, in order."""
        return [cell_features(self.preprocess(p)) @ self.vis_basis for p in images]

    def targets(self, samples: Sequence, student_ids, vision=None) -> list[TargetRows]:
        out = []
        for k, (sample, ids) in enumerate(zip(samples, student_ids)):
            base = self._base(ids)
            for seg in vision[k] if vision else ():
                base[seg.start : seg.start + seg.rows.shape[0]] = (
                    2.0 * seg.rows.float() @ self.vis_mix
                )
            out.append(self._rows(base, self.sup_image if sample.images else self.sup_start))
        return out
