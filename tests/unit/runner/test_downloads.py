"""Material status, linking, disk pre-flight and the foreground download, in-process
(the detached jobs are in tests/e2e/test_download_jobs.py)."""

from __future__ import annotations

import json
import os

import pytest
from material_repos import (
    T5_REPO,
    TOK_REPO,
    pig_clip_header_gguf,
    pig_clip_tokenizer_files,
    tiny_t5_files,
    tokenizer_files,
)

from gguf_trainer import cli
from gguf_trainer.base.errors import UserError
from gguf_trainer.machine import disk_space
from gguf_trainer.materials import discovery
from gguf_trainer.packs import get_pack
from gguf_trainer.runner import control, downloads, material_status
from gguf_trainer.store.project import create_project, load_project, update_settings

TOK_FILES = tokenizer_files()


@pytest.fixture
def t5(hub_server, tmp_path, monkeypatch):
    material_status._listing_cache.clear()  # each test serves its own repos
    files = tiny_t5_files()
    hub_server.add_repo(T5_REPO, files)
    hub_server.add_repo(TOK_REPO, TOK_FILES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GGUF_TRAINER_MATERIALS", raising=False)
    monkeypatch.setattr("gguf_trainer.base.paths.PROJECTS_ROOT", tmp_path / "projects")
    root = tmp_path / "projects" / "t5"
    create_project(root, "t5xxl_pixart")
    del files["README.md"]  # on the Hub, but not one of the pack's files
    return root, files


def _row(root, mid, online=False):
    return next(r for r in downloads.material_statuses(root, online) if r["id"] == mid)


def test_status_goes_missing_partial_ready(t5):
    root, files = t5
    dest = root / "materials" / "t5-v1_1-xxl-encoder-bf16"
    assert _row(root, "teacher")["state"] == "missing"
    assert (
        _row(root, "student")["state"] == "missing" and "not set" in _row(root, "student")["error"]
    )
    dest.mkdir(parents=True)
    (dest / "config.json").write_bytes(files["config.json"])
    row = _row(root, "teacher")
    assert row["state"] == "partial" and "spiece.model" in row["missing_files"]
    online = _row(root, "teacher", online=True)  # the Hub's listing gives the real total
    assert online["state"] == "partial" and online["files_total"] == 6
    assert online["bytes_total"] == sum(len(v) for v in files.values())
    lines = []
    assert downloads.download_foreground(root, ["teacher"], on_line=lines.append) == 0
    assert lines[-1].startswith("teacher: ready at")
    summary = get_pack("t5xxl_pixart").check_teacher({"teacher": dest})
    assert lines[-2] == f"teacher: checked: {summary}"  # the content check, after a fresh download
    row = _row(root, "teacher", online=True)
    assert row["state"] == "ready", (row["error"], row["note"], row["missing_files"])
    assert row["verified"] is True and summary in row["note"]
    assert load_project(root).material_path("teacher") == dest.resolve()
    assert "is complete at" in (root / downloads.DOWNLOAD_LOG).read_text()


def test_the_demo_student_tokenizer_folder_is_ready(t5):
    """The folder the demo writes (the Qwen BPE files and config.json) is every file the
    student loader reads: "ready" at 100% of its bytes, not "partial"."""
    from gguf_trainer.tiny.student import tiny_qwen3_config, write_tiny_tokenizer_dir

    root, _ = t5
    tok = write_tiny_tokenizer_dir(root / "materials" / "pig-clip-tokenizer", tiny_qwen3_config())
    update_settings(root, {"materials.student_tokenizer.path": str(tok)})
    row = _row(root, "student_tokenizer")
    assert row["state"] == "ready", row["missing_files"]
    assert row["files_done"] == row["files_total"] and row["bytes_done"] == row["bytes_total"] > 0
    (tok / "tokenizer.json").unlink()  # a file the loader needs: not ready
    assert _row(root, "student_tokenizer")["state"] == "partial"


def test_a_complete_teacher_whose_content_check_fails_is_failed_not_ready(t5, hub_server):
    """Every file is there, but spiece.model is not a sentencepiece model: state "failed" with
    the check's sentence, the download says so, and nothing offers to fetch it again."""
    root, _ = t5
    bad = {**tiny_t5_files(), "spiece.model": b"not a sentencepiece model"}
    hub_server.add_repo(T5_REPO, bad)
    lines = []
    assert downloads.download_foreground(root, ["teacher"], on_line=lines.append) == 1
    assert lines[-1].startswith("teacher: failed - ") and "spiece.model" in lines[-1]
    row = _row(root, "teacher", online=True)
    assert row["files_done"] == row["files_total"] == 6  # complete, yet not ready
    assert row["state"] == "failed" and row["verified"] is False and "spiece.model" in row["error"]
    (started,) = downloads.start_download(root, ["teacher"])
    assert started["action"] == "failed" and "spiece.model" in started["message"]
    again = []
    assert downloads.download_foreground(root, ["teacher"], on_line=again.append) == 1
    assert again == [f"teacher: failed - {row['error']}"]


def test_listing_failure_is_shown_not_hidden(t5, hub_server):
    root, _ = t5
    hub_server.add_repo(T5_REPO, tiny_t5_files(), gated=True)
    material_status._listing_cache.clear()
    row = _row(root, "teacher", online=True)
    assert row["state"] == "missing" and "gated" in row["note"]


def test_link_refuses_incomplete_and_accepts_complete(t5, tmp_path):
    root, files = t5
    copy = tmp_path / "mine"
    copy.mkdir()
    for name, data in files.items():
        if name != "spiece.model":
            (copy / name).write_bytes(data)
    with pytest.raises(UserError, match="not a complete copy.*spiece.model"):
        downloads.link_material(root, "teacher", copy)
    (copy / "spiece.model").write_bytes(files["spiece.model"])
    row = downloads.link_material(root, "teacher", copy)
    assert row["state"] == "ready" and row["linked"] and row["path"] == str(copy.resolve())
    with pytest.raises(UserError, match="not a GGUF file"):
        downloads.link_material(root, "student", copy / "config.json")
    # naming the folder that holds copies works too: the snapshot and the student inside it
    holder = tmp_path / "models"
    holder.mkdir()
    copy.rename(holder / "t5-v1_1-xxl-encoder-bf16")
    assert downloads.link_material(root, "teacher", holder)["path"] == str(
        (holder / "t5-v1_1-xxl-encoder-bf16").resolve()
    )
    pig_clip_header_gguf(holder / "pig_clip-f16.gguf")
    assert downloads.link_material(root, "student", holder)["path"].endswith("pig_clip-f16.gguf")
    with pytest.raises(UserError, match="does not exist"):
        downloads.link_material(root, "teacher", tmp_path / "nowhere")


def test_link_found_picks_copies_and_the_f16_student(t5, tmp_path, monkeypatch):
    root, _files = t5
    shared = tmp_path / "shared"
    (shared / "pig-clip-tokenizer").mkdir(parents=True)
    for name, data in pig_clip_tokenizer_files().items():
        (shared / "pig-clip-tokenizer" / name).write_bytes(data)
    pig_clip_header_gguf(shared / "pig_clip-f16.gguf")
    pig_clip_header_gguf(shared / "pig_clip-q4_k.gguf")
    monkeypatch.setenv("GGUF_TRAINER_MATERIALS", str(shared))
    found = {d["id"]: d for d in downloads.link_found(root)}
    assert set(found) == {"student", "student_tokenizer"}  # no teacher copy anywhere
    assert (
        found["student"]["path"].endswith("pig_clip-f16.gguf")
        and "f16" in found["student"]["message"]
    )
    row = _row(root, "student_tokenizer")
    assert row["state"] == "ready" and row["source"] == f"linked from {shared.resolve()}"
    assert downloads.link_found(root) == []  # nothing left to link


def test_download_missing_never_links_the_demo_materials(t5, tmp_path):
    """Issue 24: after the demo, "Download missing" on a new PixArt project linked the demo's
    tiny student and its stand-in tokenizer (hidden 64) and marked both ready. Now each is
    passed over with its reason, the tokenizer is downloaded, and the student stays unset."""
    from gguf_trainer.demo import prepare_demo

    root, _ = t5
    demo = prepare_demo("t5xxl_pixart", dest=tmp_path / "projects" / "demo_t5xxl_pixart", steps=5)
    lines = []
    downloads.download_foreground(root, ["student", "student_tokenizer"], on_line=lines.append)
    assert not any("linked" in line and "not linked" not in line for line in lines), lines
    assert (
        f"student: not linked: {demo / 'materials' / 'pig_clip-tiny-f16.gguf'} is a tiny "
        "stand-in made by gguf-trainer (demo or test), not pig_clip" in lines
    )
    assert any(
        line.startswith(
            f"student_tokenizer: not linked: {demo / 'materials' / 'pig-clip-tokenizer'} "
            "is a tiny stand-in"
        )
        for line in lines
    ), lines
    tok = _row(root, "student_tokenizer")  # fetched from the Hub instead
    assert tok["state"] == "ready" and tok["source"] == "downloaded"
    assert load_project(root).material_path("student") is None
    assert _row(root, "student")["state"] == "missing"
    log = (root / downloads.DOWNLOAD_LOG).read_text()
    assert "student: not linked:" in log and "student_tokenizer: not linked:" in log


def test_the_tokenizer_must_match_the_student(t5, tmp_path, monkeypatch):
    """A complete tokenizer folder whose config.json declares another hidden size than the
    project's student is not linked; the one matching the student is, and says where from."""
    root, _ = t5
    student = pig_clip_header_gguf(tmp_path / "pig_clip-f16.gguf")
    update_settings(root, {"materials.student.path": str(student)})
    wrong, right = tmp_path / "w" / "pig-clip-tokenizer", tmp_path / "r" / "pig-clip-tokenizer"
    for folder, hidden in ((wrong, 64), (right, 1024)):
        folder.mkdir(parents=True)
        for name, data in pig_clip_tokenizer_files(hidden=hidden).items():
            (folder / name).write_bytes(data)
    monkeypatch.setenv(
        "GGUF_TRAINER_MATERIALS", os.pathsep.join([str(wrong.parent), str(right.parent)])
    )
    passed = {}
    (found,) = downloads.link_found(root, passed)
    assert found["id"] == "student_tokenizer" and found["path"] == str(right)
    assert passed == {
        "student_tokenizer": [
            f"{wrong} does not match the student: hidden_size 64 (the student has 1024)"
        ]
    }
    assert _row(root, "student")["source"] == f"linked from {tmp_path.resolve()}"
    lines = downloads.format_statuses(downloads.material_statuses(root)).splitlines()
    assert f"linked from {tmp_path.resolve()}" in next(x for x in lines if x.startswith("student "))


def test_a_teacher_copied_by_hand_is_linked_only_when_the_hub_listing_matches(
    t5, tmp_path, monkeypatch, hub_server, capsys
):
    """Issue 24: a complete teacher folder copied in by hand (no download record) was linked
    and marked ready. Offline it is shown as found but unverified, with the sentence saying how
    to accept it (in the log, and in the run's missing-teacher sentence); online it is linked
    only when its file list and sizes match the Hub's listing, and passed over when not."""
    root, files = t5
    (teacher,) = get_pack("t5xxl_pixart").teacher_materials
    shared = tmp_path / "shared"
    hand = shared / "t5-v1_1-xxl-encoder-bf16"
    hand.mkdir(parents=True)
    for name, data in files.items():
        (hand / name).write_bytes(data)
    monkeypatch.setenv("GGUF_TRAINER_MATERIALS", str(shared))
    student = pig_clip_header_gguf(tmp_path / "pig_clip-f16.gguf")
    tok = tmp_path / "tok"
    tok.mkdir()
    for name, data in pig_clip_tokenizer_files().items():
        (tok / name).write_bytes(data)
    update_settings(root, {"materials.student.path": str(student),
                           "materials.student_tokenizer.path": str(tok)})

    unverified = {}
    assert downloads.link_found(root, unverified_over=unverified) == []
    line = discovery.unverified_sentence(teacher, hand, load_project(root).dir)
    assert unverified == {"teacher": [line]}
    assert _row(root, "teacher")["state"] == "missing"
    assert f"teacher: {line}" in (root / downloads.DOWNLOAD_LOG).read_text()
    assert cli.main(["materials", "--project", str(root), "--link-found"]) == 0
    out = capsys.readouterr().out
    assert f"teacher: {line}\n" in out and "teacher            missing" in out
    with pytest.raises(UserError) as info:  # the run says what is missing and what was found
        control.preflight(root)
    msg = str(info.value)
    assert "is missing" in msg and msg.endswith(f"; found for teacher: {line}.")

    hub_server.add_repo(T5_REPO, {**files, "config.json": files["config.json"] + b" "})
    material_status._listing_cache.clear()
    passed = {}
    assert downloads.link_found(root, passed, online=True) == []
    assert passed == {
        "teacher": [(f"{hand} is not {T5_REPO}: its files differ from the Hub's listing "
                     "(config.json)")]
    }

    hub_server.add_repo(T5_REPO, files, gated=True)  # the Hub refuses: unverified, with why
    material_status._listing_cache.clear()
    unverified = {}
    assert downloads.link_found(root, online=True, unverified_over=unverified) == []
    (why,) = unverified["teacher"]
    assert why.startswith(line) and "checking it against the Hub failed" in why and "gated" in why

    hub_server.add_repo(T5_REPO, files)  # the listing matches: linked, nothing fetched
    material_status._listing_cache.clear()
    lines = []
    assert downloads.download_foreground(root, ["teacher"], on_line=lines.append) == 0
    assert lines[0] == (f"teacher: linked the copy at {hand}: its files and sizes match "
                        f"{T5_REPO}'s listing on the Hub")
    assert hub_server.get_requests(".safetensors") == []
    row = _row(root, "teacher")
    assert row["state"] == "ready" and row["source"] == f"linked from {shared.resolve()}"


def test_selected_datasets_become_materials(t5):
    root, _ = t5
    update_settings(root, {"corpus.presets": ["vidprom"], "corpus.image_presets": ["flickr30k"]})
    rows = {r["id"]: r for r in downloads.material_statuses(root)}
    assert rows["prompts_vidprom"]["wanted"] and rows["prompts_vidprom"]["repo_type"] == "dataset"
    assert rows["images_flickr30k"]["state"] == "missing"


def test_download_and_precompute_disk_preflight(t5, monkeypatch):
    root, _ = t5
    monkeypatch.setattr(disk_space, "free_bytes", lambda path: 1000)
    lines = []
    assert downloads.download_foreground(root, ["teacher"], on_line=lines.append) == 1
    assert lines[-1].startswith("teacher: failed - callgg/t5-v1_1-xxl-encoder-bf16 needs 0.2 MB")
    assert "only 0.0 MB are free" in lines[-1]
    row = _row(root, "teacher")
    assert row["state"] == "failed" and "are free" in row["error"]
    with pytest.raises(UserError, match="precompute .* needs .* GB more"):
        disk_space.check_precompute_disk(load_project(root))
    monkeypatch.setattr(disk_space, "free_bytes", lambda path: 10**15)
    assert disk_space.check_precompute_disk(load_project(root)) is None
    assert json.dumps(downloads.material_statuses(root))  # statuses are JSON for the GUI


def test_precompute_estimate_counts_the_written_corpus_and_refuses_before_the_teacher(
    tmp_path, monkeypatch
):
    """The default n_train (60 000) would ask ~26 GB for T5 shards; a corpus of 40 samples
    needs ~17 MB. The stage's check refuses before the teacher loads, with both numbers."""
    from types import SimpleNamespace

    from gguf_trainer.data.samples import Sample, write_samples
    from gguf_trainer.stages import precompute

    root = tmp_path / "p"
    create_project(root, "t5xxl_pixart")
    project = load_project(root)
    per_sample = project.pack.bytes_per_sample
    assert disk_space.sample_counts(project)["train"] >= 60_000  # no corpus yet: the settings
    write_samples(project.paths.samples("train"), [Sample(f"prompt {i}") for i in range(35)])
    write_samples(project.paths.samples("val"), [Sample(f"val {i}") for i in range(5)])
    assert disk_space.sample_counts(project) == {"train": 35, "val": 5}
    assert disk_space.precompute_need_bytes(project) == int(per_sample * 40 * 1.1)
    monkeypatch.setattr(disk_space, "free_bytes", lambda path: 100 * 10**6)
    assert disk_space.check_precompute_disk(project) is None  # the default project is not refused

    def teacher_loads(_project):
        raise AssertionError("the teacher loaded before the disk pre-flight")

    monkeypatch.setattr(precompute, "Context", teacher_loads)
    monkeypatch.setattr(disk_space, "free_bytes", lambda path: 10**6)
    with pytest.raises(UserError) as e:
        precompute.PRECOMPUTE_VAL.check(project, SimpleNamespace(cache={}))
    need = disk_space.gb(int(per_sample * 40 * 1.1))
    assert f"needs {need} more" in str(e.value) and "only 1.0 MB are free" in str(e.value)


def test_a_linked_hf_cache_snapshot_is_never_written_into(t5, tmp_path):
    root, files = t5
    snap = tmp_path / "hub" / "models--callgg--t5-v1_1-xxl-encoder-bf16" / "snapshots" / ("b" * 40)
    snap.mkdir(parents=True)
    for name, data in files.items():
        (snap / name).write_bytes(data)
    assert downloads.link_material(root, "teacher", snap)["state"] == "ready"
    (snap / "spiece.model").unlink()
    assert _row(root, "teacher")["state"] == "partial"
    lines = []
    assert downloads.download_foreground(root, ["teacher"], on_line=lines.append) == 0
    dest = root / "materials" / "t5-v1_1-xxl-encoder-bf16"
    assert lines[-1] == f"teacher: ready at {dest} (0.2 MB)"
    assert not (snap / "spiece.model").exists() and (dest / "spiece.model").is_file()
    assert load_project(root).material_path("teacher") == dest.resolve()


def test_a_download_that_stopped_receiving_shows_rate_zero(t5, monkeypatch):
    import time

    root, _ = t5
    dest = root / "materials" / "t5-v1_1-xxl-encoder-bf16"
    downloads.job_folder(dest).mkdir(parents=True)
    progress = {
        "bytes_done": 5,
        "bytes_total": 10,
        "files_done": 0,
        "files_total": 6,
        "rate_bps": 1000,
        "eta_s": 0.1,
        "updated": time.time(),
    }
    running = {"status": "running", "pid": 4242, "progress": progress, "error": None, "log": "x"}
    monkeypatch.setattr(material_status.jobs, "job_status", lambda folder, name: running)
    row = _row(root, "teacher")
    assert row["state"] == "downloading" and row["rate_bps"] == 1000 and row["pid"] == 4242
    progress["updated"] = time.time() - 100
    row = _row(root, "teacher")
    assert row["rate_bps"] == 0 and row["eta_s"] is None and "no data from the Hub" in row["note"]
