"""A render of a slot-kind project (ming_image here) takes its figure from the teacher half's
dump: ggk's full Ming teacher writes ming_te_out.bin + ming_tokens.txt, the very rows the adapter
learns, and `check` reads them against the adapter in PyTorch (the adapter's quality), instead of
the port check on the adapter half's own dump; without that dump the port check stands, saying
why (runner/render_job._figures, render.teacher_dump_checked)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from adapter_cases import export_random

from gguf_trainer import render
from gguf_trainer.check import compare
from gguf_trainer.model.adapters import AdapterConfig
from gguf_trainer.runner import render_job
from gguf_trainer.store.project import create_project, load_project

PROMPT = "a sheep in sunglasses"
HIDDEN = 64  # the tiny student


@pytest.fixture
def ming_project(tmp_path, tiny_materials, monkeypatch):
    from gguf_trainer.tiny.ming import ling_tokenizer_json

    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "home"))
    root = tmp_path / "p"
    create_project(root, "ming_image", overrides={
        "materials.student.path": str(tiny_materials["student"]),
        "materials.student_tokenizer.path": str(tiny_materials["tokenizer"])})
    project = load_project(root)
    cfg = AdapterConfig("ming_image", HIDDEN, 96, 64, 2, num_queries=256, seed_vocab=157184,
                        seed_rank=8, vis_dim=32, n_bank=24, bank_dim=64)
    project.final_gguf.parent.mkdir(parents=True, exist_ok=True)
    export_random(project.final_gguf, cfg, "ming_image", {"json": ling_tokenizer_json()},
                  seeds=(5, 6))
    return project


def _adapter_rows(project, tiny_materials) -> tuple[np.ndarray, list[int]]:
    """The adapter's rows for PROMPT in PyTorch (the student on the raw prompt, the Ling slot
    ids of Ming's template over the tokenizer.json the file carries) and those ids."""
    import torch

    from gguf_trainer.check.slot_dumps import ling_tokenizer_json
    from gguf_trainer.data.samples import Sample
    from gguf_trainer.engine.ling_bpe import EngineLingBPE, ming_prompt_ids
    from gguf_trainer.engine.qwen_bpe import engine_bpe
    from gguf_trainer.model.adapters import load_gguf
    from gguf_trainer.model.student import load_student

    ids, _ = ming_prompt_ids(EngineLingBPE(ling_tokenizer_json(project.final_gguf)), PROMPT)
    student = load_student(tiny_materials["student"], tiny_materials["tokenizer"])
    sids = project.pack.student_ids(engine_bpe(student.tokenizer).encode, Sample(PROMPT), [])
    x = torch.tensor([sids])
    with torch.no_grad():
        hidden = student.hidden(x, torch.ones_like(x))
        pred = load_gguf(project.final_gguf)(hidden, seed_ids=torch.tensor([ids]))[0]
    return pred[: 24 + len(ids)].float().numpy(), ids


def test_a_ming_render_reads_the_full_teachers_dump(ming_project, tiny_materials, tmp_path):
    project = ming_project
    assert render.teacher_dump_checked(project.pack)
    pred, ids = _adapter_rows(project, tiny_materials)
    out = tmp_path / "render"
    for half in ("teacher-dump", "adapter-dump"):
        (out / half).mkdir(parents=True)
    # the adapter half's dump: rows that are not the adapter's (a port check would say so)
    np.zeros(pred.shape, "<f4").tofile(out / "adapter-dump" / "adapter_out.bin")
    # the teacher's: the adapter's rows + noise, so its figure is high but not 1
    rng = np.random.default_rng(3)
    teacher = pred + 0.3 * pred.std() * rng.standard_normal(pred.shape)
    teacher.astype("<f4").tofile(out / "teacher-dump" / "ming_te_out.bin")
    (out / "teacher-dump" / "ming_tokens.txt").write_text("".join(f"{i}\n" for i in ids))
    plan = render.RenderPlan(runs=[render.Run("teacher", [], "teacher.png", "teacher-dump"),
                                   render.Run("adapter", [], "adapter.png", "adapter-dump")])
    fig, note = render_job._figures(project, PROMPT, out, plan)
    print(note, "|", render.figures_line(fig))
    assert note.startswith("quality") and "ming_te_out.bin" in note
    assert fig["verdict"].startswith("quality") and fig["slot_ids_checked"]
    assert Path(fig["dump"]) == out / "teacher-dump" / "ming_te_out.bin"
    assert set(fig["lead"]) == {"caption", "tokens"}
    want = compare(pred, teacher.astype(np.float32))
    assert fig["cos"] == pytest.approx(want["cos"], abs=1e-3) and 0.8 < fig["cos"] < 0.999

    (out / "teacher-dump" / "ming_te_out.bin").unlink()  # the teacher half wrote nothing
    fig, note = render_job._figures(project, PROMPT, out, plan)
    print(note)
    assert note.startswith("the teacher's dump was not read (") and "port check" in note
    assert fig["verdict"].startswith("port check") and Path(fig["dump"]).parent.name == \
        "adapter-dump"
