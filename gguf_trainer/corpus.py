"""Corpus stage: local prompt files (+ images) or ready-made train/val files -> sample records
`data/train.jsonl`, `data/val.jsonl` (format: gguf_trainer.samples), images in `data/images/`.

Sources: `.txt` (one prompt per line) and `.jsonl` (a "text" string per line, optionally
"images": [paths relative to the .jsonl file] for packs that take images). Any bytes are
accepted, by one rule (`decode_lines` + `clean_text`), each case counted in the log:
  * UTF-8, with or without a BOM, is read as is; a UTF-16 file with a BOM is decoded as UTF-16;
  * a line that is not valid UTF-8 is decoded as Windows-1252 (latin-1 for the 5 bytes
    cp1252 leaves undefined): legacy files are read, never dropped;
  * a line holding NUL bytes is binary data (or UTF-16 without a BOM) and is skipped;
  * a file whose lines are mostly binary (NUL or other control bytes, or bytes that neither
    UTF-8 nor Windows-1252 reads) is refused as "not a text file": training on the scraps
    that survive decoding would be training on noise;
  * lone surrogates (from JSON escapes) are removed, other control characters become spaces;
  * a .jsonl line that is not a JSON object with a "text" string is skipped;
  * prompt-weight syntax (`(x)`, `(x:1.2)`, `[x]`, `\\(`) is kept: the student and T5 ids are
    the engine's chunk ids (template_ids.py), as at inference; a prompt the engine's parser
    throws on is skipped (prompt_syntax.training_text, an exact port of that parser).
Whitespace is normalised here, once; from then on the exact text is what the student and
the teacher see. A corpus with no usable prompt (or fewer than the split needs) is refused
here, with the counts of why, before any model loads. The split is seeded, so the same
settings and sources give the same records.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
import random
import re
import shutil
from collections import Counter
from pathlib import Path

from . import atomic
from .errors import UserError
from .mageflow_images import engine_refuses, target_size
from .prompt_syntax import RULE_CHANGES, RULE_VERSION, training_text
from .samples import Sample, write_samples
from .stage_list import Stage

log = logging.getLogger(__name__)

# The engine hard-codes a 6-token "Image i: <|vision_start|>" header: from image 10 on it
# splices at the wrong positions (engine-contract §3.2), so a sample holds at most 9 images.
MAX_IMAGES = 9
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")

_SURROGATE = re.compile("[\ud800-\udfff]")
_BINARY_BYTES = re.compile(rb"[\x00-\x08\x0e-\x1f]")  # control bytes text files do not hold
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
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


def normalize(text: str) -> str:
    return " ".join(text.split())


def decode_lines(raw: bytes, tally: Counter) -> list[str | None]:
    """The lines of a prompt file's bytes (None = a binary line, skipped). See the module doc."""
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return raw.decode("utf-16", errors="replace").replace("\r\n", "\n").split("\n")
    raw = raw.removeprefix(codecs.BOM_UTF8)
    out: list[str | None] = []
    for line in raw.split(b"\n"):
        line = line.removesuffix(b"\r")
        if b"\x00" in line:
            tally["binary"] += 1
            out.append(None)
            continue
        try:
            out.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            tally["legacy"] += 1
            try:
                out.append(line.decode("cp1252"))
            except UnicodeDecodeError:
                out.append(line.decode("latin-1"))
    return out


def clean_text(text: str, tally: Counter) -> str | None:
    """Text the tokenizer and a UTF-8 file can hold: no lone surrogates, no control characters,
    whitespace collapsed, weight syntax kept. None: the engine's parser throws on it.
    Every prompt of every pack passes here (captions of image sources pass the same
    prompt_syntax.training_text in image_sources)."""
    if _SURROGATE.search(text):
        tally["surrogates"] += 1
        text = _SURROGATE.sub("", text)
    if _CONTROL.search(text.replace("\t", " ").replace("\n", " ").replace("\r", " ")):
        tally["control"] += 1
    return training_text(normalize(_CONTROL.sub(" ", text)), tally)


def read_prompts(path: Path) -> list[str]:
    """Prompts of a plain prompt list written by `write_prompts` (one per line, '' = empty)."""
    text = path.read_text(encoding="utf-8")
    return text[:-1].split("\n") if text else []


def write_prompts(path: Path, prompts: list[str]) -> None:
    atomic.write_text(path, "".join(p + "\n" for p in prompts))


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise UserError(f"prompt file {path} does not exist; fix the path under Corpus.")
    try:
        return path.read_bytes()
    except OSError as e:
        raise UserError(
            f"prompt file {path} cannot be read ({e.strerror}); check the file."
        ) from None


def _is_binary_line(line: bytes) -> bool:
    if _BINARY_BYTES.search(line):
        return True
    for encoding in ("utf-8", "cp1252"):
        try:
            line.decode(encoding)
            return False
        except UnicodeDecodeError:
            continue
    return True


def _refuse_binary(path: Path, raw: bytes) -> None:
    """A file that is mostly binary lines is not a prompt list: refused with a sentence."""
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return
    lines = [line for line in raw.split(b"\n") if line.strip()]
    bad = sum(1 for line in lines if _is_binary_line(line))
    if lines and bad * 2 > len(lines):
        raise UserError(
            f"prompt file {path} is not a text file ({bad} of {len(lines)} lines are "
            "binary: NUL bytes, control bytes or bytes no text encoding reads), so it "
            "gives no usable prompts; choose a text file with one "
            "prompt per line under Corpus."
        )


def _jsonl_sample(line: str, base: Path, tally: Counter) -> Sample | None:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        rec = None
    images = rec.get("images", []) if isinstance(rec, dict) else None
    if (
        not isinstance(rec, dict)
        or not isinstance(rec.get("text"), str)
        or not isinstance(images, list)
        or not all(isinstance(p, str) and p for p in images)
    ):
        tally["bad_json"] += 1
        return None
    text = clean_text(rec["text"], tally)
    extra = {k: v for k, v in rec.items() if k not in ("text", "images")}  # for packs (samples.py)
    return None if text is None else Sample(text, tuple((base / p) for p in images), extra)


def read_source(path: Path, tally: Counter | None = None) -> list[Sample]:
    """The samples of one source file, decoded and cleaned (texts normalised, images as
    absolute paths, not yet checked). `tally` receives the counts of `REASONS`."""
    tally = Counter() if tally is None else tally
    suffix = path.suffix.lower()
    if suffix not in (".txt", ".jsonl"):
        raise UserError(
            f'{path} is neither .txt (one prompt per line) nor .jsonl (a "text" field '
            "per line); convert it or remove it from Corpus."
        )
    raw = _read_bytes(path)
    _refuse_binary(path, raw)
    lines = decode_lines(raw, tally)
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it is not an empty prompt
    if suffix == ".txt":
        texts = (clean_text(s, tally) for s in lines if s is not None)
        out = [Sample(t) for t in texts if t is not None]
    else:
        base = path.parent.resolve()
        maybe = [_jsonl_sample(s, base, tally) for s in lines if s is not None and s.strip()]
        out = [s for s in maybe if s is not None]
    return out


def _describe(tally: Counter) -> str:
    return ", ".join(f"{n} {REASONS[k]}" for k, n in tally.items() if n)


def source_files(settings) -> list[Path]:
    c = settings.corpus
    paths = [c.train_file, c.val_file] if (c.train_file or c.val_file) else list(c.files)
    return [Path(p).expanduser() for p in paths]


PATH_SETTINGS = ("files", "train_file", "val_file", "image_folders")  # places, not content


def placeless(corpus_settings: dict) -> dict:
    """The corpus settings with each path replaced by what it means to the split: how many
    files or folders, whether a train/val file is set. Where they are is no input."""
    out = dict(corpus_settings)
    for key in PATH_SETTINGS:
        value = out.get(key)
        out[key] = len(value) if isinstance(value, list) else bool(value)
    return out


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
        raw = p.read_bytes()
        files.append({"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()})
        if p.suffix.lower() == ".jsonl" and b'"images"' in raw:
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
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError):
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
        from .prompt_presets import mix_pools

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
        from .corpus_sources import preset_pools

        tally: Counter = Counter()
        pools = preset_pools(project, tally)
        if tally:
            log.warning("corpus: prompt datasets: %s", _describe(tally))
    c = project.settings.corpus
    if project.pack.vis_dim and (c.image_presets or c.image_folders):
        return _image_split(project, pools)
    return build_split(
        project.settings,
        takes_images=project.pack.vis_dim > 0,
        preset_pools=pools,
        image_size=project.pack.image_size if project.pack.vis_dim else target_size,
    )


def _image_split(project, pools) -> tuple[list[Sample], list[Sample]]:
    """Image packs with image sources: edit instructions synthesized from the captions
    (instructions.py). The prompt files and datasets give the text-only samples (optional,
    same length filter, no duplicates); edit samples of the user's own .jsonl files (with
    their images) join train as they are."""
    from .corpus_sources import image_entries
    from .image_sources import describe_tally
    from .instructions import Mix, build_image_corpus

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


def run_corpus(project, report, split: tuple[list[Sample], list[Sample]] | None = None) -> None:
    train, val = split or make_split(project)
    paths = project.paths
    write_samples(paths.samples("val"), copy_images(val, paths.data_images))
    write_samples(paths.samples("train"), copy_images(train, paths.data_images))
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
            from .corpus_sources import fingerprint

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
        if project.pack.vis_dim and (c.image_presets or c.image_folders):
            return
        run.cache[SPLIT_KEY] = make_split(project)

    def run(self, project, report, run):
        run_corpus(project, report, run.cache.pop(SPLIT_KEY, None))
        return "done"


STAGE = CorpusStage()
