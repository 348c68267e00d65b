"""A tiny REAL teacher trains end to end: a random `T5EncoderModel` with hidden size 32, loaded
from its material folder through the pack hook with the planner's placement, run through the
real T5 teacher code; then the teacher folder is deleted and export/eval still re-run from the
recorded fingerprints (`start --only export eval --force`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pipeline_helpers import adapter_tensors, assert_same_tensors, make_project, run_pipeline

from gguf_trainer.base.errors import UserError
from gguf_trainer.materials.spec import Material
from gguf_trainer.packs import register
from gguf_trainer.packs.t5_seeded import PIXART_EMBEDDER, T5SeededPack
from gguf_trainer.store import project as project_mod

HIDDEN = 32
SPIECE = (
    Path(__file__).parents[2]
    / "gguf_trainer"
    / "packs"
    / "demo_materials"
    / "t5xxl_pixart"
    / "spiece.model"
)


class TinyRealT5Pack(T5SeededPack):
    """The T5 kind's recipe on a hidden-32 T5 encoder: a test-only family with a real teacher
    hook."""

    id = "tiny_real_t5"
    title = "Tiny real T5 (test)"
    embedder = PIXART_EMBEDDER
    num_queries = 120
    out_dim = HIDDEN
    seed_vocab = 256  # the tiny sentencepiece model's pieces
    default_name = "tiny_real_t5_adapter"
    shard_contract = "tiny_real_t5/1"
    teacher_memory_gib = 0.01
    teacher_materials = (Material("teacher", "Teacher: tiny T5 encoder", "hf_snapshot"),)

    def load_teacher(self, materials, plan, device):
        from gguf_trainer.teachers.t5 import load_t5_teacher

        return load_t5_teacher(
            materials["teacher"],
            device,
            plan.mode,
            window=self.num_queries,
            vocab_limit=self.seed_vocab,
        )


register(TinyRealT5Pack())


def write_tiny_t5(folder: Path) -> Path:
    """A random hidden-32 T5 v1.1-style encoder (gated-gelu) with the tiny sentencepiece model."""
    import torch
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(3)
    config = T5Config(
        vocab_size=256,
        d_model=HIDDEN,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        feed_forward_proj="gated-gelu",
        is_encoder_decoder=False,
        use_cache=False,
        tie_word_embeddings=False,
        dropout_rate=0.0,
    )
    model = T5EncoderModel(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    shutil.copy(SPIECE, folder / "spiece.model")
    return folder


@pytest.fixture(scope="module")
def real_run(tmp_path_factory, tiny_materials):
    base = tmp_path_factory.mktemp("real")
    teacher = write_tiny_t5(base / "tiny-t5")
    root = base / "proj"
    make_project(
        root,
        TinyRealT5Pack.id,
        tiny_materials,
        **{"precompute.mock_teacher": False, "train.steps": 30, "train.val_every": 10},
    )
    project_mod.update_settings(root, {"materials.teacher.path": str(teacher)})
    assert run_pipeline(root) == "done"
    return {"root": root, "teacher": teacher, "project": project_mod.load_project(root)}


@pytest.mark.slow
def test_tiny_real_teacher_trains_end_to_end(real_run):
    proj = real_run["project"]
    ev = json.loads(proj.paths.eval_json.read_text())
    assert ev["mock"] is False and "note" not in ev
    assert ev["roundtrip_cos"] > 0.999
    assert ev["val_cos"] > ev["baseline"]["baseline_cos"]  # learned something beyond the mean
    man = json.loads((proj.paths.shard_dir("train") / "manifest.json").read_text())
    assert man["inputs"]["teacher"]["files"] == 3  # config.json, model.safetensors, spiece.model
    log = proj.paths.pipeline_log
    assert not log.exists() or "MOCK" not in log.read_text()


@pytest.mark.slow
def test_reexport_after_the_teacher_folder_is_deleted(real_run, tmp_path):
    root = tmp_path / "proj"
    shutil.copytree(real_run["root"], root)
    proj = project_mod.update_settings(root, {"export.output_dir": str(tmp_path / "out")})
    before = adapter_tensors(real_run["project"].final_gguf)
    gone = tmp_path / "teacher-was-here"
    shutil.copytree(real_run["teacher"], gone)
    project_mod.update_settings(root, {"materials.teacher.path": str(gone)})
    shutil.rmtree(gone)
    assert run_pipeline(root, only=["export", "eval"], force=True) == "done"
    assert_same_tensors(adapter_tensors(proj.final_gguf), before)
    # nothing was invalidated: shards and checkpoints are the ones trained
    assert (root / "checkpoints" / "best.pt").exists() and any(
        (root / "shards" / "train").iterdir()
    )
    # a stage that needs the teacher again names what is missing
    project_mod.update_settings(root, {"precompute.shard_size": 7})
    with pytest.raises(UserError, match="teacher-was-here does not exist"):
        run_pipeline(root)
    assert (root / "checkpoints" / "best.pt").exists()  # validate before destroy
