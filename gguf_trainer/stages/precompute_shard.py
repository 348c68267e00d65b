"""One precompute shard's tensors: tokenize the records, drop (and count) samples over the
student's or the teacher's length limit — never truncate one side only —, sort by the
teacher's length and pack teacher batches by a token budget, sort by the student's length and
pack student batches likewise (real ÷ processed tokens stays high on heavy-tailed prompt
lengths), and keep only the rows that must be stored. A stop request takes effect before the
next teacher batch (Stopped). Writes nothing: precompute.py writes the shard.

    samples, lengths, dropped = tokenize_samples(ctx, records, start)
    tensors = build_shard(ctx, samples, report, on_batch, lengths)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.machine import hardware
from gguf_trainer.model import vision
from gguf_trainer.model.adapters import TOKEN_ALIGNED_KINDS
from gguf_trainer.stages.precompute_context import Context
from gguf_trainer.stages.stage_list import Stopped

log = logging.getLogger(__name__)


@dataclass
class _Sample:
    index: int  # position in the split
    sample: object  # the gguf_trainer.data.samples.Sample record the teacher gets
    ids: list[int]  # the student's token ids
    vision: list = None  # VisionSegment per image (raw rows + start in ids); [] without images
    # (slot kinds: the start is the image's first <|image_pad|> slot in the teacher's template)


def _student_rows(ctx: Context, samples: list[_Sample]) -> list[torch.Tensor]:
    from gguf_trainer.model.student import pad_batch

    out: list[torch.Tensor | None] = [None] * len(samples)
    b = ctx.budgets
    for batch in hardware.budget_batches(
        [len(s.ids) for s in samples], b.student_batch, b.student_tok_budget
    ):
        ids, keep = pad_batch([samples[i].ids for i in batch])
        keep, pos = _template_pads(ctx.pack.padding, [samples[i].ids for i in batch], keep)
        splices = [
            (j, seg.start, seg.rows.float() @ ctx.vision_proj.T)
            for j, i in enumerate(batch)
            for seg in samples[i].vision or ()
        ] if ctx.vision_proj is not None else []  # a slot kind's student never sees a picture
        with torch.no_grad():
            h = (
                ctx.student.hidden(
                    ids.to(ctx.device), keep.to(ctx.device), splices=splices, position_ids=pos
                )
                .float()
                .cpu()
            )
        for j, i in enumerate(batch):
            out[i] = h[j, : len(samples[i].ids)].to(torch.bfloat16)
    return out


def _template_pads(padding, id_lists, keep: torch.Tensor):
    """The family's appended pads (template_padding.py) masked as student keys, as the engine
    masks them, and their rope positions (None: 0..L-1)."""
    if not padding.pads:
        return keep, None
    keep = keep.clone()
    pos = torch.arange(keep.shape[1]).repeat(len(id_lists), 1)
    for j, ids in enumerate(id_lists):
        keep[j, padding.real_length(ids) :] = False
        at = padding.positions(ids)
        if at is not None:
            pos[j, : len(at)] = torch.tensor(at)
    return keep, pos


def _teacher_rows(
    ctx: Context, samples: list[_Sample], lengths: list[int], report, on_batch
) -> list:
    out: list = [None] * len(samples)
    b = ctx.budgets
    batches = hardware.budget_batches(lengths, b.teacher_batch, b.tok_budget)
    for k, batch in enumerate(batches):
        if report.stop_requested():
            raise Stopped()
        with torch.no_grad():
            vis = ([samples[i].vision or [] for i in batch]
                   if ctx.vision_proj is not None or any(samples[i].vision for i in batch)
                   else None)  # a text-only batch of a slot kind: the text path as before
            rows = ctx.teacher.targets(
                [samples[i].sample for i in batch], [samples[i].ids for i in batch], vis
            )
        for i, r in zip(batch, rows):
            out[i] = r
        on_batch((k + 1) / len(batches))
    return out


def build_shard(
    ctx: Context, samples: list[_Sample], report, on_batch, lengths: list[int] | None = None,
    pad_rows: int = 0, from_start: bool = False, slot_vision: bool = False,
) -> dict[str, torch.Tensor]:
    """`pad_rows`: K > 0 stores only K evenly spaced pad rows of each sample's targets
    (data/recipe.py stored_pad_rows); `from_start`: no target row before the sample's start
    row (data/recipe.py stores_from_start). Either way `target_pos` names the template row of
    each stored row; neither (the default) stores every row, as every shard did before. The
    student's states of every template row are stored either way: the adapter reads them.
    `slot_vision` (a slot kind whose split has references): the vision tensors in every shard,
    vis_pos naming teacher slots (the shard's seed_ids) instead of student tokens."""
    if lengths is None:
        lengths = ctx.teacher.lengths([s.sample for s in samples], [s.ids for s in samples])
    targets = _teacher_rows(ctx, samples, lengths, report, on_batch)
    students = _student_rows(ctx, samples)
    kept = _stored_rows(ctx.pack, samples, targets, pad_rows, from_start)
    rows = torch.cat([t.rows.float() if k is None else t.rows.float()[k]
                      for t, k in zip(targets, kept)])  # (Tt, D)
    tensors = {
        "student_rows": torch.cat(students),
        "student_ids": torch.tensor([i for s in samples for i in s.ids], dtype=torch.int32),
        "student_len": torch.tensor([len(s.ids) for s in samples], dtype=torch.int32),
        "target_rows": rows.to(torch.bfloat16),
        "target_len": torch.tensor([t.rows.shape[0] if k is None else len(k)
                                    for t, k in zip(targets, kept)], dtype=torch.int32),
        "sample_index": torch.tensor([s.index for s in samples], dtype=torch.int64),
    }
    if pad_rows or from_start:
        tensors["target_pos"] = torch.cat([torch.tensor(k, dtype=torch.int32) for k in kept])
    if ctx.vision_proj is not None and not ctx.pack.dit_reads_vision_rows:
        keep = _keep_rows(samples, targets)
        if pad_rows or from_start:  # the image slots among the stored rows
            at = torch.tensor([0] + [t.rows.shape[0] for t in targets]).cumsum(0)
            keep = torch.cat([keep[int(a):][torch.tensor(k, dtype=torch.long)]
                              for a, k in zip(at, kept)])
        tensors["target_keep"] = keep
    # Moments of the rows as stored (bf16) that the loss reads, so the statistics describe
    # the training targets.
    stored = tensors["target_rows"].double()
    if "target_keep" in tensors:
        stored = stored[tensors["target_keep"]]
    tensors["moment_sum"] = stored.sum(0)
    tensors["moment_sq"] = (stored * stored).sum(0)
    tensors["moment_n"] = torch.tensor([stored.shape[0]], dtype=torch.int64)
    if targets[0].seed_ids is not None:
        tensors["seed_ids"] = torch.tensor([t.seed_ids for t in targets], dtype=torch.int32)
    if ctx.pack.adapter_kind in TOKEN_ALIGNED_KINDS:  # one row per token: the DiT's first row
        tensors["sup_start"] = torch.tensor([t.sup_start for t in targets], dtype=torch.int32)
    if ctx.vision_proj is not None:
        tensors.update(_vision_tensors(samples, ctx.vision_proj.shape[1]))
    elif slot_vision:
        tensors.update(_vision_tensors(samples, ctx.teacher.vis_dim))
    tensors.update(ctx.pack.shard_extras(targets))  # a second target set (the bridge's bank)
    return tensors


def _stored_rows(pack, samples: list[_Sample], targets: list, pad_rows: int,
                 from_start: bool = False) -> list:
    """Per sample the template rows whose targets are stored: None for every row (pad_rows
    0, not from_start), else its real rows — from its start row on (`sup_start`) when
    from_start — and every pad or K evenly spaced ones (token-aligned: row j is template id
    j)."""
    from gguf_trainer.data.recipe import kept_pad_rows

    if not pad_rows and not from_start:
        return [None] * len(samples)
    out = []
    for s, t in zip(samples, targets):
        assert t.rows.shape[0] == len(s.ids), "pads are template rows: token-aligned"
        n_real = pack.padding.real_length(s.ids)
        first = min(t.sup_start, n_real) if from_start else 0
        pads = (kept_pad_rows(n_real, len(s.ids), pad_rows) if pad_rows
                else list(range(n_real, len(s.ids))))
        out.append(list(range(first, n_real)) + pads)
    return out


def _keep_rows(samples: list[_Sample], targets: list) -> torch.Tensor:
    """(Tt,) bool: every target row but the image slots (the pads each image's rows are
    spliced at), which a DiT that lays reference latents there never reads
    (pack.dit_reads_vision_rows False). Token-aligned: target row j is student token j."""
    keep = []
    for s, t in zip(samples, targets):
        assert t.rows.shape[0] == len(s.ids), "image slots are student positions: token-aligned"
        k = torch.ones(t.rows.shape[0], dtype=torch.bool)
        for seg in s.vision or ():
            k[seg.start : seg.start + seg.rows.shape[0]] = False
        keep.append(k)
    return torch.cat(keep)


def _vision_tensors(samples: list[_Sample], vis_dim: int) -> dict[str, torch.Tensor]:
    """Raw vision rows of every image (bf16), the token position of each row, rows per sample."""
    segs = [seg for s in samples for seg in s.vision or ()]
    rows = torch.cat([seg.rows.float() for seg in segs]) if segs else torch.zeros(0, vis_dim)
    pos = [p for seg in segs for p in range(seg.start, seg.start + seg.rows.shape[0])]
    return {
        "vis_rows": rows.to(torch.bfloat16),
        "vis_pos": torch.tensor(pos, dtype=torch.int32),
        "vis_len": torch.tensor(
            [sum(seg.rows.shape[0] for seg in s.vision or ()) for s in samples], dtype=torch.int32
        ),
    }


def _vision_rows(ctx: Context, records: list, slot_vision: bool = False
                 ) -> list[list[torch.Tensor]]:
    """Raw vision rows per image of each record ([] for text-only records or packs)."""
    if (ctx.vision_proj is None and not slot_vision) or not any(r.images for r in records):
        return [[] for _ in records]
    with torch.no_grad():  # one call for the shard's images: the teacher batches its tower
        rows = list(ctx.teacher.vision([p for r in records for p in ctx.pack.vision_inputs(r)]))
    out, at = [], 0
    for r in records:
        out.append(rows[at : at + len(r.images)])
        at += len(r.images)
    return out


def _segments(pack, ids: list[int], rows: list[torch.Tensor]):
    """The VisionSegments of one sample, or None when its image-token runs do not match its
    images (a prompt that spells `<|image_pad|>` itself): such a sample is dropped."""
    from gguf_trainer.teachers.base import VisionSegment

    if not pack.image_pad_id:
        return []
    runs = vision.image_runs(ids, pack.image_pad_id)
    if [n for _, n in runs] != [r.shape[0] for r in rows]:
        return None
    return [VisionSegment(start, r) for (start, _), r in zip(runs, rows)]


def tokenize_samples(
    ctx: Context, records: list, start: int, slot_vision: bool = False
) -> tuple[list[_Sample], list[int], dict]:
    """The samples within both length limits, their teacher lengths, and the drop counts.
    `slot_vision`: a slot kind's references, placed by the teacher on its template's slots."""
    pack = ctx.pack
    raw = _vision_rows(ctx, records, slot_vision)
    encode = engine_bpe(ctx.student.tokenizer).encode  # the engine's ids, piece by piece
    ids = [pack.student_ids(encode, r, [v.shape[0] for v in rows]) for r, rows in zip(records, raw)]
    if slot_vision:  # the student reads the raw prompt: the images live in the teacher's slots
        segments = [ctx.teacher.vision_segments(rows) if rows else [] for rows in raw]
    else:
        segments = [_segments(pack, t, rows) for t, rows in zip(ids, raw)]
    within = [
        _Sample(start + k, r, t, seg)
        for k, (r, t, seg) in enumerate(zip(records, ids, segments))
        if len(t) <= pack.max_len_student and seg is not None
    ]
    n_spelled = sum(1 for seg in segments if seg is None)
    if n_spelled:
        log.warning(
            "precompute: dropped %d samples whose text spells the image token itself", n_spelled
        )
    dropped = {"student": len(records) - len(within) - n_spelled, "teacher": 0}
    kw = {"vision": [s.vision for s in within]} if slot_vision else {}
    lengths = (
        ctx.teacher.lengths([s.sample for s in within], [s.ids for s in within], **kw)
        if within else []
    )
    keep = [(s, n) for s, n in zip(within, lengths) if n <= pack.max_len_teacher]
    dropped["teacher"] = len(within) - len(keep)
    return [s for s, _ in keep], [n for _, n in keep], dropped


def log_dropped(split: str, k: int, dropped: dict, pack) -> None:
    for side, limit in (("student", pack.max_len_student), ("teacher", pack.max_len_teacher)):
        if dropped[side]:
            # never truncate: a cut sequence on one side no longer matches the other side's rows
            log.warning(
                "precompute[%s] shard %05d: dropped %d samples longer than %d %s tokens",
                split,
                k,
                dropped[side],
                limit,
                side,
            )
