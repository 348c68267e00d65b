"""Corpus stage: local prompt files (+ images), public prompt datasets and image sources, or
ready-made train/val files -> sample records `data/train.jsonl`, `data/val.jsonl` (format:
gguf_trainer.data.samples), images in `data/images/`.

What a prompt file may hold and how any bytes are read: materials/prompt_files.py. The split
(one filter for every source, the images checked and copied, a corpus with too few usable
prompts refused with the counts of why, before any model loads): corpus_build.py. Here: the
stage object, its inputs (the sources' content, not where they are, and the prompt rule's
version) and the writing of the records.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from pathlib import Path

from gguf_trainer.base import bounded, project_file
from gguf_trainer.base.paths import DATA_DIR
from gguf_trainer.data.samples import Sample, write_samples
from gguf_trainer.engine.prompt_syntax import RULE_CHANGES, RULE_VERSION
from gguf_trainer.materials.prompt_files import read_source
from gguf_trainer.stages.corpus_build import copy_images, make_split
from gguf_trainer.stages.corpus_captions import add_captions, probe
from gguf_trainer.stages.stage_list import Stage

log = logging.getLogger(__name__)


def source_files(settings) -> list[Path]:
    c = settings.corpus
    paths = [c.train_file, c.val_file] if (c.train_file or c.val_file) else list(c.files)
    return [Path(p).expanduser() for p in paths]


PATH_SETTINGS = ("files", "train_file", "val_file", "image_folders")  # places, not content
# The caption endpoint is a place too (the server's address); how many requests are in flight
# changes no sample. With no endpoint the caption keys are left out: old corpora stay valid.
CAPTION_SETTINGS = ("caption_endpoint", "caption_model", "caption_share", "caption_max_tokens",
                    "caption_workers")


def placeless(corpus_settings: dict) -> dict:
    """The corpus settings with each path replaced by what it means to the split: how many
    files or folders, whether a train/val file is set. Where they are is no input."""
    out = dict(corpus_settings)
    if out.get("reference_images", True):  # absent key = on: old corpora stay valid
        out.pop("reference_images", None)
    for key in PATH_SETTINGS:
        value = out.get(key)
        out[key] = len(value) if isinstance(value, list) else bool(value)
    if not out.get("caption_endpoint"):
        for key in CAPTION_SETTINGS:
            out.pop(key, None)
    else:
        out["caption_endpoint"] = True
        out.pop("caption_workers", None)
    return out


IMAGES_KEY = b'"images"'


def _content(path: Path) -> tuple[int, str, bool]:
    """A source file's size, sha256 and whether it names "images", streamed a MiB at a time
    (a 2 GiB prompt file costs a MiB here, not 2 GiB); a regular file only (bounded)."""
    digest, size, found, tail = hashlib.sha256(), 0, False, b""
    with bounded.open_regular(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
            found = found or IMAGES_KEY in tail + chunk
            tail = chunk[-(len(IMAGES_KEY) - 1):]
    return size, digest.hexdigest(), found


def fingerprint_inputs(settings) -> dict:
    """The corpus settings (paths left out) plus each source file's content identity, in
    order (size + sha256), and the images .jsonl files reference (by size and mtime, in
    order: their names are in the hashed .jsonl, and re-reading every image at each start
    would cost minutes). Moving the files or the project changes nothing here."""
    files, images = [], hashlib.sha256()
    for p in source_files(settings):
        if not p.is_file():
            files.append("missing")
            continue
        size, digest, names_images = _content(p)
        files.append({"bytes": size, "sha256": digest})
        if p.suffix.lower() == ".jsonl" and names_images:
            for s in read_source(p, Counter()):
                for img in s.images:
                    st = img.stat() if img.is_file() else None
                    images.update(f"{st and st.st_size}|{st and st.st_mtime_ns}\n".encode())
    out = {"settings": placeless(settings.corpus.model_dump(mode="json")), "files": files}
    if images.digest() != hashlib.sha256().digest():
        out["images"] = images.hexdigest()
    return out


def legacy_same_content(recorded: dict | None, fp: dict) -> bool:
    """A corpus recorded by an older version (files keyed by their absolute paths, settings
    with paths) that was made from the same content as `fp`: same settings but for the
    paths, the same file hashes in the same roles. Compared once per start, by content only
    (nothing is read at the recorded paths, which may now belong to another project)."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("files"), dict):
        return False
    old_settings, old_files = recorded.get("settings"), recorded["files"]
    if not isinstance(old_settings, dict) or "images" in recorded or "images" in fp:
        return False  # image references were recorded by path: not comparable, rebuilt
    pairs = (
        [old_settings.get("train_file"), old_settings.get("val_file")]
        if old_settings.get("train_file") or old_settings.get("val_file")
        else list(old_settings.get("files") or [])
    )
    hashes = [old_files.get(str(Path(p).expanduser())) for p in pairs if isinstance(p, str)]
    now = [f if f == "missing" else f["sha256"] for f in fp["files"]]
    old_sources = recorded.get("sources")
    if isinstance(old_sources, dict) and isinstance(old_sources.get("image_folders"), dict):
        old_sources = {
            **old_sources,
            "image_folders": [
                old_sources["image_folders"].get(f) for f in old_settings.get("image_folders") or []
            ],
        }
    same = {k: v for k, v in fp.items() if k not in ("files", "settings", "prompt_syntax")}
    was = {k: v for k, v in recorded.items() if k not in ("files", "settings", "prompt_syntax")}
    if old_sources is not None:
        was["sources"] = old_sources
    return (
        hashes == now
        and placeless(old_settings) == fp["settings"]
        and json.loads(json.dumps(was)) == json.loads(json.dumps(same))
    )


def run_corpus(project, report, split: tuple[list[Sample], list[Sample]] | None = None) -> None:
    train, val = split or make_split(project)
    paths = project.paths
    project_file.make_dir(paths.root, paths.data)  # a real folder inside, never a link out
    train, val = copy_images(train, paths.data_images), copy_images(val, paths.data_images)
    train, val = add_captions(project, report, train, val)  # data/captions.jsonl, resumable
    write_samples(paths.samples("val"), val)
    write_samples(paths.samples("train"), train)
    n_empty = sum(1 for s in train if not s.text)
    n_img = sum(1 for s in train + val if s.images)
    log.info(
        "corpus: %d train samples (%d empty), %d val samples, %d with images",
        len(train),
        n_empty,
        len(val),
        n_img,
    )
    report.progress(1, 1, "files", prompts=len(train) + len(val))


# ---------------------------------------------------------------- the stage object


SPLIT_KEY = "corpus_split"  # the split `check` built, reused by `run` in the same pipeline run


def _rule_changed(fp: dict, recorded: dict | None) -> bool:
    """The corpus was recorded under another prompt rule (prompt_syntax.RULE_VERSION: what a
    stored prompt is and how its ids are made), or before versions were recorded, with all
    its other inputs the same: only the rule makes it (and what is built on it) redone."""
    same_inputs = recorded is not None and (
        {k: v for k, v in recorded.items() if k != "prompt_syntax"} == json.loads(json.dumps(fp))
    )
    return same_inputs and recorded.get("prompt_syntax") != RULE_VERSION


class CorpusStage(Stage):
    name = "corpus"
    restart = True  # the split is rebuilt whole: a half-written data/ is never resumed
    shares = (SPLIT_KEY,)

    def inputs(self, project, upstream, recorded):
        # The prompt rule's version is an input: another one redoes the corpus and all
        # built on it (`status` names prompt_syntax; make_inputs says what changed).
        return {**self._content(project, recorded), "prompt_syntax": RULE_VERSION}

    def make_inputs(self, project, recorded) -> None:
        """Nothing to make; says in the log why a changed prompt rule redoes the corpus."""
        if recorded is None or recorded.get("prompt_syntax") == RULE_VERSION:
            return  # the usual case: no second look at the sources
        if _rule_changed(self._content(project, recorded), recorded):
            log.warning(
                "corpus: rebuilt with its shards: the prompt rule changed (version %s -> %d: %s)",
                recorded.get("prompt_syntax") or "unrecorded",
                RULE_VERSION,
                RULE_CHANGES[RULE_VERSION],
            )

    @staticmethod
    def _content(project, recorded) -> dict:
        """The corpus inputs but the prompt rule's version."""
        fp = fingerprint_inputs(project.settings)
        c = project.settings.corpus
        if c.presets or c.image_presets or c.image_folders:  # absent key: old corpora stay valid
            from gguf_trainer.materials.corpus_sources import fingerprint

            fp["sources"] = fingerprint(project)
        if legacy_same_content(recorded, fp):
            # An older version keyed the corpus by its paths; the same content keeps that
            # record (its digest names every shard and checkpoint built on it) until the
            # corpus is rebuilt for a real change, which records the content form.
            fp = {k: v for k, v in recorded.items() if k != "prompt_syntax"}
        return fp

    def folder(self, paths):
        return paths.data

    def is_done(self, project, run):
        return all(project.paths.samples(split).is_file() for split in ("train", "val"))

    def check(self, project, run) -> None:
        """Validate before destroy: a changed corpus that gives no usable prompts is refused
        here, before its old samples, the shards or the checkpoints are touched. (Not for
        image sources: building that split stores images under data/, which invalidation is
        about to clear; it is built by `run`.)"""
        c = project.settings.corpus
        if c.caption_endpoint and c.caption_share > 0:
            probe(project)  # an endpoint that cannot be asked is refused before anything goes
        if project.pack.takes_images(project.settings) and (c.image_presets or c.image_folders):
            return
        run.cache[SPLIT_KEY] = make_split(project)

    def run(self, project, report, run):
        run_corpus(project, report, run.cache.pop(SPLIT_KEY, None))
        return "done"

    def clear(self, paths) -> None:
        """Stage.clear's rule but for data/captions.jsonl, which stays: captions keyed by what
        made them are valid whatever the corpus becomes, and this stage restarts on every run
        (a killed caption run resumes from them). `reset corpus` deletes it with the rest."""
        from gguf_trainer.base import safe_delete
        from gguf_trainer.base.paths import tool_files_in

        keep, folder = paths.captions, paths.data
        if (not keep.is_file() or keep.is_symlink()
                or safe_delete.check_owned(folder, paths.root, "dir")):
            return super().clear(paths)  # nothing to keep, or its sentence for the folder
        globs = tool_files_in(DATA_DIR) or ()
        for p in safe_delete.tool_paths(folder, globs):
            if p != keep:
                safe_delete.unlink_owned(p, paths.root, "the corpus stage cannot be redone there")
        foreign = safe_delete.foreign_file(folder, globs)
        if foreign:
            log.warning("%s holds %s, which gguf-trainer did not write: it and the folder are "
                        "kept, only the corpus stage's own files there were deleted.", folder,
                        foreign)


STAGE = CorpusStage()
