"""The stage sequence and its bookkeeping: fingerprints, done-ness, invalidation.

corpus -> precompute_val -> precompute_train -> train -> export -> eval

Each stage records the fingerprint of its inputs in a manifest next to its outputs. A
stage is done when its outputs exist and were made from the current inputs. When an
input changes, everything downstream is invalidated (checkpoints are moved aside to
`checkpoints.stale-<time>/`, never deleted) and the log says which input changed.
Settings that do not change any output (train.steps, devices, batch/token budgets,
teacher placement, threads) are not part of any fingerprint.

    run_stages(paths, report, only=None, force=False) -> "done" | "stopped"
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

from .. import atomic
from ..errors import UserError
from ..paths import MANIFEST_JSON, STALE_PREFIX, ProjectPaths

log = logging.getLogger(__name__)

STAGES = ("corpus", "precompute_val", "precompute_train", "train", "export", "eval")
STAGE_TITLES = {"corpus": "Corpus", "precompute_val": "Precompute val", "precompute_train": "Precompute train",
                "train": "Train", "export": "Export", "eval": "Evaluate"}
MOCK_ENV = "GGUF_TRAINER_MOCK_TEACHER"


def env_wants_mock() -> bool:
    return os.environ.get(MOCK_ENV, "").strip().lower() not in ("", "0", "false")


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def stage_inputs(project) -> dict[str, dict]:
    """The inputs of each fingerprinted stage (a chain: each includes its upstream's digest)."""
    from ..corpus import fingerprint_inputs
    from ..precompute import file_sha256, student_paths, teacher_identity

    st, pack = project.settings, project.pack
    corpus = fingerprint_inputs(st)
    gguf, _tok = student_paths(project)
    common = {"corpus": _digest(corpus), "student_sha256": file_sha256(gguf, project.paths.hashes_json), "teacher": teacher_identity(project),
              "contract": pack.shard_contract, "mock": st.precompute.mock_teacher,
              "student_dtype": st.precompute.student_dtype, "vision_proj": None,
              "max_len_student": pack.max_len_student}
    pre_val = {**common, "split": "val", "shard_size": st.precompute.val_shard_size}
    pre_train = {**common, "split": "train", "shard_size": st.precompute.shard_size}
    t = st.train
    train = {"precompute_train": _digest(pre_train), "precompute_val": _digest(pre_val),
             "kind": pack.adapter_kind, "out_dim": pack.out_dim, "num_queries": pack.num_queries,
             "seed_vocab": pack.seed_vocab, "vis_dim": pack.vis_dim, "width": t.width, "depth": t.depth,
             "lr": t.lr, "warmup": t.warmup, "weight_decay": t.weight_decay, "grad_clip": t.grad_clip,
             "cos_weight": t.cos_weight, "sigma_floor": t.sigma_floor, "batch_size": t.batch_size, "seed": t.seed}
    return {"corpus": corpus, "precompute_val": pre_val, "precompute_train": pre_train, "train": train}


def manifest_dir(paths: ProjectPaths, stage: str) -> Path:
    return {"corpus": paths.data, "precompute_val": paths.shard_dir("val"),
            "precompute_train": paths.shard_dir("train"), "train": paths.checkpoints}[stage]


def read_manifest(paths: ProjectPaths, stage: str) -> dict | None:
    return atomic.read_json(manifest_dir(paths, stage) / MANIFEST_JSON)


def write_manifest(paths: ProjectPaths, stage: str, inputs: dict, **extra) -> None:
    folder = manifest_dir(paths, stage)
    folder.mkdir(parents=True, exist_ok=True)
    atomic.write_json(folder / MANIFEST_JSON, {"fingerprint": _digest(inputs), "inputs": inputs,
                                               "time": time.time(), **extra})


def changed_keys(old: dict, new: dict, prefix: str = "") -> list[str]:
    keys = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += changed_keys(a, b, f"{prefix}{k}.")
        elif a != b:
            keys.append(prefix + k)
    return keys


def move_checkpoints_aside(paths: ProjectPaths) -> Path | None:
    folder = paths.checkpoints
    if not folder.is_dir() or not any(folder.iterdir()):
        return None
    dest = paths.root / f"{STALE_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while dest.exists():
        dest = paths.root / f"{STALE_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-{n}"
        n += 1
    os.replace(folder, dest)
    return dest


def clear_outputs(paths: ProjectPaths, stage: str) -> None:
    """Remove what `stage` made (checkpoints are moved aside, everything else is derived data)."""
    if stage == "train":
        dest = move_checkpoints_aside(paths)
        if dest:
            log.info("moved the old checkpoints to %s", dest.name)
        paths.eval_json.unlink(missing_ok=True)
    elif stage == "corpus":
        shutil.rmtree(paths.data, ignore_errors=True)
    else:
        shutil.rmtree(manifest_dir(paths, stage), ignore_errors=True)


def invalidate_changed(project, inputs: dict[str, dict]) -> None:
    """Clear every stage whose recorded inputs differ from the current ones, and all downstream."""
    paths = project.paths
    downstream = {"corpus": ["precompute_val", "precompute_train", "train"],
                  "precompute_val": ["train"], "precompute_train": ["train"], "train": []}
    stale: list[str] = []
    for stage in ("corpus", "precompute_val", "precompute_train", "train"):
        man = read_manifest(paths, stage)
        if man is None or stage in stale:
            continue
        if man.get("fingerprint") != _digest(inputs[stage]):
            keys = changed_keys(man.get("inputs", {}), inputs[stage])
            log.warning("%s inputs changed (%s): redoing %s", stage, ", ".join(keys) or "format",
                        " and ".join([stage, *downstream[stage]]))
            for s in [stage, *downstream[stage]]:
                if s not in stale:
                    clear_outputs(paths, s)
                    stale.append(s)
    # A train manifest without checkpoints, or checkpoints without a manifest, are not trusted.
    if read_manifest(paths, "train") is None and paths.checkpoints.is_dir() and "train" not in stale:
        if (paths.checkpoints / "last.pt").exists():
            clear_outputs(paths, "train")


def verify_split(project, split: str, fingerprint: str) -> None:
    """Recompute-instead-of-train-on: delete any shard that is truncated, corrupted or stale.
    Verified shards are remembered by (size, mtime) so a restart does not re-hash them."""
    from .. import shards

    folder = project.paths.shard_dir(split)
    record_path = folder / "verified.json"
    record = atomic.read_json(record_path, {}) or {}
    changed = False
    for path in shards.shard_files(folder):
        st = path.stat()
        key = [st.st_size, st.st_mtime_ns]
        if record.get(path.name) == key:
            continue
        reason = shards.verify_shard(path, fingerprint)
        if reason:
            log.warning("shard %s/%s is %s; recomputing it", split, path.name, reason)
            path.unlink()
            record.pop(path.name, None)
        else:
            record[path.name] = key
        changed = True
    for tmp in folder.glob(".*.tmp"):
        tmp.unlink()  # a partial shard of a killed run
    if changed:
        atomic.write_json(record_path, record)


def _expected_shards(project, split: str) -> int:
    import math

    from ..corpus import read_prompts

    n = len(read_prompts(project.paths.data / f"{split}.txt"))
    pc = project.settings.precompute
    return max(1, math.ceil(n / (pc.val_shard_size if split == "val" else pc.shard_size)))


def is_done(project, stage: str, inputs: dict[str, dict]) -> bool:
    from .. import shards
    from ..train import checkpoint_path, train_done

    paths = project.paths
    if stage in inputs:
        man = read_manifest(paths, stage)
        if man is None or man.get("fingerprint") != _digest(inputs[stage]) or not man.get("complete"):
            return False
    if stage == "corpus":
        return (paths.data / "train.txt").is_file() and (paths.data / "val.txt").is_file()
    if stage.startswith("precompute_"):
        split = stage.removeprefix("precompute_")
        return len(shards.shard_files(paths.shard_dir(split))) >= _expected_shards(project, split)
    if stage == "train":
        return train_done(project)
    best = checkpoint_path(paths.checkpoints, "best")
    if stage == "export":
        gguf = project.final_gguf
        return best.exists() and gguf.exists() and gguf.stat().st_mtime_ns >= best.stat().st_mtime_ns
    if stage == "eval":
        gguf = project.final_gguf
        return (paths.eval_json.exists() and gguf.exists()
                and paths.eval_json.stat().st_mtime_ns >= gguf.stat().st_mtime_ns)
    raise ValueError(stage)


def prepare_run(paths: ProjectPaths):
    """Record run settings that must stay fixed across resumes (mock flag, thread count)."""
    from ..project import load_project, update_settings

    project = load_project(paths.root)
    changes = {}
    if env_wants_mock() and not project.settings.precompute.mock_teacher:
        changes["precompute.mock_teacher"] = True
    if project.settings.train.threads == 0:
        changes["train.threads"] = max(1, min(os.cpu_count() or 1, 8))
    if changes:
        log.info("recording run settings in project.json: %s", changes)
        project = update_settings(paths.root, changes)
    return project


def _pin_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    if not torch.cuda.is_available():
        # Bit-exact resume on CPU: same threads, deterministic kernels.
        torch.use_deterministic_algorithms(True, warn_only=True)


def run_stages(paths: ProjectPaths, report, only=None, force: bool = False) -> str:
    from ..precompute import Stopped

    project = prepare_run(paths)
    _pin_threads(project.settings.train.threads)
    if project.settings.precompute.mock_teacher:
        log.warning("MOCK teacher: synthetic targets, a smoke test of the machinery, never a usable adapter")
    report.fields(mock=project.settings.precompute.mock_teacher)
    unknown = [s for s in (only or []) if s not in STAGES]
    if unknown:
        raise UserError(f"unknown stage {unknown[0]!r}; choose from {', '.join(STAGES)}.")
    inputs = stage_inputs(project)
    invalidate_changed(project, inputs)
    ctx: dict = {}
    for stage in STAGES:
        if only and stage not in only:
            continue
        if stage == "eval" and not project.settings.export.run_eval:
            report.begin_stage(stage)
            report.end_stage(stage, "skipped", skipped=True, detail="export.run_eval is off")
            continue
        if stage.startswith("precompute_"):  # only whole, current shards count as done
            verify_split(project, stage.removeprefix("precompute_"), _digest(inputs[stage]))
        forced = force and stage in ("export", "eval")
        if not forced and is_done(project, stage, inputs):
            report.begin_stage(stage)
            report.end_stage(stage, "done", skipped=True)
            continue
        if report.stop_requested():
            return "stopped"
        report.begin_stage(stage)
        try:
            outcome = _run_one(project, stage, inputs, report, ctx)
        except Stopped:
            outcome = "stopped"
        if outcome == "stopped":
            report.end_stage(stage, "stopped")
            return "stopped"
        report.end_stage(stage, "done")
        if stage == "precompute_train":
            ctx.clear()
            gc.collect()
        # A stage that changed settings on disk (none today) would be reloaded here.
    return "done"


def _run_one(project, stage: str, inputs: dict, report, ctx: dict) -> str:
    from ..corpus import run_corpus
    from ..evaluate import run_eval
    from ..outputs import run_export
    from ..precompute import run_precompute
    from ..train import run_train

    paths = project.paths
    if stage == "corpus":
        clear_outputs(paths, "corpus")
        run_corpus(project, report)
        write_manifest(paths, stage, inputs[stage], complete=True)
    elif stage.startswith("precompute_"):
        split = stage.removeprefix("precompute_")
        fp = _digest(inputs[stage])
        if read_manifest(paths, stage) is None:
            write_manifest(paths, stage, inputs[stage], complete=False)
        run_precompute(project, report, split, ctx, fp)
        write_manifest(paths, stage, inputs[stage], complete=True)
    elif stage == "train":
        if read_manifest(paths, stage) is None:
            write_manifest(paths, stage, inputs[stage], complete=True)
        return run_train(project, report, _digest(inputs[stage]))
    elif stage == "export":
        run_export(project, report)
    elif stage == "eval":
        run_eval(project, report)
    return "done"
