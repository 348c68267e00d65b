"""Upsampled captions in the corpus (corpus.caption_endpoint): a seeded share of each split's
prompts rewritten by an OpenAI-compatible chat endpoint with FLUX.3's prompt-upsampler request
(materials/upsampler_request), each caption an extra sample right after its prompt in the same
split (same reference images), so an adapter learns the 150-250-token captions
`ggk --prompt-upsampler` hands the text encoder as well as the short prompts users type.

Captions are kept in data/captions.jsonl as they arrive (materials/caption_client), so a corpus
stage stopped or killed part-way asks only for the captions it lacks when it starts again, and
the corpus stage's clear keeps that file. The samples do not depend on how many requests were
in flight (corpus.caption_workers) or on the order the answers came in. Used by corpus.py only.

    train, val = add_captions(project, report, train, val)
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from collections import Counter

from gguf_trainer.data.samples import Sample
from gguf_trainer.materials import upsampler_request as pup
from gguf_trainer.materials.caption_client import CaptionCache, CaptionClient, cache_key
from gguf_trainer.materials.prompt_files import clean_text
from gguf_trainer.stages.stage_list import Stopped

log = logging.getLogger(__name__)
POLL_S = 0.5  # how often a stop request is looked for while captions are written


def client_for(settings) -> CaptionClient:
    c = settings.corpus
    return CaptionClient(c.caption_endpoint, c.caption_model)


def probe(project) -> str:
    """The model id the endpoint serves; CaptionError (one sentence) when it cannot be asked.
    Called before the old corpus is cleared (validate before destroy)."""
    return client_for(project.settings).resolve_model()


def chosen(samples: list[Sample], share: float, seed: int, split: str) -> list[int]:
    """The indices of the samples rewritten: round(share x the non-empty ones), seeded."""
    candidates = [i for i, s in enumerate(samples) if s.text]
    rng = random.Random(f"captions/{seed}/{split}")
    return sorted(rng.sample(candidates, round(share * len(candidates))))


def _key(s: Sample, model: str, max_tokens: int) -> str:
    task = pup.task_of(s.images)
    # the corpus names its images by content hash (corpus_build.copy_images)
    return cache_key(s.text, [p.name for p in s.images], model, pup.system_sha256(task),
                     max_tokens)


def _ask(client: CaptionClient, model: str, max_tokens: int, jobs: list[Sample], workers: int,
         on_answer, stop_requested) -> None:
    """Ask for a caption of each job, at most `workers` of them in flight or answered but not
    yet written; `on_answer(job, reply)` runs in this thread as each arrives. The first error
    met is raised (the answers met before it are written); a stop request raises Stopped.
    Workers are daemon threads: a request still in flight then is left to finish, unwritten."""
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for job in jobs:
        todo.put(job)
    answers: queue.SimpleQueue = queue.SimpleQueue()
    halt = threading.Event()
    slots = threading.Semaphore(workers)  # jobs taken but not yet written: at most `workers`

    def work() -> None:
        while True:
            slots.acquire()
            if halt.is_set():
                return
            try:
                job = todo.get_nowait()
            except queue.Empty:
                return
            try:
                answers.put((job, client.caption(job.text, model, max_tokens, job.images), None))
            except Exception as e:  # noqa: BLE001 - handed to the main thread, which raises it
                answers.put((job, None, e))

    for _ in range(min(workers, len(jobs))):
        threading.Thread(target=work, name="caption-worker", daemon=True).start()
    try:
        for _ in jobs:
            while True:
                if stop_requested():  # between captions, and while one is awaited
                    raise Stopped()
                try:
                    job, reply, err = answers.get(timeout=POLL_S)
                    break
                except queue.Empty:
                    continue
            if err is not None:
                raise err
            on_answer(job, reply)
            slots.release()
    finally:
        halt.set()
        for _ in range(workers):  # wake the workers waiting for a slot: they leave
            slots.release()


def add_captions(project, report, train: list[Sample], val: list[Sample]
                 ) -> tuple[list[Sample], list[Sample]]:
    """(train, val) with the captions inserted; unchanged when corpus.caption_endpoint is
    empty or corpus.caption_share is 0. CaptionError (one sentence) when the endpoint fails;
    Stopped on a stop request (the captions written so far are kept)."""
    c = project.settings.corpus
    if not c.caption_endpoint or c.caption_share <= 0:
        return train, val
    client = client_for(project.settings)
    model = client.resolve_model()
    cache = CaptionCache(project.paths.root, project.paths.captions)
    if cache.unreadable:
        log.warning("corpus: %s: %d unreadable lines skipped (those captions are asked again)",
                    project.paths.captions, cache.unreadable)
    picks = {name: chosen(split, c.caption_share, c.seed, name)
             for name, split in (("train", train), ("val", val))}
    wanted = [split[i] for name, split in (("train", train), ("val", val)) for i in picks[name]]
    keys = {s: _key(s, model, c.caption_max_tokens) for s in wanted}
    jobs = list({keys[s]: s for s in wanted if cache.get(keys[s]) is None}.values())
    n_cached = len(wanted) - len(jobs)
    log.info("corpus: captions: %d prompts to rewrite with %s at %s (%d in %s, %d to ask, "
             "%d in flight at most)", len(wanted), model, client.url, n_cached,
             project.paths.captions.name, len(jobs), c.caption_workers)
    state = {"done": 0, "tokens": 0, "seconds": 0.0}
    report.progress(0, len(jobs), "captions", model=model)

    def on_answer(job: Sample, reply: dict) -> None:
        cache.add(keys[job], {
            "prompt": job.text, "images": [p.name for p in job.images], "model": model,
            "system_sha256": pup.system_sha256(pup.task_of(job.images)),
            "max_tokens": c.caption_max_tokens, **reply})
        state["done"] += 1
        state["tokens"] += int(reply["usage"].get("completion_tokens", 0))
        state["seconds"] += reply["seconds"]
        report.progress(state["done"], len(jobs), "captions", model=model)

    try:
        _ask(client, model, c.caption_max_tokens, jobs, c.caption_workers, on_answer,
             report.stop_requested)
    finally:
        cache.close()
    if jobs:
        log.info("corpus: captions: %d written in %.1f s of requests (%d tokens)",
                 state["done"], state["seconds"], state["tokens"])
    tally: Counter = Counter()
    out = tuple(_insert(split, picks[name], keys, cache, tally)
                for name, split in (("train", train), ("val", val)))
    log.info("corpus: captions: %d train + %d val samples added%s",
             len(out[0]) - len(train), len(out[1]) - len(val),
             "".join(f", {n} {why}" for why, n in sorted(tally.items())))
    return out


def _insert(split: list[Sample], picks: list[int], keys: dict, cache: CaptionCache,
            tally: Counter) -> list[Sample]:
    """The split with each picked sample's caption right after it (the same images), cleaned
    like every prompt (prompt_files.clean_text); an empty caption or one the engine's prompt
    parser would throw on is left out and counted."""
    picked = set(picks)
    out = []
    for i, s in enumerate(split):
        out.append(s)
        if i not in picked:
            continue
        text = cache.get(keys[s])["caption"]
        cleaned = clean_text(text, Counter()) if text else None
        if not text:
            tally["empty captions left out"] += 1
        elif cleaned is None:
            tally["captions the engine's prompt parser refuses left out"] += 1
        else:
            out.append(Sample(cleaned, s.images))
    return out
