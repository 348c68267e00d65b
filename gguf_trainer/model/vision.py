"""The vision bridge of token-aligned vision packs (MageFlow): the frozen `vision_proj` and
the image-token runs it is spliced into.

The engine maps every raw mmproj embed (the teacher's LLM input space, vis_dim) to the
student's input space with `vision_proj` (no bias) and splices the result over the
sample's `<|image_pad|>` run (engine-contract §2, §3.2). The map is fitted once per project,
by ridge least squares from the teacher's token embedding table to the student's over their
shared vocabulary (the first min(V_t, V_s) ids: both use the Qwen vocabulary), and stored as
`vision_proj.safetensors` in the project with the inputs it was fitted from; the sha256 of
the map is
an input of the precompute fingerprint, the trainer installs it frozen and the export
writes it in f32.

    sha = ensure_vision_proj(path, inputs, lambda: (teacher_table, student_table))
    w = load_vision_proj(path)                      # (in_dim, vis_dim) float32
    runs = image_runs(ids, pad_id)                  # [(start, n), ...] one per image
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from gguf_trainer.base import atomic
from gguf_trainer.base.errors import UserError
from gguf_trainer.model.ridge import LAMBDA_REL, RidgeAccumulator

log = logging.getLogger(__name__)

METHOD = "ridge-least-squares/1"
TENSOR = "vision_proj.weight"  # (in_dim, vis_dim), as nn.Linear(vis_dim, in_dim).weight
_CHUNK = 8192  # vocabulary rows per float64 product
# Where the teacher's token table lives in a Qwen3-VL snapshot (first match wins).
TEACHER_TABLE_NAMES = ("model.language_model.embed_tokens.weight",
                       "language_model.embed_tokens.weight", "model.embed_tokens.weight")


def fit_vision_proj(
    teacher_table: torch.Tensor, student_table: torch.Tensor
) -> tuple[torch.Tensor, dict]:
    """W (in_dim, vis_dim) float32 minimising ||E_t Wᵀ - E_s||² + λ||W||² over the shared
    vocabulary, and the fit's quality over the same rows (cos mean / 5th percentile, rel_mse)."""
    n = min(teacher_table.shape[0], student_table.shape[0])
    if n < teacher_table.shape[1]:
        log.warning(
            "vision_proj: only %d shared ids for %d teacher dims; the fit is underdetermined",
            n,
            teacher_table.shape[1],
        )
    acc = RidgeAccumulator(teacher_table.shape[1], student_table.shape[1])
    for a in range(0, n, _CHUNK):
        b = min(a + _CHUNK, n)
        acc.add(teacher_table[a:b], student_table[a:b])
    weight, _ = acc.solve(bias=False)
    cos, err, ref = [], 0.0, 0.0
    for a in range(0, n, _CHUNK):
        b = min(a + _CHUNK, n)
        pred = teacher_table[a:b].double() @ weight.double().T
        true = student_table[a:b].double()
        cos.append(torch.nn.functional.cosine_similarity(pred, true, dim=-1, eps=1e-12))
        err += float((pred - true).pow(2).sum())
        ref += float(true.pow(2).sum())
    c = torch.cat(cos)
    fit = {
        "shared_vocab": n,
        "cos_mean": float(c.mean()),
        "cos_p5": float(c.quantile(0.05)),
        "rel_mse": err / max(ref, 1e-30),
        "lambda_rel": LAMBDA_REL,
    }
    return weight, fit


def read_inputs(path: Path) -> dict | None:
    """The inputs recorded in a vision_proj file, or None when it is missing or unreadable."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return json.loads((f.metadata() or {}).get("inputs", "null"))
    except (SafetensorError, OSError, ValueError):
        return None


def _sha256(path: Path) -> str:
    """sha256 of the map itself (its float32 bytes): safetensors writes its metadata in no
    fixed order, so the file's own bytes differ between two identical fits."""
    w = load_vision_proj(path).contiguous()
    return hashlib.sha256(str(tuple(w.shape)).encode() + w.numpy().tobytes()).hexdigest()


def fitted_sha(path: Path, inputs: dict) -> str | None:
    """sha256 of the vision_proj map at `path` when it was fitted from exactly `inputs`
    (student file, teacher, method), else None. Looks only: ensure_vision_proj fits."""
    inputs = {**inputs, "method": METHOD, "lambda_rel": LAMBDA_REL}
    if path.is_file() and read_inputs(path) == json.loads(json.dumps(inputs)):
        try:
            return _sha256(path)
        except UserError:
            return None  # metadata readable but tensor damaged: to refit
    return None


def ensure_vision_proj(
    path: Path, inputs: dict, load_tables: Callable[[], tuple[torch.Tensor, torch.Tensor]]
) -> str:
    """sha256 of the vision_proj map at `path`, fitting it first unless it was already
    fitted from exactly `inputs` (student file, teacher, method): once per project."""
    sha = fitted_sha(path, inputs)
    if sha is not None:
        return sha
    inputs = {**inputs, "method": METHOD, "lambda_rel": LAMBDA_REL}
    teacher_table, student_table = load_tables()
    weight, fit = fit_vision_proj(teacher_table.float(), student_table.float())
    log.info(
        "vision_proj: ridge fit over %d shared ids, %d -> %d: cos mean %.4f, p5 %.4f, rel_mse %.4f",
        fit["shared_vocab"],
        weight.shape[1],
        weight.shape[0],
        fit["cos_mean"],
        fit["cos_p5"],
        fit["rel_mse"],
    )
    meta = {"inputs": json.dumps(inputs, sort_keys=True), "fit": json.dumps(fit)}
    with atomic.atomic_path(path, suffix=".safetensors") as tmp:
        save_file({TENSOR: weight.contiguous()}, str(tmp), metadata=meta)
    return _sha256(path)


def load_vision_proj(path: Path) -> torch.Tensor:
    """(in_dim, vis_dim) float32; UserError if the file is missing or damaged."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return f.get_tensor(TENSOR).float()
    except (SafetensorError, OSError, ValueError):
        raise UserError(
            f"{path} is missing or damaged; delete it and start again to refit "
            "the vision projection."
        ) from None


def load_teacher_table(snapshot: Path) -> torch.Tensor:
    """The teacher's token embedding table from its safetensors, without loading the model."""
    for file in sorted(Path(snapshot).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            names = set(f.keys())
            for name in TEACHER_TABLE_NAMES:
                if name in names:
                    return f.get_tensor(name).float()
    raise UserError(
        f"{snapshot} has no token embedding table ({TEACHER_TABLE_NAMES[0]}); "
        "download the complete teacher snapshot."
    )


def image_runs(ids: Sequence[int], pad_id: int) -> list[tuple[int, int]]:
    """(start, length) of each run of `pad_id` in `ids`, in order: one run per image."""
    runs, start = [], None
    for i, t in enumerate(list(ids) + [None]):
        if t == pad_id and start is None:
            start = i
        elif t != pad_id and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


def splices(
    runs: Sequence[tuple[int, int]],
    raw: Sequence[torch.Tensor],
    weight: torch.Tensor,
    batch_index: int,
) -> list[tuple[int, int, torch.Tensor]]:
    """`Student.hidden` splices for one sample: each image's raw rows mapped by vision_proj."""
    if [n for _, n in runs] != [r.shape[0] for r in raw]:
        raise ValueError(
            f"image-token runs {runs} do not match embeds of {[r.shape[0] for r in raw]} rows"
        )
    return [(batch_index, s, r.float() @ weight.T) for (s, _), r in zip(runs, raw)]
