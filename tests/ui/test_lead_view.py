"""The GUI leads with the centred cosine of the val token rows the DiT reads: the cosine chart's
first series, the first metrics rows, the first line of the Output tab's evaluation; an
eval.json written before it reads as before."""

from __future__ import annotations

import json

from gguf_trainer.ui import live, logs_tab, output_tab, train_view

LEAD = {"metric": "centred_cos", "taps": [], "sets": {
    "tokens": {"all": {"centred_cos": 0.61, "rel_mse": 0.4, "baseline_centred_cos": 0.0}},
    "pads": {"all": {"centred_cos": 0.52, "rel_mse": 0.7, "baseline_centred_cos": 0.01}}}}


def test_the_chart_and_the_metrics_lead_with_the_token_rows_centred_cosine():
    assert next(iter(live.COS_SERIES.values())) == "val centred cos"
    cur = live.Cursor()
    cur.latest.update({"val_cc_tokens": 0.61, "val_cc_pads": 0.52, "val_cos": 0.97})
    text = train_view.metrics_md({}, cur)
    rows = [line for line in text.splitlines() if line.startswith("|") and "---" not in line]
    assert "val centred cos, tokens (last check) | 0.61" in rows[3]
    assert "val centred cos, pads (last check) | 0.52" in rows[4]
    assert "val cos (last check) | 0.97" in text


def test_the_evaluation_leads_with_it_and_an_old_eval_json_reads_as_before(tmp_path):
    from gguf_trainer.store.project import create_project

    root = tmp_path / "p"
    create_project(root, "qwen3vl_sefi")
    record = {"headline": "cos", "val_cos": 0.97, "metrics": {"cos": 0.97},
              "baseline": {"baseline_cos": 0.9}, "trained_steps": 10, "planned_steps": 10}
    (root / "eval.json").write_text(json.dumps(record))
    old = output_tab._eval_md(str(root), None)
    assert "centred" not in old and "headline **cos = 0.97" in old
    (root / "eval.json").write_text(json.dumps({**record, "lead": LEAD}))
    new = output_tab._eval_md(str(root), None)
    lead = ("**tokens centred cos 0.6100 rel_mse 0.400 (mean baseline 0.0000); "
            "pads centred cos 0.5200 rel_mse 0.700 (mean baseline 0.0100)**")
    assert lead in new and new.index(lead) < new.index("headline **cos = 0.97")


def test_the_training_progress_line_names_it_before_val_cos():
    line = logs_tab.progress_line({"step": 50, "time": 0, "loss": 0.5, "cos": 0.9,
                                   "val_cc_tokens": 0.61, "val_cc_pads": 0.52, "val_cos": 0.97})
    assert "train cos 0.9 · val centred cos 0.61 · pads 0.52 · val cos 0.97" in line
