"""Mock teachers: synthetic targets with each pack's real row shapes.

Each is a fixed random function of the prompt that an adapter can learn from the
student's states (its eval beats the per-dimension mean baseline), so the whole
pipeline can be exercised without the real multi-GB teacher. Never a usable adapter.
The functions are deterministic (fixed seeds, CPU fp32), so shards are reproducible.
"""

from __future__ import annotations

import zlib
from typing import Sequence

import torch

from .base import MockIdentity, TargetRows

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

    def lengths(self, texts, student_ids) -> list[int]:
        return [len(ids) + self.num_queries for ids in student_ids]

    def targets(self, texts, student_ids) -> list[TargetRows]:
        out = []
        for ids in student_ids:
            z = torch.tanh(self.feat[torch.tensor(ids) % _BUCKETS].mean(0)) @ self.proj  # (D,)
            out.append(TargetRows(rows=self.offset + self.qbias + self.qscale * z))
        return out


def t5_like_ids(text: str, window: int, vocab: int) -> list[int]:
    """A stand-in for T5 sentencepiece: word hashes + EOS(1), padded with 0 to `window`."""
    ids = [2 + zlib.crc32(w.encode("utf-8")) % (vocab - 2) for w in text.split()][: window - 1] + [1]
    return ids + [0] * (window - len(ids))


class MockSlotTeacher:
    """Seeded-resampler targets: one row per real T5-window slot (words + EOS), built from
    the slot's id, its position and its left neighbour (context mixing)."""

    is_mock = True

    def __init__(self, pack_id: str, window: int, vocab: int, out_dim: int, seed: int = 4321):
        g = _generator(seed)
        self.identity = MockIdentity(pack_id, extra={"window": window, "out_dim": out_dim}).as_dict()
        self.window, self.vocab = window, vocab
        self.feat = torch.randn(_BUCKETS, _FEAT, generator=g)
        self.proj = torch.randn(_FEAT, out_dim, generator=g) / _FEAT**0.5
        self.pos = torch.randn(window, out_dim, generator=g)

    def lengths(self, texts, student_ids) -> list[int]:
        return [sum(1 for i in t5_like_ids(t, self.window, self.vocab) if i) for t in texts]

    def targets(self, texts, student_ids) -> list[TargetRows]:
        out = []
        for text in texts:
            ids = t5_like_ids(text, self.window, self.vocab)
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

    def lengths(self, texts, student_ids) -> list[int]:
        return [len(ids) for ids in student_ids]

    def targets(self, texts: Sequence[str], student_ids) -> list[TargetRows]:
        out = []
        for ids in student_ids:
            base = self.feat[torch.tensor(ids) % _BUCKETS] @ self.proj
            steps = torch.arange(1, len(ids) + 1, dtype=torch.float32)[:, None]
            rows = 0.6 * base + 0.4 * torch.cumsum(base, 0) / steps
            out.append(TargetRows(rows=rows, sup_start=min(self.sup_start, len(ids) - 1)))
        return out
