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

import pickle
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from gguf_trainer.base import atomic
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.jsonvals import finite
from gguf_trainer.base.paths import checkpoint_file, checkpoint_side_file
from gguf_trainer.data.shards import StreamPos


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


def save_checkpoint(folder: Path, which: str, model, opt, prog: TrainProgress, extra: dict) -> None:
    state = {
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": opt.state_dict(), "step": prog.step, "stream": prog.stream.as_dict(),
        "best_val_cos": prog.best_val_cos, "rng": torch.get_rng_state(), **extra,
    }
    with atomic.atomic_path(checkpoint_path(folder, which), suffix=".pt") as tmp:
        torch.save(state, tmp)
    side = {
        "step": prog.step,
        "steps": extra["planned_steps"],
        "val_cos": extra.get("val_cos"),
        "best_val_cos": prog.best_val_cos,
        "time": time.time(),
        "mock": extra.get("mock", False),
        # the inputs it was made from, readable without torch
        "train_fp": extra.get("train_fp"),
    }
    atomic.write_json(side_path(folder, which), finite(side))


REQUIRED_KEYS = (
    "model",
    "optimizer",
    "step",
    "stream",
    "best_val_cos",
    "rng",
    "config",
    "planned_steps",
)


def load_checkpoint(path: Path) -> dict:
    """Checkpoints hold only tensors and plain values: loaded with weights_only=True. A
    truncated, damaged or foreign file is a UserError saying which file and what to do."""
    fix = "delete it to restart training from the other checkpoint or from scratch"
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except (
        RuntimeError,
        EOFError,
        OSError,
        pickle.UnpicklingError,
        zipfile.BadZipFile,
        # what torch.load raises on foreign bytes
        ValueError,
        AttributeError,
        ImportError,
    ) as e:
        raise UserError(
            f"{path} is damaged or not a gguf-trainer checkpoint ({type(e).__name__}); {fix}."
        ) from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(ck, dict) or k not in ck]
    if missing:
        raise UserError(f"{path} is not a gguf-trainer checkpoint (no {missing[0]!r}); {fix}.")
    wrong = next((k for k, ok in _VALUE_CHECKS.items() if not ok(ck[k])), None)
    if wrong:
        raise UserError(
            f"{path} is not a gguf-trainer checkpoint ({wrong!r} has the wrong "
            f"type or value); {fix}."
        )
    _check_fits(ck, path, fix)
    return Checkpoint(ck, path=Path(path))


def _check_fits(ck: dict, path: Path, fix: str) -> None:
    """The tensors are exactly those of the adapter its config builds (names and shapes),
    checked on the meta device: nothing is allocated and no random numbers are drawn."""
    from gguf_trainer.model.adapters import AdapterConfig, build_adapter

    try:
        cfg = AdapterConfig.from_dict(ck["config"])
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            want = {k: tuple(v.shape) for k, v in build_adapter(cfg).state_dict().items()}
    # a config this version cannot build (absurd sizes overflow even on the meta device)
    except (TypeError, ValueError, KeyError, RuntimeError, OverflowError) as e:
        raise UserError(
            f"{path} holds an adapter config gguf-trainer cannot build "
            f"({type(e).__name__}: {e}); {fix}."
        ) from None
    have = {k: tuple(v.shape) for k, v in ck["model"].items()}
    bad = next((k for k in sorted(want.keys() | have.keys()) if want.get(k) != have.get(k)), None)
    if bad is not None:
        raise UserError(
            f"{path} does not hold the adapter its config describes (tensor {bad!r}: "
            f"{have.get(bad, 'missing')} instead of {want.get(bad, 'absent')}); {fix}."
        )
    for key in ("mu", "sigma_f"):  # export folds them; eval standardizes with them
        v = ck.get(key)
        if v is not None and not (isinstance(v, torch.Tensor) and v.shape == (cfg.out_dim,)):
            raise UserError(f"{path} has a {key!r} that is not {cfg.out_dim} numbers; {fix}.")


class Checkpoint(dict):
    """A loaded checkpoint: the dict torch.load returned, plus the file it came from (for
    the sentence when its content does not fit the model)."""

    def __init__(self, content: dict, path: Path):
        super().__init__(content)
        self.path = path


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


# What each required value must be before anything indexes into it (a hand-edited or
# foreign checkpoint with the right keys would otherwise fail deep inside torch).
_VALUE_CHECKS = {
    "model": lambda v: (
        isinstance(v, dict)
        and all(isinstance(k, str) and isinstance(t, torch.Tensor) for k, t in v.items())
    ),
    "optimizer": lambda v: isinstance(v, dict),
    "step": _count,
    "planned_steps": _count,
    "stream": lambda v: (
        isinstance(v, dict)
        and set(v) == {"epoch", "shard_i", "batch_i"}
        and all(_count(x) for x in v.values())
    ),
    "best_val_cos": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "rng": lambda v: isinstance(v, torch.Tensor) and v.dtype == torch.uint8,
    "config": lambda v: isinstance(v, dict),
}


def does_not_fit(ck: dict, error: Exception) -> UserError:
    """The sentence for a checkpoint whose tensors do not fit the model built for it."""
    where = getattr(ck, "path", "the checkpoint")
    detail = (
        str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
    )
    return UserError(
        f"{where} does not fit this project's adapter ({detail}); delete it to "
        "restart training from scratch."
    )


def read_side(folder: Path, which: str) -> dict:
    """`<which>.json` as written with the checkpoint, {} when absent or unreadable."""
    try:
        side = atomic.read_json(side_path(folder, which), {})
    except (ValueError, OSError):  # garbage or a folder in its place: no summary
        return {}
    return side if isinstance(side, dict) else {}


def recorded_fingerprint(folder: Path, which: str) -> str | None:
    """The inputs fingerprint (`train_fp`) a checkpoint was made from: from its summary, or,
    for a checkpoint saved before the summary held it, from the checkpoint itself. None when
    the file is absent; "" when it cannot say (damaged: it vouches for nothing)."""
    path = checkpoint_path(folder, which)
    if not path.is_file():
        return None
    fp = read_side(folder, which).get("train_fp")
    if not isinstance(fp, str):
        try:
            fp = load_checkpoint(path).get("train_fp")
        except UserError:
            fp = None
    return fp if isinstance(fp, str) else ""


def model_from_checkpoint(ck: dict):
    from gguf_trainer.model.adapters import AdapterConfig, build_adapter

    try:
        model = build_adapter(AdapterConfig.from_dict(ck["config"]))
        model.load_state_dict(ck["model"])
    # a config or tensors from another geometry or tool: what the builder and torch raise
    except (TypeError, ValueError, KeyError, RuntimeError) as e:
        raise does_not_fit(ck, e) from None
    return model.eval()
