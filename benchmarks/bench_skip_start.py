"""How a token-aligned adapter's `skip` should start: measured, not guessed (the vision
extension's `skip` init is a recipe choice, and recipes are chosen by measurement).

Both starts predict no worse than the per-dimension mean baseline at step 0:
  mean   out_proj 0 with bias = train mean, skip 0 (step 0 == the baseline exactly);
  ridge  skip = the ridge least-squares map of student states to teacher rows (shards.linear_fit),
         out_proj 0 (step 0 == that linear fit, above the baseline on held-out rows).
For each, the MageFlow demo (mock teacher with images, the demo's sizes) is run from scratch
and the val cosine printed at step 0 and after `--steps` steps, with cos_vis / cos_txt.
The library always starts at zero + mean (the winner); the ridge run is this benchmark's own:
it makes the corpus and shards through the pipeline, fits the ridge map itself and hands it
to train.run_train (its `skip` parameter), then lets the pipeline export and evaluate.
The README's skip-start table quotes these figures. Prints one JSON object. Usage:

    python benchmarks/bench_skip_start.py [--steps 40] [--dir /tmp/skip_start]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def measure(root: Path, mode: str, corpus: Path, student: Path, tok: Path, steps: int) -> dict:
    from pipeline_helpers import run_pipeline

    from gguf_trainer.data.scoring import validate
    from gguf_trainer.data.shards import dims, linear_fit, load_stats, shard_files
    from gguf_trainer.demo import demo_overrides
    from gguf_trainer.model.adapters import TOKEN_ALIGNED_KINDS
    from gguf_trainer.model.vision import load_vision_proj
    from gguf_trainer.runner.stages import digest, stage_inputs, write_manifest
    from gguf_trainer.runner.state import Report, StateWriter
    from gguf_trainer.stages import train
    from gguf_trainer.stages.stage_list import STAGES
    from gguf_trainer.store.project import create_project, load_project

    overrides = {
        **demo_overrides("qwen3vl_mageflow", corpus, steps),
        "materials": {"student": {"path": str(student)}, "student_tokenizer": {"path": str(tok)}},
        "export.output_dir": str(root / "out"),
    }
    create_project(root, "qwen3vl_mageflow", overrides=overrides)
    assert (
        run_pipeline(root, only=list(STAGES[: STAGES.index("train")])) == "done"
    )  # corpus, shards
    proj = load_project(root)
    s = proj.settings.train
    files, val = (
        shard_files(proj.paths.shard_dir("train")),
        shard_files(proj.paths.shard_dir("val")),
    )
    stats = load_stats(files, s.sigma_floor)
    cfg = proj.pack.adapter_config(s, **dims(files[0]))
    assert cfg.kind in TOKEN_ALIGNED_KINDS, cfg.kind
    skip = linear_fit(files, stats if proj.pack.standardized else None) if mode == "ridge" else None
    # Train as the stage loop does (manifest first, the loop's fingerprint), with this start.
    inputs = stage_inputs(proj)["train"]
    write_manifest(proj.paths, train.STAGE, inputs, complete=True)
    writer = StateWriter(proj.paths, ["bench_skip_start", mode])
    report = Report(writer)
    try:
        report.begin_stage(train.STAGE.name)
        assert train.run_train(proj, report, digest(inputs), skip=skip) == "done"
        report.end_stage(train.STAGE.name, "done")
    finally:
        report.close_metrics()
        writer.close("done")
    assert run_pipeline(root) == "done"  # train is done: export and eval
    model = train.build_model(
        proj.pack, cfg, s.seed, stats, load_vision_proj(proj.paths.vision_proj), skip
    )
    step0 = validate(model, val, proj.pack, stats, s.batch_size, torch.device("cpu"))
    ev = json.loads(proj.paths.eval_json.read_text())
    return {
        "step0": {k: round(step0[k], 4) for k in ("val_cos", "cos_vis", "cos_txt")},
        f"step{steps}": {
            "val_cos": round(ev["val_cos"], 4),
            **{k: round(ev["metrics"][k], 4) for k in ("cos_vis", "cos_txt")},
        },
        "baseline_cos": round(ev["baseline"]["baseline_cos"], 4),
    }


def main() -> None:
    from gguf_trainer.tiny.mageflow_demo import write_demo_corpus
    from gguf_trainer.tiny.prompts import demo_prompts
    from gguf_trainer.tiny.student import (
        tiny_qwen3_config,
        write_tiny_student,
        write_tiny_tokenizer_dir,
    )

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/gguf_trainer_skip_start"))
    args = ap.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    mat = args.dir / "materials"
    mat.mkdir(parents=True)
    student = write_tiny_student(mat / "pig_clip-tiny-f16.gguf")
    tok = write_tiny_tokenizer_dir(mat / "tok", tiny_qwen3_config())
    corpus = write_demo_corpus(mat, demo_prompts(210))
    res = {
        mode: measure(args.dir / mode, mode, corpus, student, tok, args.steps)
        for mode in ("mean", "ridge")
    }
    print(json.dumps(res))


if __name__ == "__main__":
    main()
