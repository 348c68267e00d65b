"""The corpus stage's split: the (train, val) samples of a project's sources, and the images
they reference copied into the corpus.

Prompt files are read by materials/prompt_files.py, public prompt datasets and image sources
by materials/corpus_sources.py; here every sample passes one filter (length, duplicates,
images the pack takes and the engine can read), what was changed or skipped is logged with
its count (`REASONS`), and a corpus with no usable prompt (or fewer than the split needs)
is refused with the counts of why, before any model loads. The split is seeded, so the same
settings and sources give the same samples. Used by the corpus stage only (corpus.py).

    train, val = make_split(project)   # UserError when the sources are unusable
"""

from __future__ import annotations

import hashlib
import logging
import random
import shutil
from collections import Counter
from pathlib import Path

from gguf_trainer.base import atomic
from gguf_trainer.base.errors import UserError
from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.qwen_vl_images import engine_refuses, target_size
from gguf_trainer.materials.prompt_files import clean_text, read_source

log = logging.getLogger(__name__)

# The engine hard-codes a 6-token "Image i: <|vision_start|>" header: from image 10 on it
# splices at the wrong positions (engine-contract §3.2), so a sample holds at most 9 images.
MAX_IMAGES = 9
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")

# Why a source line did not become a prompt (or was changed); logged and put in refusals.
REASONS = {
    "legacy": "lines not UTF-8, read as Windows-1252/latin-1",
    "binary": "lines with NUL bytes (binary data, or UTF-16 without a BOM) skipped",
    "surrogates": "prompts with lone surrogates removed",
    "control": "prompts with control characters replaced by spaces",
    "bad_json": 'lines not a JSON object with a "text" string skipped',
    "bad_images": "samples with a missing or unreadable image skipped",
    "engine_size": (
        "samples with an image of a shape the engine's clip_preprocess throws on skipped "
        "(crop or resize it by a pixel)"
    ),
    "images_ignored": "samples whose images this pack ignores (it takes text only)",
    "too_many_images": "samples with more than 9 images (the engine's limit) skipped",
    "length": "prompts outside corpus.min_chars..max_chars",
    "duplicate": "duplicates",
    "empty": "dataset rows without a prompt skipped",
    "bad_row": "dataset rows that could not be parsed skipped",
    "syntax_error": "prompts with a weight the engine cannot read skipped",
}


def _describe(tally: Counter) -> str:
    return ", ".join(f"{n} {REASONS[k]}" for k, n in tally.items() if n)


def _with_empties(samples: list[Sample], frac: float, rng: random.Random) -> list[Sample]:
    """Insert ~frac empty text-only samples at seeded random positions (real ones are kept)."""
    out = list(samples)
    for _ in range(round(len(samples) * frac)):
        out.insert(rng.randrange(len(out) + 1), Sample(""))
    return out


def _engine_refuses(path: Path, image_size=target_size) -> bool:
    """A picture whose shape the engine's clip_preprocess throws on at the family's size
    (`image_size`: the pack's rule, mageflow_images)."""
    from PIL import Image

    with Image.open(path) as im:
        w, h = im.size
    return engine_refuses(h, w, image_size)


def _image_ok(path: Path) -> bool:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im.verify()
        return True
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError,
            Image.DecompressionBombError):  # a header declaring 30000x30000: not decoded
        return False


def _usable(path: Path, takes_images: bool, tally: Counter, image_size=target_size) -> list[Sample]:
    """The samples of one source with their images checked; what was changed or skipped in
    it is logged with the file's name."""
    before = Counter(tally)
    out = _check_images(read_source(path, tally), takes_images, tally, image_size)
    new = tally - before
    if new:
        log.warning("corpus: %s: %s", path, _describe(new))
    return out


def _check_images(
    samples: list[Sample], takes_images: bool, tally: Counter, image_size=target_size
) -> list[Sample]:
    out = []
    for s in samples:
        if s.images and not takes_images:
            tally["images_ignored"] += 1
            s = Sample(s.text)
        elif len(s.images) > MAX_IMAGES:
            tally["too_many_images"] += 1
            continue
        elif s.images and not all(p.is_file() and _image_ok(p) for p in s.images):
            tally["bad_images"] += 1
            continue
        elif s.images and any(_engine_refuses(p, image_size) for p in s.images):
            tally["engine_size"] += 1
            continue
        out.append(s)
    return out


def _refuse_few(n: int, need: int, n_lines: int, tally: Counter) -> UserError:
    why = _describe(tally)
    return UserError(
        f"only {n} usable prompts after filtering (of {n_lines} source lines"
        f"{': ' + why if why else ''}); need more than {need - 1}: add prompt files, "
        "fix their text or lower corpus.n_val / corpus.min_chars."
    )


def build_split(
    settings,
    takes_images: bool = False,
    preset_pools: dict[str, list[str]] | None = None,
    image_size=target_size,
) -> tuple[list[Sample], list[Sample]]:
    """(train, val) samples. UserError when the sources give too few usable prompts.
    `image_size`: the pack's reference-image size rule (the shapes the engine refuses).
    `preset_pools`: the prompts of the selected public datasets (corpus_sources.preset_pools),
    mixed with the files by `corpus.weights` (prompt_presets.mix_pools)."""
    c = settings.corpus
    tally: Counter = Counter()
    if c.train_file or c.val_file:
        if not (c.train_file and c.val_file):
            raise UserError("set both corpus.train_file and corpus.val_file, or neither.")
        train, val = (
            _usable(Path(f).expanduser(), takes_images, tally, image_size)
            for f in (c.train_file, c.val_file)
        )
        for name, split in (("train_file", train), ("val_file", val)):
            if not split:
                raise UserError(
                    f"corpus.{name} has no usable prompts"
                    f"{' (' + _describe(tally) + ')' if tally else ''}; fix the file."
                )
        return train, val
    if not c.files and not preset_pools:
        raise UserError(
            "the corpus has no prompt sources; add .txt/.jsonl files under Corpus "
            "(corpus.files), pick prompt datasets (corpus.presets) or set "
            "corpus.train_file and corpus.val_file."
        )
    seen: set = set()
    pools: dict[str, list[Sample]] = {"files": []} if c.files else {}
    n_lines = 0

    def admit(s: Sample, pool: list[Sample]) -> None:  # one filter for files and datasets
        key = (s.text.lower(), s.images)
        if not c.min_chars <= len(s.text) <= c.max_chars:
            tally["length"] += 1
        elif key in seen:
            tally["duplicate"] += 1
        else:
            seen.add(key)
            pool.append(s)

    for path in c.files:
        found = _usable(Path(path).expanduser(), takes_images, tally, image_size)
        n_lines += len(found)
        for s in found:
            admit(s, pools["files"])
    n_lines += tally["bad_json"] + tally["binary"] + tally["syntax_error"]  # lines skipped in files
    for pid, texts in (preset_pools or {}).items():
        pools[pid] = []
        n_lines += len(texts)
        before = Counter(tally)
        for text in texts:
            cleaned = clean_text(text, tally)
            if cleaned is not None:
                admit(Sample(cleaned), pools[pid])
        if tally - before:
            log.warning("corpus: prompt dataset %s: %s", pid, _describe(tally - before))
    n_usable = sum(len(p) for p in pools.values())
    if n_usable < c.n_val + 8:
        raise _refuse_few(n_usable, c.n_val + 8, n_lines, tally)
    rng = random.Random(c.seed)
    if preset_pools:
        from gguf_trainer.materials.prompt_presets import mix_pools

        pool = mix_pools(pools, dict(c.weights), c.n_val + c.n_train, rng)
        log.info("corpus: %s", ", ".join(f"{k} {len(v)} usable" for k, v in pools.items()))
    else:
        pool = pools["files"]
        rng.shuffle(pool)
    val, train = pool[: c.n_val], pool[c.n_val : c.n_val + c.n_train]
    if len(train) < c.n_train:
        log.warning(
            "corpus: %d train prompts available, fewer than n_train=%d", len(train), c.n_train
        )
    return _with_empties(train, c.empty_frac, rng), _with_empties(val, c.empty_frac, rng)


def copy_images(samples: list[Sample], folder: Path) -> list[Sample]:
    """The samples with each image copied to `folder` under its content hash (the corpus owns
    its images: a source folder edited later cannot change shards made from it)."""
    folder.mkdir(parents=True, exist_ok=True)
    done: dict[Path, Path] = {}
    out = []
    for s in samples:
        if not s.images:
            out.append(s)
            continue
        for p in s.images:
            if p not in done:
                digest = hashlib.sha256(p.read_bytes()).hexdigest()[:24]
                dest = folder / (
                    digest + (p.suffix.lower() if p.suffix.lower() in IMAGE_SUFFIXES else ".img")
                )
                if not dest.exists():
                    with atomic.atomic_path(dest) as tmp:
                        shutil.copyfile(p, tmp)
                done[p] = dest
        out.append(Sample(s.text, tuple(done[p] for p in s.images), s.extra))
    return out


def make_split(project) -> tuple[list[Sample], list[Sample]]:
    """(train, val) samples from the project's sources; UserError when they are unusable."""
    pools = None
    if project.settings.corpus.presets:
        from gguf_trainer.materials.corpus_sources import preset_pools

        tally: Counter = Counter()
        pools = preset_pools(project, tally)
        if tally:
            log.warning("corpus: prompt datasets: %s", _describe(tally))
    c = project.settings.corpus
    takes_images = project.pack.takes_images(project.settings)
    if project.pack.vis_dim and not takes_images and (c.image_presets or c.image_folders):
        log.warning("corpus: corpus.reference_images is off: the image datasets and folders "
                    "are not read (their samples would serve no ggk up to 0.9.7)")
    if takes_images and (c.image_presets or c.image_folders):
        return _image_split(project, pools)
    return build_split(
        project.settings,
        takes_images=takes_images,
        preset_pools=pools,
        image_size=project.pack.image_size if project.pack.vis_dim else target_size,
    )


def _image_split(project, pools) -> tuple[list[Sample], list[Sample]]:
    """Image packs with image sources: edit instructions synthesized from the captions
    (instructions.py). The prompt files and datasets give the text-only samples (optional,
    same length filter, no duplicates); edit samples of the user's own .jsonl files (with
    their images) join train as they are."""
    from gguf_trainer.materials.corpus_sources import image_entries
    from gguf_trainer.materials.image_sources import describe_tally
    from gguf_trainer.materials.instructions import Mix, build_image_corpus

    c = project.settings.corpus
    tally: Counter = Counter()
    own: list[Sample] = []
    texts: list[str] = []
    for path in c.files:
        for s in _usable(Path(path).expanduser(), True, tally, project.pack.image_size):
            if s.images:
                own.append(s)
            else:
                texts.append(s.text)
    texts += [clean_text(t, tally) for pool in (pools or {}).values() for t in pool]
    seen: set[str] = set()
    kept = []
    for t in texts:
        if t and c.min_chars <= len(t) <= c.max_chars and t.lower() not in seen:
            seen.add(t.lower())
            kept.append(t)
    entries = image_entries(project, tally)
    train, val, made = build_image_corpus(
        entries,
        kept,
        Mix.from_counts(c.n_train, c.n_val),
        project.paths.data_images,
        c.seed,
        c.empty_frac,
    )
    if own:
        train = train + own
        random.Random(c.seed).shuffle(train)
    tally.update(made)
    log.info(
        "corpus: image sources: %s%s",
        describe_tally(tally),
        f"; {len(own)} edit samples from the prompt files" if own else "",
    )
    return train, val
