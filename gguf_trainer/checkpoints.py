"""Training checkpoints: the format, atomic save, safe load, the model they hold, last and best.

A checkpoint (`<which>.pt`, which = last|best) holds only tensors and plain values, so it
is loaded with `weights_only=True`: model state, optimizer state, step, shard-stream
position, RNG, best score, and what export/eval need (adapter config, target statistics,
planned steps, pack, mock flag). Beside it `<which>.json` is a small human-readable summary
that status and the done-test read without torch.load. Must not: know stages or packs.

    save_checkpoint(folder, LAST, model, opt, prog, extra)
    ck = load_checkpoint(checkpoint_path(folder, BEST))
    model = model_from_checkpoint(ck)
"""

from __future__ import annotations

import math
import pickle
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from . import atomic
from .errors import UserError
from .paths import checkpoint_file, checkpoint_side_file
from .shards import StreamPos

LAST, BEST = "last", "best"


@dataclass
class TrainProgress:
    """Everything a resume restores. The checkpoint wins for each field."""

    step: int = 0
    stream: StreamPos = None  # type: ignore[assignment]
    best_val_cos: float = -1.0

    def __post_init__(self):
        self.stream = self.stream or StreamPos()


def checkpoint_path(folder: Path, which: str) -> Path:
    return Path(folder) / checkpoint_file(which)


def side_path(folder: Path, which: str) -> Path:
    return Path(folder) / checkpoint_side_file(which)


def finite(d: dict) -> dict:
    """JSON has no NaN/inf: non-finite floats become null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def save_checkpoint(folder: Path, which: str, model, opt, prog: TrainProgress, extra: dict) -> None:
    state = {
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": opt.state_dict(), "step": prog.step, "stream": prog.stream.as_dict(),
        "best_val_cos": prog.best_val_cos, "rng": torch.get_rng_state(), **extra,
    }
    with atomic.atomic_path(checkpoint_path(folder, which), suffix=".pt") as tmp:
        torch.save(state, tmp)
    side = {"step": prog.step, "steps": extra["planned_steps"], "val_cos": extra.get("val_cos"),
            "best_val_cos": prog.best_val_cos, "time": time.time(), "mock": extra.get("mock", False)}
    atomic.write_json(side_path(folder, which), finite(side))


REQUIRED_KEYS = ("model", "optimizer", "step", "stream", "best_val_cos", "rng", "config", "planned_steps")


def load_checkpoint(path: Path) -> dict:
    """Checkpoints hold only tensors and plain values: loaded with weights_only=True. A
    truncated, damaged or foreign file is a UserError saying which file and what to do."""
    fix = "delete it to restart training from the other checkpoint or from scratch"
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile,
            ValueError, AttributeError, ImportError) as e:  # what torch.load raises on foreign bytes
        raise UserError(f"{path} is damaged or not a gguf-trainer checkpoint ({type(e).__name__}); {fix}.") from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(ck, dict) or k not in ck]
    if missing:
        raise UserError(f"{path} is not a gguf-trainer checkpoint (no {missing[0]!r}); {fix}.")
    return ck


def read_side(folder: Path, which: str) -> dict:
    """`<which>.json` as written with the checkpoint, {} when absent or unreadable."""
    side = atomic.read_json(side_path(folder, which), {})
    return side if isinstance(side, dict) else {}


def model_from_checkpoint(ck: dict):
    from .adapters import AdapterConfig, build_adapter

    model = build_adapter(AdapterConfig.from_dict(ck["config"]))
    model.load_state_dict(ck["model"])
    return model.eval()
