"""Hub downloads, completeness checks and discovery against the local Hub-protocol server.

Everything goes through the real huggingface_hub client (HF_ENDPOINT -> tests/hub_server.py).
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
from material_repos import pig_clip_header_gguf
from safetensors.numpy import save as st_save

from gguf_trainer.base.errors import UserError
from gguf_trainer.materials import discovery, hub
from gguf_trainer.materials.folder_check import check_folder

TOKEN = "hf_unitTESTtoken0123456789"


def tensor_file(n: int, seed: int = 0) -> bytes:
    """A real safetensors file of about 4*n bytes."""
    return st_save({"w": np.random.default_rng(seed).standard_normal(n).astype(np.float32)})


def sharded_repo(n_shards: int = 3) -> dict[str, bytes]:
    files = {"config.json": b'{"d_model": 8}'}
    weight_map = {}
    for i in range(1, n_shards + 1):
        name = f"model-{i:05d}-of-{n_shards:05d}.safetensors"
        files[name] = tensor_file(800, seed=i)
        weight_map[f"layer{i}.w"] = name
    files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}).encode()
    return files


PATTERNS = ("config.json", "model.safetensors.index.json", "model-*.safetensors")


def test_fetch_resumes_a_partial_file_with_a_range_request(hub_server, tmp_path):
    files = {"config.json": b"{}", "model.safetensors": tensor_file(5000)}
    hub_server.add_repo("org/m", files)
    listing = hub.list_remote("org/m", "model", ("config.json", "*.safetensors"))
    big = listing.files["model.safetensors"]
    part = hub.partial_path(tmp_path / "m", big)
    part.parent.mkdir(parents=True)
    part.write_bytes(files["model.safetensors"][:7000])  # what a killed download leaves
    seen = []
    hub.fetch_listing(listing, tmp_path / "m", on_progress=lambda p, d, t: seen.append((p, d, t)))
    assert (tmp_path / "m" / "model.safetensors").read_bytes() == files["model.safetensors"]
    gets = hub_server.get_requests("/model.safetensors")
    assert [h.get("range") for h in gets] == ["bytes=7000-"]
    assert not part.exists()
    assert seen[-1][1:] == (big.size, big.size)
    assert check_folder(tmp_path / "m", ("config.json", "*.safetensors")).is_complete


def test_wrong_partial_bytes_are_discarded_not_installed(hub_server, tmp_path):
    data = tensor_file(5000)
    hub_server.add_repo("org/m", {"model.safetensors": data})
    listing = hub.list_remote("org/m", "model", ("*.safetensors",))
    part = hub.partial_path(tmp_path, listing.files["model.safetensors"])
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\0" * 9000)  # right length prefix, wrong content: the sha256 catches it
    with pytest.raises(UserError, match="does not match its sha256"):
        hub.fetch_listing(listing, tmp_path)
    assert not (tmp_path / "model.safetensors").exists() and not part.exists()
    hub.fetch_listing(listing, tmp_path)
    assert (tmp_path / "model.safetensors").read_bytes() == data


def test_gated_private_and_missing_repos_give_one_sentence(hub_server, monkeypatch):
    hub_server.add_repo("org/gated", {"a.json": b"{}"}, gated=True)
    hub_server.add_repo("org/private", {"a.json": b"{}"}, private=True)
    with pytest.raises(UserError) as e:
        hub.list_remote("org/gated")
    assert "gated" in str(e.value) and "hf auth login" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError, match="not found or is private.*hf auth login"):
        hub.list_remote("org/private")
    with pytest.raises(UserError, match="org/none was not found"):
        hub.list_remote("org/none")
    hub_server.tokens.add(TOKEN)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert set(hub.list_remote("org/gated").files) == {"a.json"}
    assert hub_server.get_requests("/revision/main")[-1]["authorization"] == f"Bearer {TOKEN}"


def test_a_pattern_the_repo_lacks_is_a_sentence(hub_server):
    hub_server.add_repo("org/m", {"config.json": b"{}"})
    with pytest.raises(UserError, match="no file matching spiece.model"):
        hub.list_remote("org/m", "model", ("config.json", "spiece.model"))


def test_partial_multi_shard_snapshot_is_not_ready_offline(tmp_path):
    files = sharded_repo(3)
    folder = tmp_path / "copy"
    folder.mkdir()
    for name, data in files.items():
        if "00002" not in name:  # one shard never arrived; every glob still matches a file
            (folder / name).write_bytes(data)
    check = check_folder(folder, PATTERNS)
    assert not check.is_complete and check.source == "index"
    assert check.missing == ["model-00002-of-00003.safetensors"]
    (folder / "model-00002-of-00003.safetensors").write_bytes(
        files["model-00002-of-00003.safetensors"][:-10]
    )
    assert check_folder(folder, PATTERNS).missing == [
        "model-00002-of-00003.safetensors (cut short)"
    ]
    (folder / "model-00002-of-00003.safetensors").write_bytes(
        files["model-00002-of-00003.safetensors"]
    )
    assert check_folder(folder, PATTERNS).is_complete
    (folder / "model.safetensors.index.json").unlink()  # the shard names still say "of 3"
    (folder / "model-00003-of-00003.safetensors").unlink()
    assert "model-00003-of-00003.safetensors" in check_folder(folder, PATTERNS).missing


def test_saved_listing_decides_offline_and_partials_count(hub_server, tmp_path):
    files = sharded_repo(2)
    hub_server.add_repo("org/m", files)
    listing = hub.list_remote("org/m", "model", PATTERNS)
    hub.fetch_listing(listing, tmp_path / "m")
    assert check_folder(tmp_path / "m", PATTERNS).source == "listing"
    (tmp_path / "m" / "config.json").unlink()
    part = hub.partial_path(tmp_path / "m", listing.files["config.json"])
    part.write_bytes(b"{")
    check = check_folder(tmp_path / "m", PATTERNS)
    assert not check.is_complete and check.missing == ["config.json"] and check.bytes_partial == 1


def _complete_copy(folder, files):
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)


def _downloaded_copy(folder, files, repo="org/T"):
    """A complete copy with the listing our download saves (its record of the repo)."""
    _complete_copy(folder, files)
    listing = folder / ".cache" / "gguf-trainer" / "listing.json"
    listing.parent.mkdir(parents=True)
    listing.write_text(
        json.dumps({"repo": repo, "files": {n: {"size": len(d)} for n, d in files.items()}})
    )


class _Mat:
    id, subdir, repo, repo_type, patterns = "teacher", "T", "org/T", "model", PATTERNS


def test_discovery_links_complete_copies_only(tmp_path, monkeypatch):
    files = sharded_repo(2)
    shared, other_project = tmp_path / "shared", tmp_path / "projects" / "p1" / "materials"
    incomplete = {k: v for k, v in files.items() if "00001" not in k}
    _complete_copy(shared / "T", incomplete)  # searched first, but missing a shard
    _downloaded_copy(other_project / "T", files)
    monkeypatch.setenv("GGUF_TRAINER_MATERIALS", str(shared))
    monkeypatch.chdir(tmp_path)
    roots = discovery.candidate_roots(tmp_path / "projects" / "me", tmp_path / "projects")
    assert roots[0] == shared
    assert discovery.find_snapshot(_Mat, roots) == other_project / "T"
    (other_project / "T" / "model-00002-of-00002.safetensors").unlink()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert discovery.find_snapshot(_Mat, roots) is None
    snap = tmp_path / "hub" / "models--org--T" / "snapshots" / ("a" * 40)
    _complete_copy(snap, files)
    assert discovery.find_snapshot(_Mat, roots) == snap


def test_student_discovery_prefers_f16_and_checks_the_magic(tmp_path):
    pig_clip_header_gguf(tmp_path / "pig_clip-q8_0.gguf", vocab=151936 + 64)  # not pig_clip's size
    pig_clip_header_gguf(tmp_path / "pig_clip-q4_k.gguf")
    pig_clip_header_gguf(tmp_path / "pig_clip-f16.gguf")
    (tmp_path / "pig_clip-f32.gguf").write_bytes(b"not a gguf" * 1000)
    passed = []
    best, why = discovery.find_student([tmp_path], passed)
    assert best.name == "pig_clip-f16.gguf" and "f16" in why and "pig_clip-q4_k.gguf" in why
    assert passed == [
        (f"{tmp_path / 'pig_clip-q8_0.gguf'} is not pig_clip: vocab 152000 (pig_clip has 151936)")
    ]
    (tmp_path / "pig_clip-f16.gguf").unlink()
    best, why = discovery.find_student([tmp_path])
    assert best.name == "pig_clip-q4_k.gguf" and "largest" in why


def test_student_discovery_never_takes_a_stand_in(tmp_path):
    """The demo's tiny student (hidden 64) and a full-size file carrying the stand-in key are
    both passed over, each with its reason; a GGUF cut short is refused by its header."""
    from gguf_trainer.tiny.student import write_tiny_student

    write_tiny_student(tmp_path / "pig_clip-tiny-f16.gguf")
    pig_clip_header_gguf(tmp_path / "pig_clip-fake-f16.gguf", tiny_key=True)
    cut = tmp_path / "pig_clip-cut-f16.gguf"
    cut.write_bytes((tmp_path / "pig_clip-fake-f16.gguf").read_bytes()[:2000])
    passed = []
    assert discovery.find_student([tmp_path], passed)[0] is None
    reasons = " | ".join(sorted(passed))
    assert "pig_clip-tiny-f16.gguf is a tiny stand-in" in reasons
    assert "pig_clip-fake-f16.gguf is a tiny stand-in" in reasons
    assert "pig_clip-cut-f16.gguf is truncated" in reasons
    layout = discovery.student_layout(tmp_path / "pig_clip-tiny-f16.gguf")
    assert (layout["hidden"], layout["layers"], layout["vocab"]) == (64, 2, 151936)


def test_snapshot_discovery_checks_identity(tmp_path):
    """A complete copy is linked only when it is the material: no stand-in marker, the repo
    its saved listing names, and the config values `expect` asks for."""
    files = sharded_repo(2)
    marked, other_repo, good = (tmp_path / r / "T" for r in ("a", "b", "c"))
    _complete_copy(marked, files)
    _downloaded_copy(other_repo, files, repo="someone/else")
    _downloaded_copy(good, files)
    (marked / "GGUF_TRAINER_TINY").write_text("demo")
    passed = []
    roots = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    assert discovery.find_snapshot(_Mat, roots, passed=passed) == good
    assert passed == [
        f"{marked} is a tiny stand-in made by gguf-trainer (demo or test), not org/T",
        f"{other_repo} was downloaded from someone/else, not org/T",
    ]
    passed.clear()
    tok = tmp_path / "d" / "T"  # a tokenizer copied by hand: its identity is the config
    _complete_copy(tok, files)
    assert (
        discovery.find_snapshot(_Mat, [tmp_path / "d"], expect={"hidden_size": 1024},
                                passed=passed)
        is None
    )
    assert passed == [f"{tok} does not match the student: hidden_size None (the student has 1024)"]
    (tok / "config.json").write_text('{"hidden_size": 1024}')
    assert discovery.find_snapshot(_Mat, [tmp_path / "d"], expect={"hidden_size": 1024}) == tok


def test_a_complete_copy_made_by_hand_is_unverified_not_linked(tmp_path):
    """Issue 24: a teacher folder copied in by hand (no download record) was linked because
    it was complete. Nothing says it is the repo, so it is returned as unverified, with the
    sentence telling how to accept it; the Hub's listing (file list and sizes) decides it."""
    files = sharded_repo(2)
    hand, local_dir = tmp_path / "a" / "T", tmp_path / "b" / "T"
    _complete_copy(hand, files)
    _complete_copy(local_dir, files)  # `hf download --local-dir`: the Hub client's tree cache
    tree = local_dir / ".cache" / "huggingface" / "trees" / ("c" * 40 + ".json")
    tree.parent.mkdir(parents=True)
    tree.write_text(json.dumps({"files": {n: {"size": len(d)} for n, d in files.items()}}))
    passed, unverified = [], []
    roots = [tmp_path / "a", tmp_path / "b"]
    assert discovery.find_snapshot(_Mat, roots, passed=passed, unverified=unverified) is None
    assert passed == [] and unverified == [hand, local_dir]
    sentence = discovery.unverified_sentence(_Mat, hand, tmp_path / "proj")
    assert "no download record" in sentence and "not linked" in sentence
    assert f"gguf-trainer link --project {tmp_path / 'proj'} teacher {hand}" in sentence
    assert "\n" not in sentence and sentence.count(". ") == 0
    hub_sizes = {n: len(d) for n, d in files.items()}
    assert discovery.listing_problem(_Mat, hand, hub_sizes) is None
    assert discovery.listing_problem(_Mat, hand, {**hub_sizes, "config.json": 999}) == (
        f"{hand} is not org/T: its files differ from the Hub's listing (config.json)"
    )


def test_token_is_sent_but_never_returned_or_written(hub_server, tmp_path, monkeypatch):
    hub_server.tokens.add(TOKEN)
    hub_server.add_repo("org/gated", {"a.safetensors": tensor_file(600)}, gated=True)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    listing = hub.list_remote("org/gated", "model", ("*.safetensors",))
    hub.fetch_listing(listing, tmp_path / "g")
    assert hub_server.get_requests("/a.safetensors")[0]["authorization"] == f"Bearer {TOKEN}"
    assert hub.has_token() is True
    for p in tmp_path.rglob("*"):
        if p.is_file():
            assert TOKEN.encode() not in p.read_bytes(), p
    assert TOKEN not in json.dumps(listing.as_json())


def test_listing_sha256_matches_the_lfs_etag(hub_server):
    data = tensor_file(700)
    hub_server.add_repo("org/m", {"w.safetensors": data, "small.json": b"{}"})
    files = hub.list_remote("org/m").files
    assert files["w.safetensors"].sha256 == hashlib.sha256(data).hexdigest()
    assert files["small.json"].sha256 is None and os.path.basename("small.json")


def test_a_pattern_the_saved_listing_never_covered_is_not_complete(hub_server, tmp_path):
    hub_server.add_repo("org/m", {"config.json": b"{}", "tokenizer.json": b"{}"})
    hub.fetch_listing(hub.list_remote("org/m", "model", ("config.json",)), tmp_path / "m")
    assert check_folder(tmp_path / "m", ("config.json",)).is_complete
    grown = check_folder(tmp_path / "m", ("config.json", "tokenizer.json"))
    assert not grown.is_complete and grown.missing == ["tokenizer.json (not in the saved listing)"]


def test_a_transfer_broken_mid_file_with_an_expired_url_is_asked_for_again(
    hub_server, tmp_path, monkeypatch
):
    monkeypatch.setattr(hub, "RETRY_WAITS_S", (0.0,))
    data = np.random.default_rng(1).bytes(12 * 1024 * 1024)  # > the client's 10 MiB chunk
    hub_server.add_repo("org/big", {"weights.bin": data})
    listing = hub.list_remote("org/big")
    hub_server.break_after("weights.bin", 11 * 1024 * 1024, then_status=403)
    hub.fetch_listing(listing, tmp_path / "big")
    assert (tmp_path / "big" / "weights.bin").read_bytes() == data
    gets = hub_server.get_requests("/weights.bin")
    heads = hub_server.get_requests("/weights.bin", method="HEAD")
    assert [h.get("range") for h in gets] == [None, "bytes=10485760-", "bytes=10485760-"]
    assert len(heads) == 2  # a fresh location for the second try
    hub_server.add_repo("org/big2", {"weights.bin": data})
    hub_server.break_after("weights.bin", 0, then_status=403)  # no progress: fail at once
    with pytest.raises(UserError, match="answered 403"):
        hub.fetch_listing(hub.list_remote("org/big2"), tmp_path / "big2")


def test_offline_mode_is_a_sentence_naming_the_setting_not_an_exception_name():
    from huggingface_hub import errors as e

    why = hub.explain_hub_error(e.OfflineModeIsEnabled("offline"), "org/teacher")
    assert "HF_HUB_OFFLINE" in why and "org/teacher" in why and "OfflineMode" not in why
