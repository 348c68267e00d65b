"""A project with an export fit to publish, built without a run: the real export writer
(write_adapter_gguf, record_export) writes an adapter of pig_clip's input width with the KV a
real-teacher export carries, beside a teacher folder holding the listing a download saves
and an eval.json of that file. Shared by the publish tests (unit and e2e)."""

from __future__ import annotations

import json
from pathlib import Path

from gguf_trainer.base import atomic, places
from gguf_trainer.base.safe_delete import file_record
from gguf_trainer.materials.folder_check import LISTING_JSON, MANIFEST_DIR
from gguf_trainer.packs.teacher_repos import T5_V1_1_XXL

PACK = "t5xxl_pixart"
TEACHER_COMMIT = "1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e"
TOKENIZER_COMMIT = "9f8e7d6c5b4a39281706f5e4d3c2b1a098765432"
PIG_CLIP_HIDDEN = 1024


def write_listing(folder: Path, repo: str, commit: str, license_id: str | None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    listing = {"repo": repo, "repo_type": "model", "revision": "main", "commit": commit,
               "files": {}}
    if license_id:
        listing["license"] = license_id
    atomic.write_json(folder / MANIFEST_DIR / LISTING_JSON, listing)
    return folder


def write_export(project, path: Path, kind: str, step: int, mock: bool = False,
                 in_dim: int = PIG_CLIP_HIDDEN, seed: int = 0) -> Path:
    """An adapter GGUF at `path`, recorded in exports.json as `kind`."""
    import torch

    from gguf_trainer import __version__
    from gguf_trainer.model.adapters import AdapterConfig, build_adapter
    from gguf_trainer.model.export import write_adapter_gguf
    from gguf_trainer.stages.export import record_export

    torch.manual_seed(seed)
    cfg = AdapterConfig("seeded_resampler", in_dim, 48, 128, 1, num_queries=8, seed_vocab=50)
    pack = project.pack
    meta = {"adapter.trained_steps": step, "adapter.planned_steps": 500,
            "adapter.checkpoint": "best" if kind == "final" else "last",
            "adapter.snapshot": kind != "final", "adapter.pack": pack.id,
            "adapter.trainer": f"gguf-trainer {__version__}", "adapter.mock_teacher": mock,
            **pack.export_kv}
    record_export(project, path, kind=kind, pending=True)
    write_adapter_gguf(path, build_adapter(cfg).state_dict(), cfg, metadata=meta,
                       name=project.settings.name)
    record_export(project, path, kind=kind)
    return path


def make_project(tmp_path: Path, mock: bool = False, in_dim: int = PIG_CLIP_HIDDEN,
                 teacher_license: str | None = "apache-2.0"):
    """(project, final GGUF path): a PixArt project whose final export is written."""
    from gguf_trainer.store.project import create_project, load_project

    teacher = write_listing(tmp_path / "materials" / "t5-v1_1-xxl-encoder-bf16", T5_V1_1_XXL,
                            TEACHER_COMMIT, teacher_license)
    tokenizer = write_listing(tmp_path / "materials" / "pig-clip-tokenizer",
                              "callgg/pig-clip-tokenizer", TOKENIZER_COMMIT, None)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a sheep in sunglasses\n", encoding="utf-8")
    root = tmp_path / "pig_t5_project"
    create_project(root, PACK, name="pig_t5_adapter", overrides={
        "corpus.files": [str(prompts)], "corpus.presets": ["gustavosta"],
        "corpus.n_train": 2000, "corpus.n_val": 64,
        "precompute.mock_teacher": mock,
        "materials": {"teacher": {"path": str(teacher)},
                      "student_tokenizer": {"path": str(tokenizer)}},
    })
    project = load_project(root)
    final = write_export(project, project.final_gguf, "final", 500, mock=mock, in_dim=in_dim)
    rec = file_record(final)
    atomic.write_json(project.paths.eval_json, {
        "pack": PACK, "gguf": places.record_key(final, project.dir.resolve()),
        "gguf_size": rec["size"], "gguf_sha256": rec["sha256"], "checkpoint": "best",
        "trained_steps": 500, "planned_steps": 500, "headline": "cos", "val_cos": 0.8123,
        "metrics": {"cos": 0.8123, "mse": 0.1042}, "baseline": {"baseline_cos": 0.51,
                                                             "baseline_mse": 0.3},
        "beats_baseline": True, "mock": mock})
    return project, final


def front_matter(card: str) -> dict:
    import yaml

    assert card.startswith("---\n"), card[:80]
    return yaml.safe_load(card[4:card.index("\n---", 4)])


def dumps(obj) -> str:
    return json.dumps(obj, indent=1)
