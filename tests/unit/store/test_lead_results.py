"""`status` and the result lines lead with the centred cosine of the rows the DiT reads
(eval.json "lead"); an eval.json written before it reads as before; a pack without a published
run leads its n/a health line with it, a pack with one keeps its own metric's verdict."""

from __future__ import annotations

import json

from gguf_trainer.cli.run import format_status
from gguf_trainer.packs import get_pack
from gguf_trainer.store.project import create_project
from gguf_trainer.store.results import describe_results

LEAD = {"metric": "centred_cos", "taps": [4, 8], "sets": {
    "tokens": {"all": {"centred_cos": 0.61, "rel_mse": 0.4, "baseline_centred_cos": 0.0,
                       "per_tap": [{"centred_cos": 0.7}, {"centred_cos": 0.52}]},
               "short": {"centred_cos": 0.63}, "long": {"centred_cos": 0.55}},
    "pads": {"all": {"centred_cos": 0.52, "rel_mse": 0.7, "baseline_centred_cos": 0.01}}}}
RECORD = {"headline": "cos", "val_cos": 0.97, "baseline": {"baseline_cos": 0.9}}


def test_the_eval_line_leads_with_the_lead_and_an_old_record_reads_as_before(tmp_path):
    root = tmp_path / "p"
    create_project(root, "qwen3vl_sefi")
    (root / "eval.json").write_text(json.dumps(RECORD))
    res = describe_results(root)
    assert res["eval_line"] == "cos 0.9700 vs mean baseline 0.9000" and res["lead"] is None
    (root / "eval.json").write_text(json.dumps({**RECORD, "lead": LEAD}))
    res = describe_results(root)
    assert res["eval_line"] == (
        "tokens centred cos 0.6100 rel_mse 0.400 (mean baseline 0.0000) [short 0.6300, "
        "long 0.5500]; pads centred cos 0.5200 rel_mse 0.700 (mean baseline 0.0100); tokens "
        "per tap: L4 0.700, L8 0.520; cos 0.9700 vs mean baseline 0.9000")
    assert res["lead"] == LEAD  # status --json carries the block


def test_status_shows_the_val_token_rows_centred_cosine_before_val_cos():
    info = {"project": "p", "message": "running", "status": "running", "stages": {
        "train": {"status": "running", "val_cos": 0.97, "val_cc_tokens": 0.61,
                  "val_cc_pads": 0.52, "step": 5}}}
    line = format_status(info).splitlines()[1]
    assert line.index("val_cc_tokens=0.61") < line.index("val_cc_pads=0.52") < line.index(
        "val_cos=0.97")


def test_status_shows_the_short_and_long_prompts_apart_where_the_eval_has_them():
    from gguf_trainer.data.scoring import validate  # noqa: F401  (the fields' source)
    from gguf_trainer.runner.status import sanitize_state
    from gguf_trainer.stages.train import LEAD_FIELDS

    assert LEAD_FIELDS == ("val_cc_tokens", "val_cc_tokens_short", "val_cc_tokens_long",
                           "val_cc_pads", "val_cc_pads_short", "val_cc_pads_long")
    stage = {"status": "running", "val_cos": 0.97, "val_cc_tokens": 0.61,
             "val_cc_tokens_short": 0.63, "val_cc_tokens_long": 0.55, "val_cc_pads": 0.52,
             "val_cc_pads_short": "junk", "val_cc_pads_long": None, "step": 5}
    st = sanitize_state({"status": "running", "stages": {"train": stage}})
    info = {"project": "p", "message": "running", "status": "running", "stages": st["stages"]}
    line = format_status(info).splitlines()[1]
    assert line.index("val_cc_tokens=0.61") < line.index("val_cc_tokens_short=0.63") < (
        line.index("val_cc_tokens_long=0.55")) < line.index("val_cc_pads=0.52") < line.index(
        "val_cos=0.97")
    # no long prompt's pad rows: nothing to show; a value that is no number is dropped
    assert "val_cc_pads_long" not in line and "val_cc_pads_short" not in line


def test_the_health_line_leads_with_it_only_where_no_published_run_judges():
    sefi = get_pack("qwen3vl_sefi")  # no published run: n/a
    line = sefi.health_line({"cos": 0.97, "baseline_cos": 0.9}, LEAD)
    assert line.startswith("n/a: no published pig_clip + ")
    assert "tokens centred cos 0.6100 (mean baseline 0.0000); plain cos 0.9700" in line
    assert sefi.health_line({"cos": 0.97, "baseline_cos": 0.9}) == line.replace(
        "tokens centred cos 0.6100 (mean baseline 0.0000); plain ", "")
    pixart = get_pack("t5xxl_pixart")  # a published run: its own metric's verdict
    assert pixart.health_line({"cos": 0.81, "trained_steps": 40000}, LEAD) == pixart.health_line(
        {"cos": 0.81, "trained_steps": 40000})
