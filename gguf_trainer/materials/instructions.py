"""MageFlow edit samples synthesized from captioned pictures (the trainer5 mix).

A single-image sample pairs one picture with an instruction made from its captions: the
caption itself, a truncated caption, add / remove / replace / restyle / recolor / background
edits naming the caption's subject, a caption with a style, or (~1.5%) nothing. A two-image
sample pairs two train pictures with a combining instruction. Text-only samples are prompts
on the text-to-image template. Val pictures never appear in train (the caller passes two
disjoint picture lists: image_sources.split_and_store guarantees it). Deterministic given the
seed. Library code: no projects or settings (the corpus stage passes counts and pictures).

    mix = Mix.from_counts(n_train, n_val)                  # 56:3:27 train, 2:1 val
    train, val, tally = synthesize(val_images, train_images, texts, mix, seed)
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gguf_trainer.data.samples import Sample

EMPTY_FRAC = 0.015
# The reference mix (trainer5): 56k single-image + 3k two-image + 27k text-only train samples,
# 1024 image + 512 text val samples.
REFERENCE = {
    "image": 56_000,
    "two_image": 3_000,
    "text": 27_000,
    "val_image": 1024,
    "val_text": 512,
}

# Word lists (our own; the same kinds of edits the reference mix used).
ADD_THINGS = (
    "a straw hat",
    "round glasses",
    "a rainbow in the sky",
    "falling snow",
    "a flock of birds",
    "paper lanterns",
    "a glowing sign",
    "fireworks",
    "a crescent moon",
    "morning mist",
    "fallen leaves",
    "a picket fence",
    "fairy lights",
    "a steaming mug",
    "a knitted scarf",
    "sunflowers",
    "a dragonfly",
    "a mural on the wall",
    "puddles",
    "a pair of earbuds",
    "a silver tiara",
    "a small flag",
    "lit candles",
    "floating bubbles",
    "long shadows",
    "confetti",
)
STYLES = (
    "night",
    "winter",
    "a watercolor painting",
    "an oil painting",
    "cyberpunk style",
    "black and white",
    "sepia tones",
    "anime style",
    "pixel art",
    "a charcoal sketch",
    "golden hour light",
    "a misty morning",
    "neon lighting",
    "a comic book panel",
    "a low-poly render",
    "a clay model",
    "a mosaic",
)
BACKGROUNDS = (
    "a beach at dusk",
    "snowy mountains",
    "a pine forest",
    "a futuristic skyline",
    "sand dunes",
    "outer space",
    "a cozy kitchen",
    "an old temple",
    "a rainy street",
    "a meadow of flowers",
    "a bookshop",
    "a coral reef",
)
COLORS = ("red", "blue", "green", "gold", "purple", "pink", "white", "black", "orange", "teal")
TWO_IMAGE = (
    "combine the two images into one scene",
    "put the {cat} from Image 1 into Image 2",
    "blend Image 1 and Image 2 together",
    "apply the style of Image 2 to Image 1",
    "place the subject of Image 1 next to the subject of Image 2",
    "{cap}",
)
DETERMINERS = {
    "a",
    "an",
    "the",
    "two",
    "three",
    "four",
    "five",
    "several",
    "some",
    "many",
    "one",
    "this",
    "that",
    "these",
    "those",
    "his",
    "her",
    "their",
    "its",
    "our",
    "my",
    "group",
    "couple",
    "pair",
    "lot",
    "bunch",
    "there",
    "are",
    "is",
    "with",
    "and",
    "of",
}
ADJECTIVES = {
    "young",
    "old",
    "little",
    "small",
    "large",
    "big",
    "tall",
    "short",
    "happy",
    "smiling",
    "white",
    "black",
    "red",
    "blue",
    "green",
    "yellow",
    "brown",
    "gray",
    "grey",
    "orange",
    "pink",
    "purple",
    "dark",
    "light",
    "blond",
    "blonde",
    "long",
    "wooden",
    "busy",
    "empty",
    "asian",
    "elderly",
    "middle",
    "aged",
    "other",
    "another",
    "first",
    "second",
    "male",
    "female",
    "baby",
    "adult",
    "teenage",
    "bald",
    "bearded",
    "colorful",
}
# Bands of r = rng.random() for single-image instructions, with the pattern each selects.
PATTERNS = (
    "empty",
    "caption",
    "add",
    "remove",
    "replace",
    "restyle",
    "background",
    "recolor",
    "caption_style",
    "truncated",
)
_BANDS = (
    (0.015, "empty"),
    (0.30, "caption"),
    (0.42, "add"),
    (0.50, "remove"),
    (0.56, "replace"),
    (0.68, "restyle"),
    (0.76, "background"),
    (0.82, "recolor"),
    (0.90, "caption_style"),
    (0.94, "truncated"),
    (1.01, "caption"),
)
_NEEDS_CAPTION = {"caption", "caption_style", "truncated"}
_WORD = re.compile(r"[A-Za-z]+")
_BRACKETS = re.compile(r"[()\[\]{}]")


@dataclass(frozen=True)
class Mix:
    """Sample counts of a corpus: train single-image, two-image, text-only; val image, text."""

    image: int
    two_image: int
    text: int
    val_image: int
    val_text: int

    @classmethod
    def from_counts(cls, n_train: int, n_val: int) -> Mix:
        """corpus.n_train / corpus.n_val split in the reference proportions (56:3:27 and 2:1):
        the pack's defaults (86k / 1536) give exactly the reference mix."""
        r = REFERENCE
        total = r["image"] + r["two_image"] + r["text"]
        two = round(n_train * r["two_image"] / total)
        text = round(n_train * r["text"] / total)
        val_text = round(n_val * r["val_text"] / (r["val_image"] + r["val_text"]))
        return cls(max(0, n_train - two - text), two, text, max(1, n_val - val_text), val_text)


def clean_caption(text: str) -> str:
    """One line, no brackets, collapsed spaces, no trailing full stop."""
    return " ".join(_BRACKETS.sub(" ", text).split()).rstrip(" .")


def subject(caption: str) -> str | None:
    """The caption's subject: its first word of ≥ 3 letters that is no determiner or adjective."""
    for w in _WORD.findall(caption.lower()):
        if len(w) >= 3 and w not in DETERMINERS and w not in ADJECTIVES:
            return w
    return None


def _caption_and_subject(captions: Sequence[str], rng: random.Random) -> tuple[str, str]:
    caps = [c for c in (clean_caption(x) for x in captions) if c]
    cap = rng.choice(caps) if caps else ""
    cats = sorted({s for s in (subject(c) for c in caps) if s and s != "subject"})
    return cap, (rng.choice(cats) if cats else "subject")


def single_instruction(captions: Sequence[str], rng: random.Random) -> tuple[str, str]:
    """(instruction, pattern name) for one picture; a caption-only band falls through to the
    next band when the picture has no caption."""
    cap, cat = _caption_and_subject(captions, rng)
    r = rng.random()
    pattern = next(
        (name for top, name in _BANDS if r < top and (cap or name not in _NEEDS_CAPTION)), "restyle"
    )  # the last band without a caption: "make it <style>"
    if pattern == "empty":
        return "", pattern
    if pattern == "caption":
        return cap, pattern
    if pattern == "add":
        t = rng.choice(ADD_THINGS)
        return rng.choice((f"add {t}", f"add {t} to the image", f"the {cat} with {t}")), pattern
    if pattern == "remove":
        return rng.choice((f"remove the {cat}", f"remove the {cat} from the image")), pattern
    if pattern == "replace":
        return f"replace the {cat} with {rng.choice(ADD_THINGS)}", pattern
    if pattern == "restyle":
        s = rng.choice(STYLES)
        return rng.choice(
            (f"make it {s}", f"turn this into {s}", f"restyle the image as {s}")
        ), pattern
    if pattern == "background":
        return f"change the background to {rng.choice(BACKGROUNDS)}", pattern
    if pattern == "recolor":
        return f"make the {cat} {rng.choice(COLORS)}", pattern
    if pattern == "caption_style":
        return f"{cap}, {rng.choice(STYLES)}", pattern
    words = cap.split()  # truncated
    return " ".join(words[: rng.randint(2, max(2, min(5, len(words))))]), pattern


def two_image_instruction(
    captions_a: Sequence[str], captions_b: Sequence[str], rng: random.Random
) -> str:
    _, cat = _caption_and_subject(captions_a, rng)
    cap_b, _ = _caption_and_subject(captions_b, rng)
    return rng.choice(TWO_IMAGE).format(cat=cat, cap=cap_b or "combine the two images")


def synthesize(
    val_images: Sequence,
    train_images: Sequence,
    texts: Sequence[str],
    mix: Mix,
    seed: int,
    empty_frac: float = EMPTY_FRAC,
) -> tuple[list[Sample], list[Sample], Counter]:
    """(train, val, tally). `*_images`: stored pictures (objects with `.path` and `.captions`),
    disjoint; `texts`: text-only prompts (cleaned, empties dropped, the first val_text go to
    val). Single-image samples go round-robin over each picture list, two-image samples pick
    two different train pictures. The tally counts every pattern used and what was short."""
    rng = random.Random(seed)
    tally: Counter = Counter()
    if not train_images or not val_images:
        raise ValueError("synthesize needs at least one val and one train picture")

    def single(pool, n):
        out = []
        for i in range(n):
            img = pool[i % len(pool)]
            text, pattern = single_instruction(img.captions, rng)
            tally[pattern] += 1
            out.append(Sample(text, (Path(img.path),)))
        return out

    val = single(val_images, mix.val_image)
    train = single(train_images, mix.image)
    if len(train_images) >= 2:
        for _ in range(mix.two_image):
            a, b = rng.sample(list(train_images), 2)
            train.append(
                Sample(
                    two_image_instruction(a.captions, b.captions, rng), (Path(a.path), Path(b.path))
                )
            )
            tally["two_image"] += 1
    elif mix.two_image:
        tally["two_image_short"] += mix.two_image
    pool = [t for t in (" ".join(_BRACKETS.sub(" ", x).split()) for x in texts) if t]
    rng.shuffle(pool)
    val_t, train_t = pool[: mix.val_text], pool[mix.val_text : mix.val_text + mix.text]
    tally["text_short"] += (mix.val_text + mix.text) - len(val_t) - len(train_t)
    for part in (val_t, train_t):
        for i in rng.sample(range(len(part)), int(len(part) * empty_frac)) if part else ():
            part[i] = ""
    tally["text"] += len(val_t) + len(train_t)
    val += [Sample(t) for t in val_t]
    train += [Sample(t) for t in train_t]
    rng.shuffle(val)
    rng.shuffle(train)
    if tally["text_short"] == 0:
        del tally["text_short"]
    return train, val, tally


def build_image_corpus(
    entries: Sequence,
    texts: Sequence[str],
    mix: Mix,
    images_dir: Path,
    seed: int,
    empty_frac: float = EMPTY_FRAC,
) -> tuple[list[Sample], list[Sample], Counter]:
    """(train, val, tally) from image entries (image_sources.ImageEntry: Flickr30k, COCO, local
    folders) and text prompts: pictures stored and split with val first (corrupt or unreadable
    ones skipped and counted, val pictures never in train), then `synthesize`; a folder picture
    without a caption still gets caption-free edits. UserError when too
    few pictures decode. (Rows without captions are counted by the entry readers.)"""
    from gguf_trainer.base.errors import UserError
    from gguf_trainer.materials.image_sources import describe_tally, split_and_store

    tally: Counter = Counter()
    n_pictures = len(entries)
    val_images, train_images = split_and_store(
        list(entries), mix.val_image, images_dir, seed, tally
    )
    if len(val_images) < mix.val_image or len(train_images) < 2:
        raise UserError(
            f"only {len(val_images) + len(train_images)} of {n_pictures} pictures are usable "
            f"({describe_tally(tally)}); the corpus needs {mix.val_image} val pictures and at "
            "least 2 train pictures: add image folders or datasets, or lower corpus.n_val."
        )
    train, val, made = synthesize(val_images, train_images, texts, mix, seed, empty_frac)
    tally.update(made)
    return train, val, tally
