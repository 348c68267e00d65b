"""The corpus sources a project selects: public prompt datasets, image datasets, image folders.

Connects the settings (`corpus.presets`, `corpus.weights`, `corpus.image_presets`,
`corpus.image_folders`) to the readers (prompt_presets.py, image_sources.py) and to the
materials they need. The corpus stage calls:

    pools = preset_pools(project, tally)      # {"gustavosta": [...], ...}; UserError if not
                                              # downloaded
    entries = image_entries(project, tally)   # [ImageEntry] from image datasets and folders
    fingerprint(project)                      # what must change for the corpus to rebuild

and the materials list (runner.downloads) adds `corpus_materials(settings)`, so a selected
dataset shows up in Setup → Materials with its status and Download button like a teacher.
Never downloads anything itself (a stage must not reach the network behind the user's back).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from gguf_trainer.base.errors import UserError
from gguf_trainer.materials.discovery import location
from gguf_trainer.materials.folder_check import check_folder
from gguf_trainer.materials.image_sources import (
    IMAGE_PRESETS,
    coco_entries,
    flickr_entries,
    folder_entries,
)
from gguf_trainer.materials.prompt_presets import PRESETS, HubDataset, read_preset
from gguf_trainer.materials.prompt_presets import fingerprint as preset_fingerprint


def known_ids(field: str) -> list[str]:
    """Valid ids for `corpus.presets` or `corpus.image_presets` (the settings validator)."""
    return list(PRESETS if field == "presets" else IMAGE_PRESETS)


def corpus_materials(settings) -> tuple[HubDataset, ...]:
    """The dataset materials the corpus settings select, prompt datasets first."""
    c = settings.corpus
    return (tuple(PRESETS[i] for i in c.presets if i in PRESETS)
            + tuple(IMAGE_PRESETS[i] for i in c.image_presets if i in IMAGE_PRESETS))


def _ready_folder(project, material: HubDataset) -> Path:
    folder = location(project, material)
    check = check_folder(folder, material.patterns)
    if not check.is_complete:
        state = "is not downloaded" if not check.files_done else "is only partly downloaded"
        raise UserError(f"{material.title} {state} ({folder}); press Download under Setup → "
                        f"Materials or run: gguf-trainer download --project {project.dir} "
                        f"--id {material.id}")
    return folder


def preset_pools(project, tally: Counter | None = None) -> dict[str, list[str]]:
    """Every prompt of each selected prompt dataset (bad rows counted in `tally`)."""
    tally = tally if tally is not None else Counter()
    return {pid: list(read_preset(_ready_folder(project, PRESETS[pid]), PRESETS[pid], tally))
            for pid in project.settings.corpus.presets}


def image_entries(project, tally: Counter | None = None) -> list:
    """Image + caption entries of the selected image datasets and folders (lazy images)."""
    tally = tally if tally is not None else Counter()
    c = project.settings.corpus
    entries: list = []
    for iid in c.image_presets:
        folder = _ready_folder(project, IMAGE_PRESETS[iid])
        reader = flickr_entries if IMAGE_PRESETS[iid].fmt == "flickr_zip" else coco_entries
        entries += reader(folder, tally)
    for folder in c.image_folders:
        entries += folder_entries(Path(folder).expanduser(), tally)
    return entries


def fingerprint(project) -> dict:
    """Dataset repo/revision/commit/file hashes (cached at download) and, per image folder
    in order, each image's name inside it, size and mtime (not where the folder is)."""
    c = project.settings.corpus
    out: dict = {"presets": {}, "image_presets": {}, "image_folders": []}
    for pid in c.presets:
        folder = location(project, PRESETS[pid])
        out["presets"][pid] = preset_fingerprint(folder, PRESETS[pid], project.paths.hashes_json)
    for iid in c.image_presets:
        folder = location(project, IMAGE_PRESETS[iid])
        out["image_presets"][iid] = preset_fingerprint(folder, IMAGE_PRESETS[iid],
                                                       project.paths.hashes_json)
    for folder in c.image_folders:
        root = Path(folder).expanduser()
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
        out["image_folders"].append([
            (p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
            for p in files])
    return out
