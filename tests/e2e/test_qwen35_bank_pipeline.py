"""The Qwen3.5 bridge with its FLUX.3 bank head on (train.bank_slots 80), mock teacher, in
process: the shards hold the second target set (data/bank_rows.py) beside the slot rows, training
adds the bank's loss and reports its figures, last.pt keeps the bank's statistics, and the export
carries a trained, folded bank (`out_bank`, `bank_in`) whose load_gguf forward gives the teacher's
scale."""

from __future__ import annotations

import json

import pytest
import torch
from pipeline_helpers import adapter_tensors, assert_same_tensors, make_project, run_pipeline

from gguf_trainer.data.shards import Shard, shard_files
from gguf_trainer.model.adapters import load_gguf
from gguf_trainer.store.project import load_project

pytestmark = pytest.mark.slow


SETTINGS = {"train.bank_slots": 80, "train.seed_rank": 16, "train.steps": 40,
            "train.val_every": 20, "train.lr": 3e-3, "train.history": True,
            "train.history_every": 20}


@pytest.fixture(scope="module")
def bank_run(tmp_path_factory, tiny_materials):
    root = tmp_path_factory.mktemp("bank") / "p"
    make_project(root, "qwen35_bridge", tiny_materials, **SETTINGS)
    assert run_pipeline(root) == "done"
    return load_project(root)


def test_shards_hold_the_bank_beside_the_slots(bank_run):
    shard = Shard(shard_files(bank_run.paths.shard_dir("train"))[0])
    t = shard.t
    assert int(t["bank_slots"][0]) == 80 and t["bank_rows"].shape[1] == 20480
    real, stored = t["bank_real"].long(), t["bank_len"].long()
    assert torch.equal(stored, real + (real % 80 != 0).long())  # real rows + one pad row
    assert int(t["bank_moment_n"][0]) == int(stored.sum())
    for i in range(shard.n):  # the body is the student's ids, cut to the bank's room
        assert int(t["bank_body"][i]) == min(len(shard.student_ids(i)), 72) or \
            int(t["bank_real"][i]) == 8


def test_training_fits_the_bank_beyond_its_mean(bank_run):
    rows = [json.loads(x) for x in bank_run.paths.metrics_jsonl.read_text().splitlines()]
    val = [r for r in rows if "val_bank_cos" in r]
    assert val, "validation reports the bank's figures"
    last = val[-1]
    print(f"bank val cos {last['val_bank_cos']:.4f} vs mean {last['val_bank_baseline_cos']:.4f}")
    assert last["val_bank_cos"] > last["val_bank_baseline_cos"]
    assert any("bank_cos" in r for r in rows)
    ev = json.loads(bank_run.paths.eval_json.read_text())  # the exported file's bank
    print(f"eval bank: cos {ev['bank']['bank_cos']:.4f} vs mean "
          f"{ev['bank']['bank_baseline_cos']:.4f}")
    assert ev["bank"]["bank_cos"] > ev["bank"]["bank_baseline_cos"]


def test_export_carries_the_trained_folded_bank(bank_run):
    ck = torch.load(bank_run.paths.checkpoints / "last.pt", weights_only=False)
    assert ck["bank_mu"].shape == (20480,)
    path = next(bank_run.paths.root.parent.glob("out/*.gguf"))
    model = load_gguf(path)
    cfg = model.config
    assert (cfg.n_bank, cfg.bank_dim, cfg.bank_align) == (80, 20480, True)
    assert model.out_bank.weight.abs().sum() > 0  # trained (the start is zero)
    # folded: the file's bank = mu + sigma_f * the checkpoint's standardized bank
    from gguf_trainer.model.adapters import AdapterConfig, build_adapter

    raw = build_adapter(AdapterConfig.from_dict(ck["config"]))
    raw.load_state_dict(ck["model"])
    x = torch.randn(1, 5, cfg.in_dim)
    ids = torch.tensor([[248045, 846, 198, 64, 248046, 198, 248045, 74455, 198, 248068, 198]])
    bh = torch.zeros(1, 80, cfg.in_dim)
    bh[0, 3:8] = x[0]
    with torch.no_grad():
        got = model(x, seed_ids=ids, want_bank=True, bank_hidden=bh)
        want = raw(x, seed_ids=ids, want_bank=True, bank_hidden=bh) * ck["bank_sigma_f"] \
            + ck["bank_mu"]
    rel = float((got - want).norm() / want.norm())
    print(f"export bank vs checkpoint bank (folded): rel {rel:.2e}")
    assert rel < 5e-3  # f16 weights


def test_a_stopped_bank_run_resumes_bit_identically(bank_run, tmp_path, tiny_materials):
    root = tmp_path / "p"
    make_project(root, "qwen35_bridge", tiny_materials, **SETTINGS)
    stop = lambda step, row, r: step == 14 and "loss" in row and r.request_stop()
    assert run_pipeline(root, on_metrics=stop) == "stopped"
    assert run_pipeline(root) == "done"
    assert_same_tensors(adapter_tensors(load_project(root).final_gguf),
                        adapter_tensors(bank_run.final_gguf))


def test_a_kept_step_exports_the_bank_as_last_pt_does(bank_run):
    """train.history keeps step 40 folded (the bank by its own statistics): its export is the
    export of last.pt at that step, tensor for tensor."""
    from gguf_trainer.data.kept_steps import load_kept
    from gguf_trainer.stages.export import export_checkpoint

    dest = bank_run.output_dir / "pig_qwen3.5_9b_adapter-step40-f16.gguf"  # the project's name
    export_checkpoint(bank_run, "step40", dest, True, load_kept(bank_run.paths, 40))
    kept = adapter_tensors(dest)
    export_checkpoint(bank_run, "last", dest, True)
    last = adapter_tensors(dest)
    assert "out_bank.weight" in kept
    assert_same_tensors(kept, last)
