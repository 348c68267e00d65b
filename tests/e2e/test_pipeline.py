"""The pipeline end to end, in-process, on tiny projects with mock teachers.

Covers: every pack (plus a fourth registered here) produces a GGUF and eval.json that
beats the mean baseline; a rerun does nothing; each fingerprint input invalidates what
depends on it and nothing else; interrupted runs resume bit-identically; corrupted shards
and truncated checkpoints; live step changes; snapshots; resets.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from pipeline_helpers import adapter_tensors, assert_same_tensors, make_project, run_pipeline

from gguf_trainer.base import atomic
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.packs import register
from gguf_trainer.packs.base import TrainerPack
from gguf_trainer.runner import reset as reset_mod
from gguf_trainer.runner import stages
from gguf_trainer.stages.train import STAGE as train_stage
from gguf_trainer.store import project as project_mod


class TinyResamplerPack(TrainerPack):
    """A fourth pack, added from outside the package exactly as the README describes."""

    id = "tiny_test_resampler"
    title = "Tiny test resampler"
    adapter_kind = "resampler"
    out_dim = 48
    num_queries = 8
    default_name = "tiny_adapter"
    shard_contract = "tiny_test/1"
    headline = "cos_centered"
    centered = True
    standardized = True
    engine_command_template = "ggk --llm {student} --llm-adapter {adapter}"

    def format_prompt(self, text):
        return f"Draw: {text.strip()}"

    def build_mock_teacher(self, project):
        from gguf_trainer.packs.mock import MockQueryTeacher

        return MockQueryTeacher(self.id, self.num_queries, self.out_dim, seed=99)


register(TinyResamplerPack())
TINY_PACK = TinyResamplerPack.id


def stage_status(root):
    return {
        k: (v["status"], v.get("skipped"))
        for k, v in json.loads((root / "state.json").read_text())["stages"].items()
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_materials):
    """One uninterrupted run of the tiny pack: the bit-exact reference."""
    root = tmp_path_factory.mktemp("ref") / "proj"
    make_project(root, TINY_PACK, tiny_materials)
    assert run_pipeline(root) == "done"
    proj = project_mod.load_project(root)
    return {"root": root, "tensors": adapter_tensors(proj.final_gguf), "project": proj}


@pytest.mark.parametrize("pack_id", ["t5xxl_pixart", "qwen3vl_mageflow", "llada_image", TINY_PACK])
def test_each_pack_end_to_end(pack_id, tmp_path, tiny_materials):
    extra = (
        {"corpus.n_train": 24, "precompute.shard_size": 12, "train.steps": 12}
        if pack_id == "llada_image"
        else {}
    )
    root = tmp_path / "proj"
    proj = make_project(root, pack_id, tiny_materials, **extra)
    assert run_pipeline(root) == "done"
    ev = json.loads(proj.paths.eval_json.read_text())
    print(pack_id, ev["headline"], ev["val_cos"], "baseline", ev["baseline"])
    assert proj.final_gguf.exists() and ev["mock"] is True and "MOCK" in ev["note"]
    assert ev["val_cos"] > ev["baseline"][f"baseline_{ev['headline']}"]
    assert ev["roundtrip_cos"] > 0.999
    best = json.loads((proj.paths.checkpoints / "best.json").read_text())
    # best is the final step here
    assert abs(best["val_cos"] - ev["checkpoint_metrics"]["val_cos"]) < 1e-6
    # A rerun does nothing: every stage is reported done-and-skipped, no file is rewritten.
    mtime = proj.final_gguf.stat().st_mtime_ns
    assert run_pipeline(root) == "done"
    assert all(s == ("done", True) for s in stage_status(root).values())
    assert proj.final_gguf.stat().st_mtime_ns == mtime


def _fresh_copy(reference, tmp_path):
    root = tmp_path / "proj"
    shutil.copytree(reference["root"], root)
    return root


def _outputs(root):
    return {
        "corpus": ProjectPaths(root).samples("train").exists(),
        "precompute_val": any((root / "shards" / "val").glob("*.safetensors")),
        "precompute_train": any((root / "shards" / "train").glob("*.safetensors")),
        "train": (root / "checkpoints" / "last.pt").exists(),
    }


CHANGES = [  # (what changes, how, which stages are redone)
    (
        "corpus setting",
        {"corpus.n_val": 10},
        {"corpus", "precompute_val", "precompute_train", "train"},
    ),
    (
        "student dtype",
        {"precompute.student_dtype": "f32"},
        {"precompute_val", "precompute_train", "train"},
    ),
    ("val shard size", {"precompute.val_shard_size": 6}, {"precompute_val", "train"}),
    ("train lr", {"train.lr": 1e-3}, {"train"}),
    ("adapter width", {"train.width": 128}, {"train"}),
    ("seed", {"train.seed": 5}, {"train"}),
    ("steps", {"train.steps": 20}, set()),
    (
        "devices and budgets",
        {
            "train.device": "cpu",
            "precompute.teacher_batch": 3,
            "precompute.tok_budget": 999,
            "precompute.student_batch": 2,
            "precompute.teacher_mode": "offload",
            "train.threads": 2,
        },
        set(),
    ),
]


@pytest.mark.parametrize("what,change,redone", CHANGES, ids=[c[0] for c in CHANGES])
def test_each_input_invalidates_only_its_dependents(
    what, change, redone, reference, tmp_path, caplog
):
    root = _fresh_copy(reference, tmp_path)
    proj = project_mod.update_settings(root, change)
    stages.invalidate_changed(proj, stages.stage_inputs(proj))
    gone = {k for k, present in _outputs(root).items() if not present}
    assert gone == redone
    if redone:
        assert "inputs changed" in caplog.text
        assert any(p.name.startswith("checkpoints.stale-") for p in root.iterdir())


def test_source_file_and_student_file_changes(reference, tmp_path, tiny_materials):
    root = _fresh_copy(reference, tmp_path)
    src = tmp_path / "prompts.txt"
    shutil.copy(tiny_materials["prompts"], src)
    proj = project_mod.update_settings(root, {"corpus.files": [str(src)]})
    inputs = stages.stage_inputs(proj)
    stages.invalidate_changed(proj, inputs)  # a different path is a different input
    run_pipeline(root, only=["corpus", "precompute_val", "precompute_train"])
    with src.open("a") as f:
        f.write("one more prompt about a lighthouse\n")
    stages.invalidate_changed(proj, stages.stage_inputs(proj))
    assert not _outputs(root)["corpus"] and not _outputs(root)["precompute_train"]
    # The student GGUF: same content under a new mtime keeps everything; new bytes do not.
    run_pipeline(root, only=["corpus", "precompute_val", "precompute_train"])
    student = tmp_path / "student.gguf"
    shutil.copy(tiny_materials["student"], student)
    proj = project_mod.update_settings(root, {"materials.student.path": str(student)})
    stages.invalidate_changed(proj, stages.stage_inputs(proj))
    assert _outputs(root)["precompute_train"]
    with student.open("r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(b"\x00\x01\x02\x03")
    stages.invalidate_changed(proj, stages.stage_inputs(proj))
    assert _outputs(root)["corpus"] and not _outputs(root)["precompute_train"]


def test_mock_flag_and_contract_are_in_the_shard_fingerprint(reference, tmp_path, monkeypatch):
    root = _fresh_copy(reference, tmp_path)
    proj = project_mod.load_project(root)
    before = stages.stage_inputs(proj)["precompute_train"]
    monkeypatch.setattr(TinyResamplerPack, "shard_contract", "tiny_test/2")
    assert stages.changed_keys(before, stages.stage_inputs(proj)["precompute_train"]) == [
        "contract"
    ]
    proj = project_mod.update_settings(root, {"precompute.mock_teacher": False})
    # a real teacher is needed, and mock shards are not reused
    with pytest.raises(UserError, match="no real teacher"):
        stages.stage_inputs(proj)


INTERRUPTIONS = {
    "stop inside val precompute": {"stop_when": lambda r: r.stop_checks == 2},
    "stop between stages": {"stop_when": lambda r: r.stop_checks == 4},
    "stop inside train precompute": {"stop_when": lambda r: r.stop_checks == 7},
    "stop mid-epoch": {"on_metrics": lambda step, row, r: step == 4 and r.request_stop()},
}


@pytest.mark.parametrize("name", INTERRUPTIONS)
def test_interrupted_run_resumes_bit_identically(name, reference, tmp_path, tiny_materials):
    root = tmp_path / "proj"
    make_project(root, TINY_PACK, tiny_materials)
    assert run_pipeline(root, **INTERRUPTIONS[name]) == "stopped"
    assert run_pipeline(root) == "done"
    proj = project_mod.load_project(root)
    assert_same_tensors(adapter_tensors(proj.final_gguf), reference["tensors"])
    steps = [
        r["step"]
        for r in map(json.loads, proj.paths.metrics_jsonl.read_text().splitlines())
        if "loss" in r
    ]
    assert len(steps) == len(set(steps))


@pytest.mark.parametrize("crash_at", ["shard write", "train step 5"])
def test_crash_resumes_bit_identically(crash_at, reference, tmp_path, tiny_materials, monkeypatch):
    """An exception at an arbitrary point stands in for kill -9 (the e2e supervisor tests
    kill real processes): whatever was not saved is redone, with the same result."""
    from gguf_trainer.stages import precompute

    root = tmp_path / "proj"
    make_project(root, TINY_PACK, tiny_materials)

    class Crash(BaseException):
        pass

    if crash_at == "shard write":
        real = precompute.shards.write_shard
        calls = []

        def flaky(*a, **k):
            calls.append(1)
            if len(calls) == 3:
                raise Crash()
            return real(*a, **k)

        monkeypatch.setattr(precompute.shards, "write_shard", flaky)
        with pytest.raises(Crash):
            run_pipeline(root)
        monkeypatch.setattr(precompute.shards, "write_shard", real)
    else:

        def boom(step, row, r):
            if step == 6 and "loss" in row:
                raise Crash()

        with pytest.raises(Crash):
            run_pipeline(root, on_metrics=boom)
    assert run_pipeline(root) == "done"
    proj = project_mod.load_project(root)
    assert_same_tensors(adapter_tensors(proj.final_gguf), reference["tensors"])
    steps = [
        r["step"]
        for r in map(json.loads, proj.paths.metrics_jsonl.read_text().splitlines())
        if "loss" in r
    ]
    assert len(steps) == len(set(steps))


def _shard_content(path):
    from safetensors.torch import load_file

    from gguf_trainer.data.shards import read_meta

    # safetensors writes metadata keys in hash order: compare content, not bytes
    return read_meta(path), {k: v.tolist() for k, v in load_file(str(path)).items()}


def test_corrupted_shard_is_recomputed(reference, tmp_path, caplog):
    root = _fresh_copy(reference, tmp_path)
    shard = sorted((root / "shards" / "train").glob("*.safetensors"))[1]
    original, content = shard.read_bytes(), _shard_content(shard)
    data = bytearray(original)
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    run_pipeline(root, only=["precompute_train"])
    assert "checksum mismatch" in caplog.text
    assert _shard_content(shard) == content  # recomputed identically, never trained on
    shard.write_bytes(original[: len(original) // 2])
    run_pipeline(root, only=["precompute_train"])
    assert "truncated" in caplog.text and _shard_content(shard) == content


def test_stage_predicates_only_look(reference, tmp_path, caplog):
    """inputs and is_done write, delete and log nothing, even over a damaged shard: the loop's
    Stage.tidy is what drops it (then the stage is redone)."""
    from gguf_trainer.runner.stages import RunContext, digest, stage_inputs, stage_objects

    root = _fresh_copy(reference, tmp_path)
    shard = sorted((root / "shards" / "train").glob("*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:100])
    (root / "shards" / "train" / "verified.json").unlink(missing_ok=True)
    before = _tree_bytes(root)
    proj = project_mod.load_project(root)
    inputs = stage_inputs(proj)
    run = RunContext(fingerprints={k: digest(v) for k, v in inputs.items()})
    done = {s.name: s.is_done(proj, run.for_stage(s)) for s in stage_objects()}
    assert _tree_bytes(root) == before and not caplog.text
    assert not done["precompute_train"] and done["precompute_val"] and done["train"]
    assert stages.is_done(proj, stage_objects()[2], inputs, run) is False
    assert not shard.exists() and "truncated" in caplog.text  # the loop's tidy dropped it


def test_truncated_checkpoint_is_a_clear_error(reference, tmp_path):
    root = _fresh_copy(reference, tmp_path)
    proj = project_mod.set_steps(root, 15) and project_mod.load_project(root)
    last = proj.paths.checkpoints / "last.pt"
    last.write_bytes(last.read_bytes()[:1000])
    with pytest.raises(UserError, match="last.pt is damaged"):
        run_pipeline(root)


def test_steps_lowered_mid_run_then_raised_after_the_end(tmp_path, tiny_materials):
    root = tmp_path / "proj"
    proj = make_project(root, TINY_PACK, tiny_materials)

    def lower(step, row, r):
        if step == 4 and "loss" in row:
            project_mod.set_steps(root, 5)

    assert run_pipeline(root, on_metrics=lower) == "done"
    last = json.loads((proj.paths.checkpoints / "last.json").read_text())
    assert last["step"] == 5 and proj.final_gguf.exists()  # read at the log step, honoured at once
    assert json.loads(proj.paths.eval_json.read_text())["trained_steps"] == 5
    project_mod.set_steps(root, 10)  # raising it un-finishes training
    assert not train_stage.is_done(project_mod.load_project(root), None)
    assert run_pipeline(root) == "done"
    last = json.loads((proj.paths.checkpoints / "last.json").read_text())
    assert last["step"] == 10 and last["steps"] == 10
    steps = [
        r["step"]
        for r in map(json.loads, proj.paths.metrics_jsonl.read_text().splitlines())
        if "loss" in r
    ]
    assert steps == sorted(set(steps)) and steps[-1] == 10


def test_snapshot_during_training_leaves_the_result_unchanged(reference, tmp_path, tiny_materials):
    root = tmp_path / "proj"
    proj = make_project(root, TINY_PACK, tiny_materials)

    def request(step, row, r):
        if step == 4 and "loss" in row:
            atomic.write_text(proj.paths.snapshot_request, "now\n")

    assert run_pipeline(root, on_metrics=request) == "done"
    assert not proj.paths.snapshot_request.exists()  # the trainer answered it
    assert_same_tensors(adapter_tensors(proj.final_gguf), reference["tensors"])


def test_snapshot_export_and_manifest(reference, tmp_path):
    from gguf_trainer.model.adapter_file import read_adapter
    from gguf_trainer.runner.snapshot import run_snapshot

    root = _fresh_copy(reference, tmp_path)
    entry = run_snapshot(root, "last", evaluate=True)
    proj = project_mod.load_project(root)
    view = read_adapter(proj.snapshot_gguf(12))
    assert not view.problems and view.metadata["adapter.snapshot"] is True
    assert (
        view.metadata["adapter.trained_steps"] == 12
        and view.metadata["adapter.checkpoint"] == "last"
    )
    man = json.loads(proj.paths.snapshots_json.read_text())["snapshots"]
    assert [e["step"] for e in man] == [12] and entry["eval"]["headline"] > 0


def test_reset_targets_and_shared_output_folder(reference, tmp_path, tiny_materials):
    from gguf_trainer.runner.reset import reset_project
    from gguf_trainer.runner.snapshot import run_snapshot

    out = tmp_path / "out"
    a = tmp_path / "a"
    b = tmp_path / "b"
    for root, name in ((a, "pig_llada"), (b, "pig_llada_v2")):
        shutil.copytree(reference["root"], root)
        project_mod.update_settings(root, {"name": name, "export.output_dir": str(out)})
        (root / "exports.json").unlink()
        run_pipeline(root, only=["export"], force=True)
        run_snapshot(root, "last")
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "pig_llada-f16.gguf",
        "pig_llada-step12-f16.gguf",
        "pig_llada_v2-f16.gguf",
        "pig_llada_v2-step12-f16.gguf",
    ]
    deleted = reset_project(a, "output")
    assert sorted(p.name for p in out.iterdir()) == [
        "pig_llada_v2-f16.gguf",
        "pig_llada_v2-step12-f16.gguf",
    ]
    assert any(d.endswith("pig_llada-f16.gguf") for d in deleted)
    reset_project(b, "train")
    assert (
        not (b / "checkpoints").exists()
        and not (b / "eval.json").exists()
        and (b / "shards").exists()
    )
    reset_project(b, "shards")
    assert not (b / "shards").exists() and (b / "data").exists()
    reset_project(b, "corpus")
    assert not (b / "data").exists()
    with pytest.raises(UserError, match="unknown reset target"):
        reset_project(b, "everything")


def test_copy_to_and_forced_reexport(reference, tmp_path):
    root = _fresh_copy(reference, tmp_path)
    dest = tmp_path / "ggk-models"
    # its own output folder: the reference's (shared, absolute) holds the reference's GGUF,
    # which a copy never writes over
    proj = project_mod.update_settings(
        root, {"export.copy_to": str(dest), "export.output_dir": str(tmp_path / "out")})
    assert run_pipeline(root, only=["export", "eval"], force=True) == "done"
    copied = dest / proj.final_gguf.name
    assert copied.read_bytes() == proj.final_gguf.read_bytes()
    # recorded relative to the project's parent (places.py); the control API reads it absolute
    assert str(copied.resolve()) in {e["path"] for e in reset_mod.recorded_exports(proj.paths)}


def test_nan_loss_stops_with_a_sentence_and_keeps_the_last_good_checkpoint(
    tmp_path, tiny_materials, monkeypatch
):
    from gguf_trainer.stages import train

    root = tmp_path / "proj"
    proj = make_project(root, TINY_PACK, tiny_materials)
    real, calls = train.compute_loss, []

    def poisoned(*a, **k):
        loss, parts = real(*a, **k)
        calls.append(1)
        return (loss * float("nan"), parts) if len(calls) == 5 else (loss, parts)

    monkeypatch.setattr(train, "compute_loss", poisoned)
    with pytest.raises(UserError, match="loss became nan at step 5"):
        run_pipeline(root)
    # save_every 3
    assert json.loads((proj.paths.checkpoints / "last.json").read_text())["step"] == 3


def test_mock_env_is_recorded_when_a_run_starts(tmp_path, tiny_materials, monkeypatch):
    root = tmp_path / "proj"
    make_project(
        root, TINY_PACK, tiny_materials, **{"precompute.mock_teacher": False, "train.threads": 0}
    )
    monkeypatch.setenv(stages.MOCK_ENV, "1")
    proj = stages.prepare_run(project_mod.load_project(root).paths)
    assert proj.settings.precompute.mock_teacher is True and proj.settings.train.threads >= 1
    monkeypatch.setenv(stages.MOCK_ENV, "0")
    assert not stages.env_wants_mock()


# ----------------------------------------------------------------- validate before destroy


def _tree_bytes(root):
    """Every file under shards/ and checkpoints/ by relative path -> bytes."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for folder in ("shards", "checkpoints")
        for p in sorted((root / folder).rglob("*"))
        if p.is_file()
    }


def _bad_student(kind, reference, tmp_path):
    good = reference["project"].material_path("student").read_bytes()
    path = tmp_path / "new-student.gguf"
    if kind == "adapter gguf":  # a valid GGUF that is not a pig_clip student
        shutil.copy(reference["project"].final_gguf, path)
    else:
        path.write_bytes(
            {
                "zero-byte": b"",
                "truncated": good[: len(good) // 3],
                "foreign bytes": b"PK\x03\x04" + bytes(range(256)) * 40,
                "gguf header only": good[:64],
            }[kind]
        )
    return {"materials.student.path": str(path)}


SETTING_CHANGES = {
    "mock off, no teacher": {"precompute.mock_teacher": False},
    # within the schema, not the RAM
    "absurd width": {"train.width": 16384, "train.depth": 64},
    "no such device": {"train.device": "cuda:7", "train.lr": 1e-3},
}
BAD_INPUTS = [
    "zero-byte",
    "truncated",
    "foreign bytes",
    "gguf header only",
    "adapter gguf",
    *SETTING_CHANGES,
]


@pytest.mark.parametrize("kind", BAD_INPUTS)
def test_a_bad_new_input_is_refused_before_anything_is_invalidated(kind, reference, tmp_path):
    """Issue 8 class 1: shards (hours of GPU work) and checkpoints stay byte-identical, nothing
    is moved aside, and the refusal is one sentence."""
    root = _fresh_copy(reference, tmp_path)
    before = _tree_bytes(root)
    change = SETTING_CHANGES.get(kind) or _bad_student(kind, reference, tmp_path)
    project_mod.update_settings(root, change)
    with pytest.raises(UserError) as err:
        run_pipeline(root)
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message and message.endswith((".", ")")), (
        message
    )
    assert _tree_bytes(root) == before
    assert not any(p.name.startswith("checkpoints.stale-") for p in root.iterdir())


def test_export_is_recorded_before_the_file_lands(reference, tmp_path, monkeypatch):
    """A kill between writing the GGUF and recording it must not make the next start take the
    project's own GGUF for another project's (the name-clash refusal)."""
    from gguf_trainer.stages import export as export_stage
    from gguf_trainer.store.project import check_name_clash

    root = _fresh_copy(reference, tmp_path)
    proj = project_mod.update_settings(root, {"export.output_dir": str(tmp_path / "out")})
    real = export_stage.record_export

    class Killed(BaseException):
        pass

    def die_after_write(project, path, kind, pending=False):
        if not pending:
            raise Killed()  # as if kill -9 landed between the write and the final record
        real(project, path, kind, pending)

    monkeypatch.setattr(export_stage, "record_export", die_after_write)
    with pytest.raises(Killed):
        run_pipeline(root, only=["export"], force=True)
    monkeypatch.setattr(export_stage, "record_export", real)
    assert proj.final_gguf.exists()
    check_name_clash(project_mod.load_project(root))  # ours: no refusal
    assert run_pipeline(root, only=["export"], force=True) == "done"
    files = {e["path"]: e for e in reset_mod.recorded_exports(proj.paths)}
    assert files[str(proj.final_gguf.resolve())]["sha256"]  # the final record proves it is ours
