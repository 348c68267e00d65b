"""Instruction synthesis from captions (the trainer5 mix): every pattern appears, val and
train pictures are disjoint, the same seed gives the same corpus, corrupt pictures and rows
without captions are skipped and counted, and the corpus stage uses it for image sources."""

from __future__ import annotations

import io
import json
import random
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from gguf_trainer.base.errors import UserError
from gguf_trainer.materials.image_sources import ImageEntry
from gguf_trainer.materials.instructions import (
    PATTERNS,
    REFERENCE,
    Mix,
    build_image_corpus,
    single_instruction,
    subject,
    synthesize,
    two_image_instruction,
)

CAPTIONS = ("A young man riding a horse on the beach.", "Two dogs play in the snow",
            "the old lighthouse at night", "A red car parked by a wooden fence")


def _png(colour, size=(48, 40)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def _entries(n: int, corrupt: int = 0, uncaptioned: int = 0) -> list[ImageEntry]:
    out = []
    for i in range(n):
        data = _png((i * 5 % 256, i * 11 % 256, i * 17 % 256))
        caps = (
            ()
            if i < uncaptioned
            else (CAPTIONS[i % len(CAPTIONS)], CAPTIONS[(i + 1) % len(CAPTIONS)])
        )
        out.append(ImageEntry("folder:pics", f"p{i}.png", caps, lambda d=data: d))
    for j in range(corrupt):
        out.append(
            ImageEntry("folder:pics", f"bad{j}.png", (CAPTIONS[0],), lambda: b"\x89PNG not really")
        )
    return out


def test_subjects_skip_determiners_and_adjectives():
    assert subject("A young man riding a horse") == "man"
    assert subject("Two dogs play") == "dogs"
    assert subject("the old lighthouse at night") == "lighthouse"
    assert subject("a an the") is None


def test_every_pattern_appears_and_the_shares_follow_the_bands():
    rng = random.Random(0)
    seen = Counter(single_instruction(CAPTIONS, rng)[1] for _ in range(20000))
    assert set(seen) == set(PATTERNS)
    assert 0.01 < seen["empty"] / 20000 < 0.02  # ~1.5% empty
    assert 0.30 < seen["caption"] / 20000 < 0.40  # plain caption: the 0.015-0.30 and 0.94+ bands
    texts = {single_instruction(CAPTIONS, random.Random(s))[0] for s in range(300)}
    assert any(t.startswith(("add ", "the ")) for t in texts)
    assert any(t.startswith("remove the ") for t in texts)
    assert any(t.startswith("replace the ") for t in texts)
    assert any(t.startswith("change the background to ") for t in texts)
    assert any(
        t.startswith(("make it ", "turn this into ", "restyle the image as ")) for t in texts
    )


def test_without_a_caption_only_caption_free_edits_are_made():
    rng = random.Random(1)
    made = Counter()
    for _ in range(3000):
        text, pattern = single_instruction((), rng)
        made[pattern] += 1
        assert "subject" in text or not any(w in text for w in ("man", "dogs"))
    assert not {"caption", "caption_style", "truncated"} & set(made)
    assert made["restyle"] > 0 and made["empty"] > 0


def test_two_image_instructions_use_subject_and_caption():
    rng = random.Random(3)
    texts = {two_image_instruction(CAPTIONS[:1], CAPTIONS[1:2], rng) for _ in range(200)}
    assert "put the man from Image 1 into Image 2" in texts
    assert "Two dogs play in the snow" in texts
    assert "combine the two images into one scene" in texts


def test_mix_from_counts_gives_the_reference_mix():
    mix = Mix.from_counts(86000, 1536)
    assert (mix.image, mix.two_image, mix.text) == (
        REFERENCE["image"],
        REFERENCE["two_image"],
        REFERENCE["text"],
    )
    assert (mix.val_image, mix.val_text) == (1024, 512)
    small = Mix.from_counts(86, 3)
    assert (
        small.image + small.two_image + small.text == 86 and small.val_image + small.val_text == 3
    )


def _corpus(tmp_path, seed=5, **kw):
    mix = Mix(image=60, two_image=8, text=20, val_image=6, val_text=4)
    texts = [f"a prompt number {i}" for i in range(40)]
    return build_image_corpus(_entries(30, **kw), texts, mix, tmp_path / "images", seed)


def test_val_pictures_never_appear_in_train_and_counts_hold(tmp_path):
    train, val, tally = _corpus(tmp_path)
    val_pics = {p for s in val for p in s.images}
    train_pics = {p for s in train for p in s.images}
    assert val_pics and train_pics and not val_pics & train_pics
    assert sum(1 for s in val if s.images) == 6 and sum(1 for s in val if not s.images) == 4
    assert sum(1 for s in train if len(s.images) == 1) == 60
    assert sum(1 for s in train if len(s.images) == 2) == 8
    assert all(len(set(s.images)) == 2 for s in train if len(s.images) == 2)
    assert sum(1 for s in train if not s.images) == 20
    assert tally["two_image"] == 8 and tally["text"] == 24


def test_the_same_seed_gives_the_same_corpus(tmp_path):
    a = _corpus(tmp_path / "a", seed=5)
    b = _corpus(tmp_path / "b", seed=5)
    c = _corpus(tmp_path / "c", seed=6)
    key = lambda split: [(s.text, tuple(Path(p).name for p in s.images)) for s in split]
    assert key(a[0]) == key(b[0]) and key(a[1]) == key(b[1])
    assert key(a[0]) != key(c[0])


def test_corrupt_pictures_are_skipped_and_counted(tmp_path):
    train, val, tally = _corpus(tmp_path, corrupt=3, uncaptioned=4)
    assert tally["corrupt"] == 3
    names = {Path(p).name for s in train + val for p in s.images}
    assert len(names) <= 30  # only the 30 good pictures were stored
    assert all(Path(p).is_file() for s in train + val for p in s.images)


def test_too_few_usable_pictures_is_one_sentence(tmp_path):
    mix = Mix(image=4, two_image=0, text=0, val_image=6, val_text=0)
    with pytest.raises(UserError, match="only 5 of 8 pictures are usable .*3 corrupt"):
        build_image_corpus(_entries(5, corrupt=3), [], mix, tmp_path / "images", 1)


def test_synthesize_needs_pictures_on_both_sides():
    with pytest.raises(ValueError):
        synthesize([], [object()], [], Mix(1, 0, 0, 1, 0), 0)


def test_the_corpus_stage_synthesizes_from_an_image_folder(tmp_path, monkeypatch):
    """A MageFlow project with an image folder (captions beside one picture, none beside the
    others, one corrupt file) gets edit samples over the stored pictures, its prompt file as
    text-only samples (30 prompts: fewer than n_val + 8 is fine, they are optional) and the
    user's own edit sample."""
    from gguf_trainer.stages.corpus_build import make_split
    from gguf_trainer.store.project import create_project, load_project

    monkeypatch.setattr("gguf_trainer.base.paths.PROJECTS_ROOT", tmp_path / "projects")
    pics = tmp_path / "pics"
    pics.mkdir()
    for i in range(12):
        (pics / f"p{i}.png").write_bytes(_png((i * 20, 100, 200 - i * 10)))
    (pics / "p0.txt").write_text("A brown dog running on grass\n")
    (pics / "broken.jpg").write_bytes(b"not an image")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"a lighthouse at dusk, take {i}\n" for i in range(30)))
    own = tmp_path / "own.jsonl"  # the user's own edit sample rides along in train
    own.write_text(json.dumps({"text": "make the sky purple", "images": ["pics/p3.png"]}) + "\n")
    root = tmp_path / "projects" / "mf"
    create_project(
        root,
        "qwen3vl_mageflow",
        overrides={
            "corpus.image_folders": [str(pics)],
            "corpus.files": [str(prompts), str(own)],
            "corpus.n_train": 43,
            "corpus.n_val": 3,
        },
    )
    train, val = make_split(load_project(root))
    assert len(val) == 3 and sum(1 for s in val if s.images) == 2
    assert sum(1 for s in train if not s.images) == round(43 * 27 / 86)
    # run_corpus copies the rest
    stored = [s for s in train + val if s.text != "make the sky purple"]
    assert {p.parent for s in stored for p in s.images} == {load_project(root).paths.data_images}
    assert not {p for s in val for p in s.images} & {p for s in train for p in s.images}
    assert len(train) == 43 + 1
    mine = [s for s in train if s.text == "make the sky purple"]
    assert len(mine) == 1 and mine[0].images == (pics / "p3.png",)
