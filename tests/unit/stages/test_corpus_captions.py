"""Upsampled captions in the corpus, against the stand-in endpoint (tests/caption_stand_in.py;
tests/caption_server/ runs a real server): a seeded share of each split rewritten, each caption
right after its prompt, the same samples whatever the number of requests in flight; stopped
part-way, the corpus asks only for what it lacks (data/captions.jsonl survives the stage's
clear); another model's captions are never reused; the fingerprint of a corpus without an
endpoint is what it was before the setting existed; an unreachable endpoint is refused in one
sentence before the old corpus is touched; an edit sample is asked with the i2i request
(its image first, then the scaffold) and its caption keeps the image."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest
from caption_stand_in import stand_in

from gguf_trainer.data.samples import read_samples
from gguf_trainer.materials.caption_client import CaptionError
from gguf_trainer.runner.control import new_project
from gguf_trainer.stages import corpus, corpus_captions
from gguf_trainer.stages.stage_list import Stopped
from gguf_trainer.store.project import load_project, update_settings

PACK = "qwen3vl_flux3"


class FakeReport:
    def __init__(self, stop_after: int | None = None):
        self.rows: list[tuple] = []
        self.stop_after = stop_after

    def progress(self, done, total=None, unit=None, **kw):
        self.rows.append((done, total, unit))

    def stop_requested(self) -> bool:
        done = [d for d, _t, u in self.rows if u == "captions"]
        return self.stop_after is not None and bool(done) and done[-1] >= self.stop_after


def _project(tmp_path, url: str, **corpus_settings):
    tmp_path.mkdir(parents=True, exist_ok=True)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"prompt number {i}, a fox in the snow\n" for i in range(80)))
    root = tmp_path / "proj"
    overrides = {"export.output_dir": str(tmp_path / "out"), "corpus.files": [str(prompts)],
                 "corpus.n_train": 40, "corpus.n_val": 12, "corpus.empty_frac": 0.05,
                 "corpus.caption_endpoint": url, "corpus.caption_share": 0.25,
                 "corpus.caption_max_tokens": 64}
    overrides.update({f"corpus.{k}": v for k, v in corpus_settings.items()})
    new_project(root, PACK, overrides=overrides)
    return load_project(root)


def _split(project, name):
    return [s.text for s in read_samples(project.paths.samples(name))]


def test_a_share_of_each_split_gains_a_caption_right_after_its_prompt(tmp_path):
    with stand_in() as server:
        project = _project(tmp_path, server.url, caption_workers=3)
        corpus.run_corpus(project, FakeReport())
        asked = server.prompts()
    train, val = _split(project, "train"), _split(project, "val")
    plain = [t for t in train if not t.startswith("detailed caption")]
    assert len(plain) == 40 + 2  # n_train and its empty prompts (empty_frac 0.05)
    captions = [t for t in train if t.startswith("detailed caption")]
    assert len(captions) == round(0.25 * 40) and len(asked) == 10 + round(0.25 * 12)
    for i, t in enumerate(train):
        if t.startswith("detailed caption"):
            assert t.endswith(f"of <{train[i - 1]}>")  # right after the prompt it rewrites
    assert sum(t.startswith("detailed caption") for t in val) == 3
    body = server.bodies[0]
    assert body["max_tokens"] == 64 and body["model"] == "stand-in-model"
    assert body["presence_penalty"] == 1.5 and body["top_k"] == 20
    lines = project.paths.captions.read_text().splitlines()
    assert len(lines) == 13 and {json.loads(x)["model"] for x in lines} == {"stand-in-model"}


def test_stopped_part_way_asks_only_for_what_it_lacks(tmp_path):
    with stand_in() as server:
        whole = _project(tmp_path / "whole", server.url, caption_workers=1)
        corpus.run_corpus(whole, FakeReport())
        server.bodies.clear()
        project = _project(tmp_path / "cut", server.url, caption_workers=1)
        with pytest.raises(Stopped):
            corpus.run_corpus(project, FakeReport(stop_after=4))
        assert not project.paths.samples("train").exists()
        first = server.prompts()
        kept = project.paths.captions.read_text().splitlines()
        assert len(kept) >= 4
        corpus.STAGE.clear(project.paths)  # the stage restarts: its clear keeps the captions
        assert project.paths.captions.read_text().splitlines() == kept
        server.bodies.clear()
        corpus.run_corpus(project, FakeReport())
        second = server.prompts()
    # (the stopped run's request in flight at the stop may land after the clear of `bodies`:
    # its answer was not written, so it is asked again)
    assert not set(second) & {json.loads(x)["prompt"] for x in kept}
    assert len(kept) + len(set(second)) == 13 and len(first) <= len(kept) + 1
    # the same prompts and the same places as a run never stopped (captions differ only in
    # the stand-in's request counter)
    strip = [t.split(" of <")[-1] if t.startswith("detailed") else t
             for t in _split(project, "train")]
    assert strip == [t.split(" of <")[-1] if t.startswith("detailed") else t
                     for t in _split(whole, "train")]


def test_another_model_never_reuses_a_caption(tmp_path):
    with stand_in("model-a") as server:
        project = _project(tmp_path, server.url)
        corpus.run_corpus(project, FakeReport())
        server.bodies.clear()
        corpus.run_corpus(project, FakeReport())
        assert server.bodies == []  # all 13 from data/captions.jsonl
        server.model = "model-b"
        corpus.run_corpus(project, FakeReport())
        assert len(server.bodies) == 13 and server.bodies[0]["model"] == "model-b"
    assert sum("detailed caption" in t for t in _split(project, "train")) == 10


def test_same_samples_whatever_the_requests_in_flight(tmp_path):
    with stand_in() as server:
        a = _project(tmp_path / "a", server.url, caption_workers=1)
        b = _project(tmp_path / "b", server.url, caption_workers=8)
        corpus.run_corpus(a, FakeReport())
        corpus.run_corpus(b, FakeReport())
    cut = [t.split(" of <")[-1] for t in _split(a, "train")]
    assert cut == [t.split(" of <")[-1] for t in _split(b, "train")]


def test_fingerprint_without_an_endpoint_is_the_old_one(tmp_path):
    project = _project(tmp_path, "", caption_share=0.5)
    fp = corpus.fingerprint_inputs(project.settings)
    assert not any(k.startswith("caption") for k in fp["settings"])
    update_settings(project.paths.root, {"corpus.caption_endpoint": "http://127.0.0.1:9/v1"})
    on = corpus.fingerprint_inputs(load_project(project.paths.root).settings)["settings"]
    assert on["caption_endpoint"] is True and on["caption_share"] == 0.5
    assert "caption_workers" not in on  # how many requests are in flight changes no sample


def test_an_empty_caption_is_left_out_and_counted(tmp_path, caplog):
    with stand_in() as server:
        server.mode = "empty"
        project = _project(tmp_path, server.url)
        with caplog.at_level("INFO"):
            corpus.run_corpus(project, FakeReport())
    assert len(_split(project, "train")) == 42
    assert "0 train + 0 val samples added, 13 empty captions left out" in caplog.text


def test_an_unreachable_endpoint_is_refused_before_the_corpus_changes(tmp_path):
    with stand_in() as server:
        project = _project(tmp_path, server.url)
        corpus.run_corpus(project, FakeReport())
    before = project.paths.samples("train").read_bytes()
    with pytest.raises(CaptionError, match="cannot be reached"):
        corpus.STAGE.check(project, type("Run", (), {"cache": {}})())
    with pytest.raises(CaptionError, match="cannot be reached"):
        corpus_captions.add_captions(project, FakeReport(), [], [])
    assert project.paths.samples("train").read_bytes() == before


def test_an_edit_sample_is_captioned_with_the_i2i_request_and_keeps_its_image(tmp_path):
    from PIL import Image

    img = tmp_path / "red.png"
    Image.new("RGB", (96, 64), (200, 20, 20)).save(img)
    lines = [json.dumps({"text": f"edit {i}: make the square blue", "images": [str(img)]})
             for i in range(40)] + [json.dumps({"text": f"plain prompt {i}"}) for i in range(40)]
    src = tmp_path / "edits.jsonl"
    src.write_text("\n".join(lines) + "\n")
    with stand_in() as server:
        root = tmp_path / "proj"
        new_project(root, "qwen3vl_mageflow", overrides={
            "export.output_dir": str(tmp_path / "out"), "corpus.files": [str(src)],
            "corpus.n_train": 60, "corpus.n_val": 12, "corpus.empty_frac": 0.0,
            "corpus.caption_endpoint": server.url, "corpus.caption_share": 0.5})
        project = load_project(root)
        corpus.run_corpus(project, FakeReport())
        edits = [b for b in server.bodies if isinstance(b["messages"][1]["content"], list)]
    assert edits and all(b["presence_penalty"] == 0.0 for b in edits)
    assert all(b["messages"][0]["content"].startswith("Your name is FLUX 3") for b in edits)
    assert "image-editing model" in edits[0]["messages"][0]["content"]
    train = read_samples(project.paths.samples("train"))
    for prev, s in pairwise(train):
        if s.text.startswith("detailed caption") and prev.images:
            assert s.images == prev.images and "User request: " + prev.text in s.text
            break
    else:
        raise AssertionError("no captioned edit sample")
