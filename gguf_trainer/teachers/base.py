"""What a teacher is to the rest of the tool: its per-sample output and its interface.

Teachers (the real ones in this package, the packs' mock ones) return `TargetRows`; image
teachers take `VisionSegment`s; precompute drives anything with the `Teacher` interface.
The bottom of the teachers' ladder: imports nothing of gguf_trainer, and no torch at run
time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass
class TargetRows:
    """A teacher's output for one sample: only the rows that must be stored.

    rows      [n, out_dim]: resampler = all queries; seeded = the real slots (incl. EOS);
              token-aligned = one row per student token.
    seed_ids  [num_queries] ints (seeded only): the T5 window ids, pad 0.
    sup_start first supervised-for-the-DiT position (token-aligned: 64 edit / 34 t2i).
    """

    rows: torch.Tensor
    seed_ids: list[int] | None = None
    sup_start: int = 0


@dataclass
class VisionSegment:
    """One reference image of a sample: its raw vision-tower rows and where they go.

    start  first `<|image_pad|>` position of the image's run in the student ids (the teacher
           tokenizes the same template, so the position is the same on both sides);
    rows   [n, vis_dim] raw rows (the mmproj output the engine gives both vision_proj and vis_in).
    """

    start: int
    rows: torch.Tensor


class Teacher(Protocol):
    """What precompute needs from a teacher (real or mock). `samples` are
    `gguf_trainer.data.samples.Sample` records (text, images, extra fields)."""

    identity: dict  # part of the shard fingerprint: snapshot revision or config hash, or "mock"
    is_mock: bool

    def lengths(self, samples: Sequence, student_ids: Sequence[Sequence[int]]) -> list[int]:
        """Tokens each sample costs the teacher, for length-sorted budget batching."""

    def targets(self, samples: Sequence, student_ids: Sequence[Sequence[int]],
                vision: Sequence[Sequence[VisionSegment]] | None = None) -> list[TargetRows]:
        """One TargetRows per sample, in order. `vision` (image-aware teachers): per sample its
        images' segments, spliced into the teacher's own input as the engine splices them."""

    def close(self) -> None:
        """Free the teacher's memory (weights, caches); the stage that loaded it calls this."""

    # Image-aware teachers (packs with vis_dim > 0) also have:
    #   vision(images: Sequence[Path]) -> list[Tensor[n_i, vis_dim]]  raw rows per image
    #   embed_table() -> Tensor[vocab, vis_dim]                       for the vision_proj fit
