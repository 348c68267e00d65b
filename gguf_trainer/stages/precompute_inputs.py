"""What precompute reads before and around its shards: the disk pre-flight (the shard bytes
still to write against the free space), the check of the shards already on disk (whole and
current, remembered by size and mtime in `verified.json`), and the project's vision_proj
(fitted once per student and teacher; its sha256 is one of the stages' inputs).

    disk_preflight(project, "val")                 # UserError when the disk cannot hold them
    verify_split(project, "train", fingerprint)    # deletes truncated, corrupt or stale shards
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from gguf_trainer.base import atomic, safe_delete
from gguf_trainer.base.paths import VERIFIED_JSON
from gguf_trainer.data import shards
from gguf_trainer.materials.materials import student_paths, teacher_paths
from gguf_trainer.model import vision

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- the disk


def disk_preflight(project, split: str) -> None:
    """Before the first shard of a run: the estimate of the shard bytes still to write (the
    pack's bytes per sample × the corpus), refused with both numbers when the disk cannot
    hold them, a warning when they would leave under 10% free."""
    from gguf_trainer.machine.disk_space import (
        check_precompute_disk,
        gb,
        precompute_need_bytes,
        shard_bytes_per_sample,
    )

    need = precompute_need_bytes(project)
    if need:
        log.info(
            "precompute[%s]: the shards still to write need ~%s (~%s per sample)",
            split,
            gb(need),
            gb(shard_bytes_per_sample(project)),
        )
    tight = check_precompute_disk(project)
    if tight:
        log.warning("precompute: %s", tight)


# ---------------------------------------------------------------- the shards already written


def _verified_record(folder: Path) -> dict:
    try:
        record = atomic.read_json(folder / VERIFIED_JSON, {})
    except (ValueError, OSError):  # a garbage cache is rebuilt, never fatal
        record = {}
    return record if isinstance(record, dict) else {}


def _unverified(folder: Path, record: dict):
    """(path, [size, mtime]) of each shard the record does not vouch for."""
    for path in shards.shard_files(folder):
        st = path.stat()
        key = [st.st_size, st.st_mtime_ns]
        if record.get(path.name) != key:
            yield path, key


def split_whole(project, split: str, fingerprint: str) -> bool:
    """Every shard of `split` is whole and current (looks only: verify_split repairs)."""
    folder = project.paths.shard_dir(split)
    return not any(
        shards.verify_shard(path, fingerprint)
        for path, _ in _unverified(folder, _verified_record(folder))
    )


def verify_split(project, split: str, fingerprint: str) -> None:
    """Recompute-instead-of-train-on: delete any shard that is truncated, corrupted or stale.
    Verified shards are remembered by (size, mtime) so a restart does not re-hash them."""
    folder = project.paths.shard_dir(split)
    record_path = folder / VERIFIED_JSON
    record = _verified_record(folder)
    changed = False
    for path, key in list(_unverified(folder, record)):
        reason = shards.verify_shard(path, fingerprint)
        if reason:
            # only the tool's own file inside the project: shards/<split> linked to a folder
            # of someone's *.safetensors must not lose them as "not shards"
            safe_delete.unlink_owned(path, project.paths.root, safe_delete.DAMAGED_SHARD)
            log.warning("shard %s/%s is %s; recomputing it", split, path.name, reason)
            record.pop(path.name, None)
        else:
            record[path.name] = key
        changed = True
    for tmp in folder.glob(".*.tmp"):  # a partial shard of a killed run
        safe_delete.unlink_owned(tmp, project.paths.root, safe_delete.DAMAGED_SHARD)
    if changed:
        atomic.write_json(record_path, record)


# ---------------------------------------------------------------- the project's vision_proj


def ensure_vision_for_project(project, student_sha256: str, teacher: dict) -> str | None:
    """The project's vision_proj sha256 (fitting it if needed), or None for packs without vision."""
    pack = project.pack
    if not pack.vis_dim:
        return None

    def tables():
        from gguf_trainer.model.student import read_embed_table

        if project.settings.precompute.mock_teacher:
            t = pack.build_mock_teacher(project).embed_table()
        else:
            t = vision.load_teacher_table(teacher_paths(project)["teacher"])
        return t, torch.from_numpy(read_embed_table(student_paths(project)[0]))

    inputs = {"student_sha256": student_sha256, "teacher": teacher}
    return vision.ensure_vision_proj(project.paths.vision_proj, inputs, tables)


def project_vision_sha(project, student_sha256: str, teacher: dict) -> str | None:
    """The sha256 ensure_vision_for_project would return, read without fitting (None: no vision,
    or not fitted from these materials yet)."""
    if not project.pack.vis_dim:
        return None
    inputs = {"student_sha256": student_sha256, "teacher": teacher}
    return vision.fitted_sha(project.paths.vision_proj, inputs)
