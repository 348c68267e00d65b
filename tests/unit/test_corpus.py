"""Corpus stage: normalisation, filters, dedup, the seeded split, empty prompts, sources
(.txt / .jsonl / ready-made train+val files) and the corpus file round-trip."""

from __future__ import annotations

import json
import random

import pytest

from gguf_trainer.corpus import build_split, normalize, read_prompts, write_prompts
from gguf_trainer.errors import UserError
from gguf_trainer.project import validate_settings

N_PROMPTS = 300
N_VAL = 40
SEED = 8


def settings(**corpus):
    return validate_settings({"pack": "t5xxl_pixart", "name": "pig_t", "corpus": corpus})


def make_prompts(n=N_PROMPTS, seed=0):
    rng = random.Random(seed)
    words = ["red", "fox", "lake", "castle", "neon", "rain", "photo", "sketch", "cat", "moon", "old"]
    return [f"prompt {i}: " + " ".join(rng.choice(words) for _ in range(rng.randint(2, 9)))
            for i in range(n)]


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
    train, val = build_split(settings(files=[src], n_val=2, n_train=100, min_chars=8, max_chars=30,
                                      empty_frac=0.0))
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
    _, other_val = build_split(settings(files=[src], n_val=N_VAL, n_train=200,
                                        empty_frac=0.0, seed=SEED + 1))
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
    no_empty_train, no_empty_val = build_split(settings(files=[src], n_val=N_VAL, n_train=1000,
                                                        empty_frac=0.0))
    assert set(real_train) == set(no_empty_train) and real_val == no_empty_val
    assert train.index("") < len(train) - 1 or train.count("") > 1  # not all appended at the end


def test_jsonl_source(tmp_path):
    prompts = make_prompts(40)
    path = tmp_path / "p.jsonl"
    lines = [json.dumps({"text": p, "id": i}) for i, p in enumerate(prompts)]
    path.write_text("\n".join(lines[:20] + ["", "   "] + lines[20:]) + "\n", encoding="utf-8")
    train, val = build_split(settings(files=[str(path)], n_val=5, empty_frac=0.0))
    assert sorted(train + val) == sorted(prompts)


@pytest.mark.parametrize("bad", ['{"text": "ok"', '{"prompt": "x"}', '["x"]', '"just a string"'])
def test_bad_jsonl_line_names_file_and_line(tmp_path, bad):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"text": "a fine prompt"}) + "\n\n" + bad + "\n", encoding="utf-8")
    with pytest.raises(UserError) as info:
        build_split(settings(files=[str(path)], n_val=1))
    msg = str(info.value)
    assert str(path) in msg and "line 3" in msg and "\n" not in msg


def test_jsonl_null_text_is_refused(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [{"text": p} for p in make_prompts(20)] + [{"text": None}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    with pytest.raises(UserError, match="line 21"):
        build_split(settings(files=[str(path)], n_val=2, empty_frac=0.0))


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


def test_train_file_and_val_file_mode(tmp_path):
    train_src = write_txt(tmp_path / "train.txt", ["  a   b ", "", "c", "c"])
    val_src = write_txt(tmp_path / "val.txt", ["v  1", ""])
    train, val = build_split(settings(train_file=train_src, val_file=val_src, files=["ignored.txt"]))
    # taken as they are: normalised, but no filter, dedup, shuffle or added empties
    assert train == ["a b", "", "c", "c"] and val == ["v 1", ""]
    with pytest.raises(UserError, match="both corpus.train_file and corpus.val_file"):
        build_split(settings(train_file=train_src))


@pytest.mark.parametrize("prompts", [
    ["a", "", "b c", ""], [""], ["", ""], [], ["only"], ["", "x", ""],
])
def test_read_write_round_trip(tmp_path, prompts):
    path = tmp_path / "data" / "train.txt"
    write_prompts(path, prompts)
    assert read_prompts(path) == prompts
    assert path.read_text(encoding="utf-8") == "".join(p + "\n" for p in prompts)
