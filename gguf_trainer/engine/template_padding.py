"""The pads the engine appends to a family's template ids, and what the student and the teacher
do with them (engine-families §1, ggk 0.9.7 conditioner.hpp and tokenizers/tokenizer.cpp).

`LLMEmbedder::tokenize` (conditioner.hpp 2551-2623) pads the template's ids on the right with
151643 to `min_length` (Flux.2 klein 512, SeFi-Image 1024; FLUX.3: the next multiple of 80,
capped at max_length 4096) through `Tokenizer::pad_tokens` (tokenizer.cpp 39-195): a sequence
longer than max_length is cut to max_length, never padded. The pads are masked as keys for
the student and the full teacher alike (the causal mask plus the pad keys, conditioner.hpp
2649-2663); FLUX.3 also puts every pad at rope position 1 on every axis (2698-2712). The adapter
then reads every row, pads included, with no mask (2727-2735). No torch here: packs, teachers
and the check share it.

    PAD = Padding(min_length=512)
    ids = PAD.apply(template_ids)            # [..., 151643, 151643, ...]
    n_real = PAD.real_length(ids)            # the keys the student and teacher may attend to
    pos = PAD.positions(ids)                 # None: 0..L-1 (every family but FLUX.3)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gguf_trainer.engine.qwen_ids import PAD_ID


@dataclass(frozen=True)
class Padding:
    """A family's padding rule; the default pads nothing."""

    min_length: int = 0  # pad to at least this many ids
    multiple: int = 0  # FLUX.3: pad to the next multiple of this (80), capped at max_length
    max_length: int = 0  # the engine's max_length (0 = none): longer templates are cut to it
    pad_position: int | None = None  # FLUX.3: every pad's rope position (1); None = its index

    @property
    def pads(self) -> bool:
        return bool(self.min_length or self.multiple)

    def apply(self, ids: Sequence[int]) -> list[int]:
        """`pad_tokens` with no BOS/EOS (the Qwen tokenizer adds none): cut to max_length when
        longer, else padded on the right to min_length."""
        ids = list(ids)
        limit = self.max_length or 100000000
        target = self.min_length
        if self.multiple:
            target = min(limit, -(-len(ids) // self.multiple) * self.multiple)
        if max(target, len(ids)) > limit:
            return ids[:limit]
        return ids + [PAD_ID] * max(0, target - len(ids))

    def real_length(self, ids: Sequence[int]) -> int:
        """The ids before the appended pads."""
        return unpadded_length(ids) if self.pads else len(ids)

    def positions(self, ids: Sequence[int]) -> list[int] | None:
        """The rope position of every id, or None for 0..L-1."""
        if self.pad_position is None:
            return None
        n = self.real_length(ids)
        return list(range(n)) + [self.pad_position] * (len(ids) - n)


def unpadded_length(ids: Sequence[int], pad_id: int = PAD_ID) -> int:
    """The ids before a trailing run of the pad (every template ends in its assistant marker,
    never in the pad, so the run is the appended pads)."""
    n = len(ids)
    while n and int(ids[n - 1]) == pad_id:
        n -= 1
    return n
