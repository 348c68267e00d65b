"""The project's output files: the final export, step-tagged snapshots, and the manifest
that names them.

Every GGUF this project writes is recorded by exact path in `exports.json`, so the
"output" reset and the Output tab touch this project's files only — never another
project's that merely shares a name prefix in the same folder (`pig_llada` vs
`pig_llada_v2`). The snapshot manifest `snapshots.json` lists step, planned steps,
validation score and optional eval of each snapshot. Imports no torch at module level
(reset and the control API list exports through it).

    STAGE   the export stage object (done when the final GGUF is newer than best.pt)
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from pathlib import Path

from gguf_trainer import __version__
from gguf_trainer.base import atomic, places, project_file
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import BEST
from gguf_trainer.stages.stage_list import Stage
from gguf_trainer.store.project import refuse_overwrite

log = logging.getLogger(__name__)




def _checkpoint(project, which: str) -> Path:
    path = project.paths.checkpoint(which)
    if not path.exists():
        raise UserError(f"there is no {which}.pt checkpoint yet; train first (gguf-trainer start).")
    return path


def export_metadata(project, ck: dict, which: str, is_snapshot: bool) -> dict:
    pack = project.pack
    meta = {
        "adapter.trained_steps": int(ck["step"]),
        "adapter.planned_steps": int(ck["planned_steps"]),
        "adapter.checkpoint": which,
        "adapter.snapshot": is_snapshot,
        "adapter.pack": pack.id,
        "adapter.trainer": f"gguf-trainer {__version__}",
        "adapter.mock_teacher": bool(ck.get("mock")),
        "adapter.dtype": project.settings.export.dtype,
        **pack.export_kv,
        **pack.export_teacher_kv(project, ck),
    }
    if ck.get("val_cos") is not None:
        meta["adapter.val_cos"] = float(ck["val_cos"])
    if ck.get("best_val_cos", -1.0) > -1.0:
        meta["adapter.best_val_cos"] = float(ck["best_val_cos"])
    return meta


def export_checkpoint(project, which: str, dest, is_snapshot: bool, ck: dict | None = None) -> dict:
    """Write checkpoint `which` (last|best, or a kept step `step<N>` passed loaded as `ck`) as
    an engine-ready GGUF in export.dtype at `dest` (a path, or a function of the checkpoint's
    step: the trainer may replace last.pt at any moment, so the step is read from the
    checkpoint actually loaded). A kept step holds its weights folded already (`folded`)."""
    from gguf_trainer.data.checkpoints import load_checkpoint
    from gguf_trainer.model.adapters import AdapterConfig
    from gguf_trainer.model.export import engine_state, write_adapter_gguf

    ck = ck or load_checkpoint(_checkpoint(project, which))
    dest = Path(dest(int(ck["step"])) if callable(dest) else dest)
    cfg = AdapterConfig.from_dict(ck["config"])
    pack = project.pack
    if pack.taps and cfg.taps != tuple(pack.taps):
        # the engine aborts unless the stack is the family's (conditioner.hpp 2798-2840)
        raise UserError(
            f"this checkpoint's adapter emits {len(cfg.taps)} taps {list(cfg.taps)}, but the "
            f"{pack.title} pack's family conditions on {list(pack.taps)}; ggk would refuse "
            "it. Retrain this project (gguf-trainer reset --project DIR train)."
        )
    is_folded = bool(ck.get("folded"))  # data.kept_steps: folded as this export folds
    fold = {"mu": ck["mu"], "sigma_f": ck["sigma_f"]} if ck.get("standardized") and not is_folded \
        else {}
    if ck.get("bank_mu") is not None and not is_folded:  # the bridge's FLUX.3 bank head
        fold["bank_fold"] = (ck["bank_mu"], ck["bank_sigma_f"])
    kind = "snapshot" if is_snapshot else "final"
    meta = export_metadata(project, ck, which, is_snapshot)
    rank = project.settings.train.seed_rank
    state, cfg, err = engine_state(ck["model"], cfg, rank)
    if err is not None:
        meta["adapter.seed_svd_rel_error"] = err
        log.info(
            "export: seed table factorized to rank %d (t5_embed_a %d x %d + t5_embed_b) by "
            "truncated SVD: relative reconstruction error %.4g",
            rank,
            cfg.seed_vocab,
            rank,
            err,
        )
    # Recorded before the file lands, so a kill between the two never leaves a GGUF of this
    # project that it does not know it wrote (a restart would take it for another project's).
    _check_output_inside(project)
    # a copy's snapshot at the original's step, a user's file under our name: never replaced
    refuse_overwrite(project, dest)
    record_export(project, dest, kind=kind, pending=True)
    info = write_adapter_gguf(dest, state, cfg, metadata=meta, name=project.settings.name,
                              dtype=project.settings.export.dtype,
                              tokenizer=pack.export_tokenizer(project), **fold)
    record_export(project, dest, kind=kind)
    log.info(
        "export: wrote %s: %s tensors (%s.pt, step %d/%d, val cos %s)%s",
        dest,
        " + ".join(f"{n} {t}" for t, n in sorted(info["types"].items())),
        which,
        ck["step"],
        ck["planned_steps"],
        ck.get("val_cos"),
        " [MOCK teacher]" if ck.get("mock") else "",
    )
    return {
        **info,
        "path": str(dest),
        "step": int(ck["step"]),
        "planned_steps": int(ck["planned_steps"]),
        "val_cos": ck.get("val_cos"),
        "best_val_cos": ck.get("best_val_cos"),
        "mock": bool(ck.get("mock")),
    }


def _check_output_inside(project) -> None:
    """An export.output_dir inside the project (the demo's) is a real folder under the
    project's real path, never a link out of it (project_file.make_dir)."""
    out = project.settings.export.output_dir
    if not out:
        return
    spelled = os.path.abspath(project.dir / Path(out).expanduser())
    if spelled.startswith(os.path.abspath(project.dir) + os.sep):
        project_file.make_dir(project.dir, spelled)


def record_export(project, path: Path, kind: str, pending: bool = False) -> None:
    """Record `path` as this project's in exports.json: before it is written (`pending`), then
    with its size and sha256 once written, so `reset output` can prove the file is ours."""
    from gguf_trainer.base.safe_delete import file_record

    try:
        man = atomic.read_json(project.paths.exports_json, {}) or {}
    except (ValueError, OSError):  # a garbage record is rebuilt from what is written next
        man = {}
    files = man.get("files") if isinstance(man, dict) and isinstance(man.get("files"), dict) else {}
    path = Path(path).resolve()
    entry = {"kind": kind, "time": time.time()}
    if not pending:
        entry.update(file_record(path))
    # Beside the project: relative to its parent, so a moved or copied project names the
    # file beside itself, never the one at its old place (places.py).
    key = places.record_key(path, project.dir.resolve())
    _note_writer(entry, key, project)
    files.pop(str(path), None)  # an older version's absolute key for the same file
    files[key] = entry
    atomic.write_json(
        project.paths.exports_json, {**(man if isinstance(man, dict) else {}), "files": files}
    )


def _note_writer(entry: dict, key: str, project) -> None:
    """An export recorded by an absolute path (outside the project's parent: an absolute
    export.output_dir, export.copy_to) is the very file a `cp -a` copy's records name too:
    the writer's real path goes with it (project.written_by_another), so the copy neither
    deletes nor overwrites it. Relative records name the file beside each copy: no writer."""
    if os.path.isabs(key):
        entry["project"] = str(project.dir.resolve())


def exported_files(project) -> list[Path]:
    """This project's GGUFs that still exist, by the exact paths it recorded."""
    try:
        man = atomic.read_json(project.paths.exports_json, {}) or {}
    except (ValueError, OSError):  # garbage: nothing provably ours
        return []
    files = man.get("files") if isinstance(man, dict) and isinstance(man.get("files"), dict) else {}
    found = (places.recorded_path(p, project.dir.resolve()) for p in sorted(files))
    return [p for p in found if p.exists()]


def run_export(project, report) -> None:
    """Export stage: best.pt -> <output_dir>/<name>-<export.dtype>.gguf, then the optional copy."""
    # Both folders are checked before anything is written: a copy_to that is a file or
    # read-only must not leave a re-exported GGUF and a changed exports.json behind.
    atomic.check_writable_folder(project.output_dir, "export.output_dir")
    copy_to = project.settings.export.copy_to
    if copy_to:
        atomic.check_writable_folder(Path(copy_to).expanduser(), "export.copy_to")
    info = export_checkpoint(project, BEST, project.final_gguf, is_snapshot=False)
    companions = project.pack.write_companions(
        project, project.final_gguf, may_write=lambda path: refuse_overwrite(project, path))
    for companion in companions:
        record_export(project, companion, kind="companion")
    if copy_to:
        dest = Path(copy_to).expanduser() / project.final_gguf.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        refuse_overwrite(project, dest)
        record_export(project, dest, kind="copy", pending=True)
        with atomic.atomic_path(dest) as tmp:
            shutil.copyfile(project.final_gguf, tmp)
        record_export(project, dest, kind="copy")
        log.info("export: copied to %s", dest)
    report.progress(1, 1, "files", path=str(project.final_gguf), step=info["step"])


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def record_snapshot(project, entry: dict) -> None:
    """Add or replace (same path) an entry of snapshots.json, sorted by step."""
    try:
        man = atomic.read_json(project.paths.snapshots_json, {}, inside=project.dir)
    except (ValueError, OSError):  # garbage: rebuilt from this entry on
        man = {}
    man = man if isinstance(man, dict) else {}
    entry = {**entry, "path": places.record_key(entry["path"], project.dir.resolve())}
    _note_writer(entry, entry["path"], project)
    old = man.get("snapshots") if isinstance(man.get("snapshots"), list) else []
    # hand-edited items of the wrong type (not objects, a step that is not a number) drop out
    items = [e for e in old if isinstance(e, dict) and e.get("path") != entry["path"]
             and _is_number(e.get("step")) and _is_number(e.get("time"))] + [entry]
    man["snapshots"] = sorted(items, key=lambda e: (e["step"], e["time"]))
    atomic.write_json(project.paths.snapshots_json, man)


class ExportStage(Stage):
    name = "export"

    def is_done(self, project, run) -> bool:
        best, gguf = project.paths.checkpoint(BEST), project.final_gguf
        return (
            best.exists() and gguf.exists() and gguf.stat().st_mtime_ns >= best.stat().st_mtime_ns
        )

    def run(self, project, report, run) -> str:
        run_export(project, report)
        return "done"

    def clear(self, paths) -> None:
        return None  # exports are the user's files: only `reset output` deletes them


STAGE = ExportStage()
