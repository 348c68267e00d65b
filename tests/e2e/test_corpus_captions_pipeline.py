"""Corpus captions through the real pipeline (the stand-in endpoint of tests/caption_stand_in.py;
tests/caption_server/ does the same against a real server with a real model): a FLUX.3 project
whose caption endpoint has nothing listening fails at the corpus stage with one sentence — the
CLI's output, pipeline.log and the status the GUI shows — and exit code 1; with an endpoint, the
captions reach the shards and the adapter trains on them."""

from __future__ import annotations

import socket

import pytest
from caption_stand_in import stand_in
from pipeline_helpers import cli_at_home, make_project

from gguf_trainer.base.exit_codes import EXIT_USER
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.data.samples import read_samples
from gguf_trainer.data.shards import load_verified, shard_files
from gguf_trainer.runner import control, pipeline

pytestmark = pytest.mark.slow
PACK = "qwen3vl_flux3"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_endpoint_is_one_sentence_everywhere(tmp_path, tiny_materials):
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    root = tmp_path / "proj"
    make_project(root, PACK, tiny_materials, **{"corpus.caption_endpoint": url})
    out = cli_at_home("run", "--project", root, home=tmp_path / "home")
    said = out.stdout + out.stderr
    sentence = (f"the caption endpoint {url} cannot be reached ([Errno 111] Connection "
                "refused); start it (README, \"Captions from the upsampler\") or clear "
                "corpus.caption_endpoint.")
    assert out.returncode == EXIT_USER, said[-2000:]
    assert said.count(sentence) == 1 and "Traceback" not in said, said[-2000:]
    assert control.status(root)["error"] == sentence  # what the GUI's Train tab shows
    assert sentence in ProjectPaths(root).pipeline_log.read_text()
    assert not ProjectPaths(root).samples("train").exists()


def test_a_flux3_corpus_trains_on_its_captions(tmp_path, tiny_materials):
    root = tmp_path / "proj"
    with stand_in("qwen3.5-9b") as server:
        make_project(root, PACK, tiny_materials, **{
            "corpus.caption_endpoint": server.url, "corpus.caption_share": 0.25,
            "corpus.caption_max_tokens": 64})
        assert pipeline.run_foreground(ProjectPaths(root)) == 0
    paths = ProjectPaths(root)
    train = read_samples(paths.samples("train"))
    captions = [s.index for s in train if s.text.startswith("detailed caption")]
    assert len(captions) == 10 and len(server.bodies) == 13
    shard_rows = set()
    for f in shard_files(paths.shard_dir("train")):
        shard_rows |= set(load_verified(f)["sample_index"].tolist())
    assert set(captions) <= shard_rows  # every caption became a training sample
    assert paths.checkpoint("last").is_file() and control.status(root)["status"] == "done"
