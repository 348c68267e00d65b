"""Kept steps: weights-only copies of chosen steps of a run, exported later exactly as a
snapshot taken at that step would have been.

`train.history` turns it on; `history_every` (0 = at every validation), `history_from`,
`history_to` (0 = the end) and `history_keep` (0 = all; else the newest N stay) are the
schedule. Also kept, inside the window: every stop, every snapshot request and the final step.
A kept step is `checkpoints/history/step<N>.pt` (tensors and plain values, loaded with
`weights_only=True`) and its sidecar `step<N>.json` (step, validation figures, size, time),
each written atomically: a kill -9 while one is written loses at most that one, and a full
disk while writing one is a sentence in the log while training goes on.

What it holds is what the export needs and nothing else (no optimizer, RNG or stream): the
weights with the standardization already folded (model.export.fold_standardization, the very
arithmetic the export applies to last.pt) and kept f32 wherever any export.dtype could
quantize them; only a tensor that every export.dtype writes as f16 (an embedding table the
export cannot factorize) is stored f16, cast as the export casts it. So a GGUF exported from
a kept step equals, tensor for tensor and in every export.dtype, a snapshot exported from
last.pt at that step; its metadata says `adapter.checkpoint = step<N>`.

Torch is imported inside the functions that need it: listing, planning and deleting kept
steps (the CLI, the control API, the GUI) load no torch. Must not: know stages or packs.

    kept = KeptSteps(paths, Schedule.from_settings(train_settings))
    kept.keep(step, steps, model, extra, best_val_cos, reason)    # in the train loop
    list_kept(paths); load_kept(paths, 500); delete_kept(paths, 500)
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

from gguf_trainer.base import atomic, project_file, safe_delete
from gguf_trainer.base.errors import DiskError, UserError
from gguf_trainer.base.jsonvals import finite
from gguf_trainer.base.paths import KEPT_PREFIX, kept_name

log = logging.getLogger(__name__)

FORMAT = 1  # the "kept" key of a kept step: its format version
SPEC = re.compile(rf"^{KEPT_PREFIX}[ _-]?(\d+)$")  # step500, step_500, step-500
FILE = re.compile(rf"^{KEPT_PREFIX}(\d+)\.pt$")


def parse_spec(text: str) -> int | None:
    """The step a `step<N>` spec names, or None when `text` is not one."""
    m = SPEC.match(str(text).strip().lower())
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Schedule:
    """Which steps are kept (train.history*); `val_every` is the grid when every is 0."""

    enabled: bool = False
    every: int = 0
    start: int = 0
    end: int = 0
    keep: int = 0
    val_every: int = 500

    @classmethod
    def from_settings(cls, train) -> Schedule:
        return cls(bool(train.history), int(train.history_every), int(train.history_from),
                   int(train.history_to), int(train.history_keep), int(train.val_every))

    @property
    def grid(self) -> int:
        return self.every or self.val_every

    def in_window(self, step: int, steps: int) -> bool:
        return self.start <= step <= (self.end or steps)

    def is_due(self, step: int, steps: int, forced: bool) -> bool:
        """Whether `step` is kept: on the grid, or `forced` (a stop, a snapshot request, the
        final step), and inside the window either way."""
        if not self.enabled or step < 1 or not self.in_window(step, steps):
            return False
        return forced or step % self.grid == 0

    def planned(self, steps: int) -> list[int]:
        """The steps a run of `steps` keeps by the schedule (stops and snapshots come on top),
        before `keep` prunes the oldest."""
        if not self.enabled:
            return []
        last = min(self.end or steps, steps)
        first = max(self.start, 1)
        grid = [s for s in range(math.ceil(first / self.grid) * self.grid, last + 1, self.grid)]
        if self.in_window(steps, steps) and steps not in grid:
            grid.append(steps)  # the final step is always kept inside the window
        return grid

    def files_on_disk(self, steps: int) -> int:
        n = len(self.planned(steps))
        return min(n, self.keep) if self.keep else n


# ---------------------------------------------------------------- the weights it keeps
def lean_state(state: dict, cfg, mu=None, sigma_f=None, bank_fold=None) -> dict:
    """The state dict a kept step stores: folded like the export folds (when mu/sigma_f are
    given: a standardized recipe), f32 except the tensors every export.dtype writes f16,
    which are cast to f16 exactly as the export casts them (numpy)."""
    import numpy as np
    import torch

    from gguf_trainer.model.export import fold_standardization, is_f16_in_every_dtype

    state = {k: v.detach().cpu() for k, v in state.items()}
    if mu is not None:
        state = fold_standardization(state, mu, sigma_f)
    if bank_fold is not None:  # the Qwen3.5 bridge's FLUX.3 bank (data/bank_rows.py)
        from gguf_trainer.model.export import fold_bank

        state = fold_bank(state, *bank_fold)
    # a full seed table the export may factorize (train.seed_rank) is factorized from f32
    factorizable = cfg.kind == "seeded_resampler" and not cfg.seed_rank
    out = {}
    for k, v in state.items():
        a = v.to(torch.float32).contiguous()
        if is_f16_in_every_dtype(k, a.dim()) and not (factorizable and k == "t5_embed.weight"):
            a = torch.from_numpy(a.numpy().astype(np.float16))
        out[k] = a.clone()
    return out


def estimate_bytes(shapes: dict[str, tuple[int, ...]], kind: str, seed_rank: int = 0) -> int:
    """A kept step's size from its tensors' shapes (torch order), by lean_state's rule; the
    pickle's own overhead (a few KB) is left out."""
    from gguf_trainer.model.export import is_f16_in_every_dtype

    factorizable = kind == "seeded_resampler" and not seed_rank
    total = 0
    for k, shape in shapes.items():
        half = is_f16_in_every_dtype(k, len(shape)) and not (factorizable and
                                                              k == "t5_embed.weight")
        total += math.prod(shape) * (2 if half else 4)
    return total


# the adapter kinds whose tensors adapter_file.expected_tensors lists (estimate_for)
INVENTORY_KINDS = ("resampler", "seeded_resampler", "token_aligned", "token_aligned_vision",
                   "layerwise")


def estimate_for(kind: str, *, in_dim: int, out_dim: int, width: int, depth: int,
                 num_queries: int = 0, seed_vocab: int = 0, vis_dim: int = 0,
                 taps: tuple = (), seed_rank: int = 0) -> dict:
    """{"kept_bytes", "last_bytes", "n_params"} for an adapter of these dims (None each for a
    kind it cannot list), torch-free (the
    engine's tensor inventory, adapter_file.expected_tensors, is the state dict): a kept step
    by lean_state's rule, last.pt as f32 weights plus AdamW's two f32 moments of each
    trained weight (the frozen vision_proj has none)."""
    from gguf_trainer.model.adapter_file import expected_tensors

    if kind not in INVENTORY_KINDS:  # a slot kind: its inventory is slot_file's, not estimated
        return {"kept_bytes": None, "last_bytes": None, "n_params": None}
    engine_kind = {"resampler": "resampler", "seeded_resampler": "seeded_resampler"}.get(
        kind, "token_aligned")
    if engine_kind == "seeded_resampler" and seed_rank:
        engine_kind = "seeded_resampler_factorized"
    vision = kind != "token_aligned" and vis_dim > 0 and engine_kind == "token_aligned"
    ne = expected_tensors(
        engine_kind, in_dim=in_dim, out_dim=out_dim, width=width, depth=depth,
        mlp_hidden=4 * width, num_queries=num_queries, t5_vocab=seed_vocab,
        embed_rank=seed_rank, vis_dim=vis_dim, n_out_layers=len(taps),
        has_skip=engine_kind == "token_aligned", has_vision_proj=vision, has_vis_in=vision,
        has_layer_map=bool(taps))
    shapes = {k: tuple(reversed(v)) for k, v in ne.items()}
    n = sum(math.prod(v) for v in shapes.values())
    frozen = sum(math.prod(v) for k, v in shapes.items() if k in ("vision_proj.weight",
                                                                   "layer_map"))
    return {"kept_bytes": estimate_bytes(shapes, kind, seed_rank),
            "last_bytes": 4 * n + 8 * (n - frozen), "n_params": n}


MAX_HEADER_BYTES = 16 << 20  # a shard's safetensors header is kilobytes


def shard_dims(folder: Path) -> dict[str, int] | None:
    """{"in_dim", "out_dim", "vis_dim"} from the first shard's safetensors header, read
    without torch (shards.dims reads the same header through safetensors); None when there
    is no readable shard yet."""
    import json
    import struct

    files = sorted(Path(folder).glob("*.safetensors")) if Path(folder).is_dir() else []
    if not files:
        return None
    try:
        with open(files[0], "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_HEADER_BYTES:
                return None
            head = json.loads(f.read(n))
        shape = lambda key: int(head[key]["shape"][1]) if key in head else 0
        return {"in_dim": shape("student_rows"), "out_dim": shape("target_rows"),
                "vis_dim": shape("vis_rows")}
    except (OSError, ValueError, KeyError, IndexError, TypeError, struct.error):
        return None  # a damaged shard: the pack's declared dims stand in


# ---------------------------------------------------------------- writing (the train loop)
class KeptSteps:
    """The train loop's side of kept steps: decide, write atomically, prune."""

    def __init__(self, paths, schedule: Schedule):
        self.paths, self.schedule = paths, schedule

    def is_due(self, step: int, steps: int, forced: bool) -> bool:
        return self.schedule.is_due(step, steps, forced)

    def keep(self, step: int, steps: int, model, extra: dict, best_val_cos: float,
             reason: str) -> Path | None:
        """Write step `step` (its weights from `model`, the rest from `extra`, the dict last.pt
        gets at this step), then prune to train.history_keep. A disk that refuses the write
        is a warning naming the file; training goes on. Returns the file, or None."""
        import torch

        from gguf_trainer.model.adapters import AdapterConfig

        cfg = AdapterConfig.from_dict(extra["config"])
        folded = bool(extra.get("standardized"))
        bank = extra.get("bank_mu")
        state = lean_state(model.state_dict(), cfg, *((extra["mu"], extra["sigma_f"])
                                                      if folded else (None, None)),
                           bank_fold=None if bank is None else (bank, extra["bank_sigma_f"]))
        content = {
            "kept": FORMAT, "model": state, "step": step, "best_val_cos": best_val_cos,
            "folded": True, "time": time.time(),
            **{k: extra.get(k) for k in ("config", "mu", "sigma_f", "planned_steps",
                                         "train_fp", "pack", "mock", "standardized",
                                         "recipe", "val_cos", "val")},
        }
        path = self.paths.kept_step(step)
        try:
            project_file.make_dir(self.paths.root, self.paths.history)
            with atomic.atomic_path(path, suffix=".pt") as tmp:
                torch.save(content, tmp)
            atomic.write_json(self.paths.kept_side(step), finite(self._side(content, path,
                                                                            reason)))
        except DiskError as e:
            log.warning("kept step %d was not written (%s); training goes on, and the steps "
                        "kept before it stay.", step, e)
            return None
        log.info("kept step %d (%s): %s, %.1f MB", step, reason, path.name,
                 path.stat().st_size / 1e6)
        self.prune()
        return path

    def _side(self, content: dict, path: Path, reason: str) -> dict:
        val = content.get("val") if isinstance(content.get("val"), dict) else {}
        return {
            "step": content["step"], "planned_steps": content["planned_steps"],
            "val_cos": content.get("val_cos"),
            "val": {k: v for k, v in val.items()  # the validation's figures at this step
                    if isinstance(v, int | float) and not isinstance(v, bool)},
            "best_val_cos": content["best_val_cos"], "time": content["time"],
            "size": path.stat().st_size, "reason": reason, "mock": bool(content.get("mock")),
            "train_fp": content.get("train_fp"),
        }

    def prune(self) -> None:
        """Delete the oldest kept steps beyond train.history_keep (0 = keep all)."""
        if not self.schedule.keep:
            return
        for item in list_kept(self.paths)[: -self.schedule.keep]:
            for v in delete_kept(self.paths, item["step"]):
                if v.reason:
                    log.warning("kept step %d: %s %s", item["step"], v.path, v.reason)


# ---------------------------------------------------------------- reading, listing, deleting
def kept_steps_on_disk(paths) -> list[int]:
    """The steps whose .pt is in checkpoints/history/, ascending (a sidecar alone is not one)."""
    folder = paths.history
    if not folder.is_dir() or folder.is_symlink():
        return []
    steps = [int(m.group(1)) for p in folder.iterdir() if (m := FILE.match(p.name))
             and p.is_file() and not p.is_symlink()]
    return sorted(steps)


def list_kept(paths) -> list[dict]:
    """Each kept step, ascending: {step, name, path, size, val_cos, val, time, reason, ...}
    from its sidecar; a step whose sidecar was lost (a kill between the two writes) is listed
    with its size and time only."""
    out = []
    for step in kept_steps_on_disk(paths):
        path = paths.kept_step(step)
        try:
            st = path.stat()
        except OSError:  # deleted between the listing and now
            continue
        try:
            side = atomic.read_json(paths.kept_side(step), {}, inside=paths.root)
        except (ValueError, OSError):  # an unreadable sidecar: the file's own facts only
            side = {}
        side = side if isinstance(side, dict) and side.get("step") == step else {}
        out.append({**side, "step": step, "name": kept_name(step), "path": str(path),
                    "size": st.st_size, "time": side.get("time") or st.st_mtime})
    return out


def kept_summary(paths) -> dict:
    """{"n", "bytes"} of the kept steps on disk, from file sizes only (status reads it on every
    poll: no sidecar is opened)."""
    sizes = []
    for step in kept_steps_on_disk(paths):
        try:
            sizes.append(paths.kept_step(step).stat().st_size)
        except OSError:  # deleted between the listing and now
            continue
    return {"n": len(sizes), "bytes": sum(sizes)}


def describe_kept(paths) -> str:
    """One phrase for the refusal of a step that is not kept: which are."""
    steps = kept_steps_on_disk(paths)
    if not steps:
        return ("no step is kept in this project (turn train.history on before the run; "
                "`gguf-trainer snapshot --checkpoint list` lists kept steps)")
    shown = ", ".join(str(s) for s in steps[:20]) + (" ..." if len(steps) > 20 else "")
    return f"the kept steps are {shown}"


def require_kept(paths, step: int) -> Path:
    """The kept step's file, or UserError naming the kept ones."""
    path = paths.kept_step(step)
    if step not in kept_steps_on_disk(paths):
        raise UserError(f"step {step} is not kept; {describe_kept(paths)}.")
    return path


def load_kept(paths, step: int) -> dict:
    """A kept step, loaded with weights_only=True and checked like a checkpoint, as the dict
    the export and the eval read: its weights are folded, so it predicts raw rows
    (`standardized` False; `trained_standardized` says how it was trained)."""
    import pickle
    import zipfile

    import torch

    from gguf_trainer.data.checkpoints import Checkpoint, _check_fits

    path = require_kept(paths, step)
    fix = "delete it (Output tab › Kept steps, or remove the file) and export another step"
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile,
            ValueError, AttributeError, ImportError) as e:  # what torch.load raises on bad bytes
        raise UserError(f"{path} is damaged or not a kept step ({type(e).__name__}); {fix}.") \
            from None
    if not isinstance(ck, dict) or ck.get("kept") != FORMAT or ck.get("step") != step:
        raise UserError(f"{path} is not a kept step of this version (no 'kept' {FORMAT} for "
                        f"step {step}); {fix}.")
    missing = [k for k in ("model", "config", "planned_steps", "best_val_cos") if k not in ck]
    if missing:
        raise UserError(f"{path} is not a kept step (no {missing[0]!r}); {fix}.")
    _check_fits(ck, path, fix)
    ck["trained_standardized"] = bool(ck.get("standardized"))
    ck["standardized"] = False  # the fold is in the weights
    return Checkpoint(ck, path=path)


def delete_kept(paths, step: int) -> list[safe_delete.Verdict]:
    """Delete a kept step's file and sidecar by the ownership rule (inside the project, a
    regular file, never through a link): the verdict of each."""
    return [safe_delete.remove_owned(p, paths.root, "file")
            for p in (paths.kept_step(step), paths.kept_side(step))]


def total_bytes(items: list[dict]) -> int:
    return sum(int(i.get("size") or 0) for i in items)
