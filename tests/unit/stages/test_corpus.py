"""Corpus stage: normalisation, filters, dedup, the seeded split, empty prompts, sources
(.txt / .jsonl with images / ready-made train+val files), any bytes in a prompt file
(a user's file may hold anything: it is read or refused in a sentence), the refusal of an
unusable corpus and the sample-record round trip."""

from __future__ import annotations

import json
import random

import pytest

from gguf_trainer.base.errors import UserError
from gguf_trainer.data.samples import (
    Sample,
    count_samples,
    iter_samples,
    read_samples,
    write_samples,
)
from gguf_trainer.materials.prompt_files import normalize, read_prompts, write_prompts
from gguf_trainer.stages import corpus, corpus_build
from gguf_trainer.store.schema_errors import validate_settings

N_PROMPTS = 300
N_VAL = 40
SEED = 8


def settings(**corpus):
    return validate_settings({"pack": "t5xxl_pixart", "name": "pig_t", "corpus": corpus})


def make_prompts(n=N_PROMPTS, seed=0):
    rng = random.Random(seed)
    words = [
        "red",
        "fox",
        "lake",
        "castle",
        "neon",
        "rain",
        "photo",
        "sketch",
        "cat",
        "moon",
        "old",
    ]
    return [
        f"prompt {i}: " + " ".join(rng.choice(words) for _ in range(rng.randint(2, 9)))
        for i in range(n)
    ]


def build_split(s, takes_images=False):
    """The split as texts (what most tests compare)."""
    train, val = corpus_build.build_split(s, takes_images)
    return [x.text for x in train], [x.text for x in val]


def write_txt(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_normalize():
    assert normalize("  a \t b\n\n c  ") == "a b c"
    assert normalize("\u00a0x\u2028y ") == "x y"  # unicode spaces and line separators too
    assert normalize("   ") == ""


def test_whitespace_normalised_once_and_filters(tmp_path):
    lines = ["  short ", "exactly8", "a  long\tprompt   with   gaps", "x" * 31, "y" * 30]
    fillers = [f"filler {i:03d}" for i in range(20)]
    src = write_txt(tmp_path / "a.txt", lines + fillers)
    train, val = build_split(
        settings(files=[src], n_val=2, n_train=100, min_chars=8, max_chars=30, empty_frac=0.0)
    )
    everything = train + val
    assert "a long prompt with gaps" in everything
    assert "exactly8" in everything and "y" * 30 in everything  # bounds are inclusive
    assert "short" not in everything and "x" * 31 not in everything
    assert all(p == normalize(p) and 8 <= len(p) <= 30 for p in everything)


def test_dedup_is_case_insensitive_and_keeps_the_first(tmp_path):
    base = make_prompts(30)
    a = write_txt(tmp_path / "a.txt", base + ["A Red Fox At Dawn"])
    b = write_txt(tmp_path / "b.txt", ["a red fox at dawn", "A RED  FOX AT DAWN", base[3].upper()])
    train, val = build_split(settings(files=[a, b], n_val=4, empty_frac=0.0))
    everything = train + val
    assert len(everything) == 31
    assert len({p.lower() for p in everything}) == 31
    assert "A Red Fox At Dawn" in everything


def test_split_is_seeded_disjoint_and_sized(tmp_path):
    src = write_txt(tmp_path / "a.txt", make_prompts())
    s = settings(files=[src], n_val=N_VAL, n_train=200, empty_frac=0.0, seed=SEED)
    train, val = build_split(s)
    assert (train, val) == build_split(s)  # reproducible
    assert len(val) == N_VAL and len(train) == 200
    assert not set(train) & set(val)
    assert set(train) | set(val) <= set(make_prompts())
    _, other_val = build_split(
        settings(files=[src], n_val=N_VAL, n_train=200, empty_frac=0.0, seed=SEED + 1)
    )
    assert other_val != val  # the seed matters
    # n_train larger than the pool: every prompt not in val goes to train
    train, val = build_split(settings(files=[src], n_val=N_VAL, n_train=10_000, empty_frac=0.0))
    assert len(train) == N_PROMPTS - N_VAL and set(train) | set(val) == set(make_prompts())


def test_empty_prompts_inserted_and_real_prompts_kept(tmp_path):
    src = write_txt(tmp_path / "a.txt", make_prompts())
    frac = 0.05
    train, val = build_split(settings(files=[src], n_val=N_VAL, n_train=1000, empty_frac=frac))
    real_train = [p for p in train if p]
    real_val = [p for p in val if p]
    assert len(real_train) == N_PROMPTS - N_VAL and len(real_val) == N_VAL
    assert train.count("") == round(len(real_train) * frac)
    assert val.count("") == round(N_VAL * frac)
    no_empty_train, no_empty_val = build_split(
        settings(files=[src], n_val=N_VAL, n_train=1000, empty_frac=0.0)
    )
    assert set(real_train) == set(no_empty_train) and real_val == no_empty_val
    assert train.index("") < len(train) - 1 or train.count("") > 1  # not all appended at the end


def test_jsonl_source(tmp_path):
    prompts = make_prompts(40)
    path = tmp_path / "p.jsonl"
    lines = [json.dumps({"text": p, "id": i}) for i, p in enumerate(prompts)]
    path.write_text("\n".join(lines[:20] + ["", "   "] + lines[20:]) + "\n", encoding="utf-8")
    train, val = build_split(settings(files=[str(path)], n_val=5, empty_frac=0.0))
    assert sorted(train + val) == sorted(prompts)


@pytest.mark.parametrize(
    "bad",
    [
        '{"text": "ok"',
        '{"prompt": "x"}',
        '["x"]',
        '"just a string"',
        '{"text": null}',
        '{"text": "x", "images": "a.png"}',
    ],
)
def test_bad_jsonl_line_is_skipped_and_counted(tmp_path, caplog, bad):
    path = tmp_path / "p.jsonl"
    good = [json.dumps({"text": p}) for p in make_prompts(20)]
    path.write_text("\n".join(good[:10] + [bad] + good[10:]) + "\n", encoding="utf-8")
    train, val = build_split(settings(files=[str(path)], n_val=2, empty_frac=0.0))
    assert sorted(train + val) == sorted(make_prompts(20))
    assert str(path) in caplog.text and "1 lines not a JSON object" in caplog.text


def test_source_errors(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(UserError, match="does not exist") as info:
        build_split(settings(files=[str(missing)], n_val=1))
    assert str(missing) in str(info.value)
    with pytest.raises(UserError, match="no prompt sources"):
        build_split(settings(n_val=1))
    csv = tmp_path / "p.csv"
    csv.write_text("a,b\n")
    with pytest.raises(UserError, match="neither .txt"):
        build_split(settings(files=[str(csv)], n_val=1))
    src = write_txt(tmp_path / "few.txt", make_prompts(10))
    with pytest.raises(UserError, match="only 10 usable prompts"):
        build_split(settings(files=[src], n_val=5))
    # train_file/val_file with nothing usable in one of them
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(UserError, match="corpus.val_file has no usable prompts"):
        build_split(settings(train_file=src, val_file=str(empty)))


def test_train_file_and_val_file_mode(tmp_path):
    train_src = write_txt(tmp_path / "train.txt", ["  a   b ", "", "c", "c"])
    val_src = write_txt(tmp_path / "val.txt", ["v  1", ""])
    train, val = build_split(
        settings(train_file=train_src, val_file=val_src, files=["ignored.txt"])
    )
    # taken as they are: normalised, but no filter, dedup, shuffle or added empties
    assert train == ["a b", "", "c", "c"] and val == ["v 1", ""]
    with pytest.raises(UserError, match="both corpus.train_file and corpus.val_file"):
        build_split(settings(train_file=train_src))


@pytest.mark.parametrize(
    "prompts",
    [
        ["a", "", "b c", ""],
        [""],
        ["", ""],
        [],
        ["only"],
        ["", "x", ""],
    ],
)
def test_read_write_round_trip(tmp_path, prompts):
    path = tmp_path / "data" / "train.txt"
    write_prompts(path, prompts)
    assert read_prompts(path) == prompts
    assert path.read_text(encoding="utf-8") == "".join(p + "\n" for p in prompts)


# ------------------------------------------- any bytes (a prompt file is the user's, not ours)

GOOD = [f"prompt number {i}: a red fox in the snow" for i in range(30)]


def _utf8(lines):
    return "\n".join(lines).encode("utf-8") + b"\n"


# name -> (file bytes, suffix, the texts that must come out among the prompts, tally key)
MEMBERS = {
    "utf8_bom": (
        b"\xef\xbb\xbf" + _utf8(["caf\u00e9 au lait at dawn"] + GOOD),
        ".txt",
        ["caf\u00e9 au lait at dawn"],
        None,
    ),
    "crlf": (
        _utf8(GOOD).replace(b"\n", b"\r\n") + _utf8(["windows line endings"]),
        ".txt",
        ["windows line endings"],
        None,
    ),
    "latin1_line": (
        _utf8(GOOD) + "cr\u00e8me br\u00fbl\u00e9e on a plate".encode("latin-1") + b"\n",
        ".txt",
        ["cr\u00e8me br\u00fbl\u00e9e on a plate"],
        "legacy",
    ),
    "cp1252_file": (
        "\n".join(["\u201csmart quotes\u201d \u2013 a dash"] + GOOD).encode("cp1252"),
        ".txt",
        ["\u201csmart quotes\u201d \u2013 a dash"],
        "legacy",
    ),
    "undefined_cp1252_byte": (
        _utf8(GOOD) + b"odd \x81 byte in a prompt\n",
        ".txt",
        ["odd byte in a prompt"],
        "legacy",
    ),
    "utf16_bom": (
        "\n".join(["\u00fcber cool k\u00f6nig"] + GOOD).encode("utf-16"),
        ".txt",
        ["\u00fcber cool k\u00f6nig"],
        None,
    ),
    "nul_bytes": (_utf8(GOOD) + b"bin\x00ary\x00junk\n", ".txt", [], "binary"),
    "control_chars": (
        _utf8(GOOD + ["bell\x07 and\x1b[31m escape and\x7f del"]),
        ".txt",
        ["bell and [31m escape and del"],
        "control",
    ),  # "[" is kept: weight syntax
    "encoded_surrogate": (_utf8(GOOD) + b"half \xed\xa0\x80 emoji\n", ".txt", [], "legacy"),
    "json_lone_surrogate": (
        "\n".join(json.dumps({"text": t}) for t in GOOD + ["lone \ud800 surrogate"]).encode(
            "utf-8"
        ),
        ".jsonl",
        ["lone surrogate"],
        "surrogates",
    ),
    "json_escaped_controls": (
        "\n".join(json.dumps({"text": t}) for t in GOOD + ["tab\there\u0000nul"]).encode("utf-8"),
        ".jsonl",
        ["tab here nul"],
        "control",
    ),
    "json_latin1": (
        b"\n".join(
            [json.dumps({"text": t}).encode() for t in GOOD]
            + ['{"text": "na\u00efve caf\u00e9"}'.encode("latin-1")]
        ),
        ".jsonl",
        ["na\u00efve caf\u00e9"],
        "legacy",
    ),
}


@pytest.mark.parametrize("member", sorted(MEMBERS))
def test_any_bytes_decode_or_skip_with_a_count(tmp_path, caplog, member):
    raw, suffix, wanted, key = MEMBERS[member]
    path = tmp_path / f"p{suffix}"
    path.write_bytes(raw)
    train, val = corpus_build.build_split(
        settings(files=[str(path)], n_val=4, min_chars=1, empty_frac=0.0)
    )
    texts = [s.text for s in train + val]
    assert set(GOOD) <= set(texts)  # every good prompt survives, untouched
    for w in wanted:
        assert w in texts
    for t in texts:  # what reaches the tokenizer: clean, valid UTF-8, one line
        t.encode("utf-8")
        assert t == normalize(t) and not any(ord(c) < 32 or 0x7F <= ord(c) <= 0x9F for c in t)
    if key:
        assert corpus_build.REASONS[key] in caplog.text and str(path) in caplog.text
    # and the records round-trip through data/*.jsonl
    out = tmp_path / "data" / "train.jsonl"
    write_samples(out, train)
    assert [s.text for s in read_samples(out)] == [s.text for s in train]


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"", None),
        (b"\n\n\n", None),
        (b"\x00\x01\x02\n" * 40, "NUL bytes"),
        (b"\xff\xfe" + b"\x00" * 10, None),
        (bytes(range(256)) * 3, None),
        (b"short\n" * 50, "min_chars"),
    ],
)
def test_a_corpus_with_no_usable_prompts_is_refused_with_the_reason(tmp_path, raw, reason):
    path = tmp_path / "p.txt"
    path.write_bytes(raw)
    with pytest.raises(UserError) as info:
        corpus_build.build_split(settings(files=[str(path)], n_val=4, min_chars=8))
    msg = str(info.value)
    assert "usable prompts" in msg and "\n" not in msg
    if reason:
        assert reason in msg


def test_run_corpus_refuses_before_any_model_loads(tmp_path, tiny_materials):
    """The corpus stage refuses a file of garbage without importing torch or the teacher."""
    import subprocess
    import sys

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\x00\x00\n" * 100)
    code = f"""
import sys
from gguf_trainer.stages.corpus_build import build_split
from gguf_trainer.base.errors import UserError
from gguf_trainer.store.schema_errors import validate_settings
s = validate_settings({{"pack": "t5xxl_pixart", "name": "p",
                       "corpus": {{"files": [{str(bad)!r}], "n_val": 4}}}})
try:
    build_split(s)
except UserError as e:
    print("REFUSED", e)
assert "torch" not in sys.modules and "transformers" not in sys.modules
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "REFUSED" in out.stdout and "not a text file" in out.stdout and "NUL bytes" in out.stdout


# ------------------------------------------------------------ samples with images


def _png(path, colour=(200, 30, 30), size=(40, 60)):
    from PIL import Image

    Image.new("RGB", size, colour).save(path)
    return path


def test_jsonl_images_are_checked_copied_and_round_trip(tmp_path, caplog):
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    _png(imgs / "a.png")
    _png(imgs / "b.png", (0, 0, 255))
    (imgs / "broken.png").write_bytes(b"not an image")
    rows = [{"text": p} for p in make_prompts(20)]
    rows += [
        {"text": "make it night", "images": ["imgs/a.png"]},
        {"text": "blend them", "images": ["imgs/a.png", "imgs/b.png"]},
        {"text": "missing", "images": ["imgs/nope.png"]},
        {"text": "broken", "images": ["imgs/broken.png"]},
    ]
    src = tmp_path / "c.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    s = settings(files=[str(src)], n_val=2, empty_frac=0.0)
    train, val = corpus_build.build_split(s, takes_images=True)
    by_text = {x.text: x for x in train + val}
    assert "missing" not in by_text and "broken" not in by_text
    assert "2 samples with a missing or unreadable image" in caplog.text
    assert by_text["blend them"].images == ((imgs / "a.png").resolve(), (imgs / "b.png").resolve())
    # a text-only pack keeps the text and drops the images, counted
    t_train, t_val = corpus_build.build_split(s, takes_images=False)
    assert all(not x.images for x in t_train + t_val) and "make it night" in [
        x.text for x in t_train + t_val
    ]
    # copies under data/images by content hash; records hold paths relative to data/
    data = tmp_path / "data"
    copied = corpus_build.copy_images(train + val, data / "images")
    write_samples(data / "train.jsonl", copied)
    back = {x.text: x for x in iter_samples(data / "train.jsonl")}
    two = back["blend them"].images
    assert all(p.parent == data / "images" and p.is_file() for p in two)
    assert two[0].read_bytes() == (imgs / "a.png").read_bytes() and two[0] != two[1]
    assert len(list((data / "images").iterdir())) == 2  # a.png used twice, stored once
    line = (data / "train.jsonl").read_text(encoding="utf-8")
    assert '"images": ["images/' in line and str(tmp_path) not in line
    assert count_samples(data / "train.jsonl") == len(copied)
    assert [x.index for x in iter_samples(data / "train.jsonl", 2, 4)] == [2, 3]


def test_an_image_the_engine_cannot_preprocess_is_refused(tmp_path, caplog):
    """78×592 is one of the ~4 % of shapes where the engine's clip_preprocess throws (its float32
    resize comes out a pixel short of 32×384): the sample is skipped with a sentence, not padded."""
    _png(tmp_path / "thin.png", size=(78, 592))
    _png(tmp_path / "fine.png", size=(78, 600))
    rows = [{"text": p} for p in make_prompts(20)]
    rows += [
        {"text": "thin one", "images": ["thin.png"]},
        {"text": "fine one", "images": ["fine.png"]},
    ]
    src = tmp_path / "c.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    train, val = corpus_build.build_split(
        settings(files=[str(src)], n_val=2, empty_frac=0.0), takes_images=True
    )
    texts = [x.text for x in train + val]
    assert "thin one" not in texts and "fine one" in texts
    assert (
        "1 samples with an image of a shape the engine's clip_preprocess throws on skipped"
        in caplog.text
    )


def test_fingerprint_covers_referenced_images(tmp_path):
    img = _png(tmp_path / "a.png")
    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps({"text": "x", "images": ["a.png"]}) + "\n", encoding="utf-8")
    s = settings(files=[str(src)])
    before = corpus.fingerprint_inputs(s)
    assert "images" in before and before == corpus.fingerprint_inputs(s)
    import os

    st = img.stat()
    _png(img, (1, 2, 3))
    os.utime(img, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert corpus.fingerprint_inputs(s)["images"] != before["images"]
    txt = write_txt(tmp_path / "t.txt", make_prompts(5))
    assert "images" not in corpus.fingerprint_inputs(settings(files=[txt]))


def test_sample_record_format(tmp_path):
    path = tmp_path / "data" / "val.jsonl"
    (tmp_path / "data" / "images").mkdir(parents=True)
    samples = [
        Sample("a cat", (tmp_path / "data" / "images" / "x.png",)),
        Sample(""),
        Sample("caf\u00e9", extra={"template": "t2i"}),
    ]
    assert write_samples(path, samples) == 3
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(x) for x in lines] == [
        {"text": "a cat", "images": ["images/x.png"]},
        {"text": ""},
        {"text": "caf\u00e9", "template": "t2i"},
    ]
    back = read_samples(path)
    assert back == samples and back[2].extra == {"template": "t2i"} and back[1].index == 1
    path.write_text('{"text": "ok"}\nnot json\n', encoding="utf-8")
    with pytest.raises(UserError, match="line 2"):
        read_samples(path)


def test_more_than_nine_images_is_skipped_and_counted(tmp_path, caplog):
    for i in range(10):
        _png(tmp_path / f"{i}.png", (i * 20, 0, 0))
    rows = [{"text": p} for p in make_prompts(20)]
    rows += [
        {"text": "nine images here", "images": [f"{i}.png" for i in range(9)]},
        {"text": "ten images here", "images": [f"{i}.png" for i in range(10)]},
    ]
    src = tmp_path / "c.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    train, val = corpus_build.build_split(
        settings(files=[str(src)], n_val=2, empty_frac=0.0), takes_images=True
    )
    texts = [s.text for s in train + val]
    assert "nine images here" in texts and "ten images here" not in texts
    assert "1 samples with more than 9 images" in caplog.text
