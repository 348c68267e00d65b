"""Prompt-weight syntax: the engine's parser, ported; training prompts keep their syntax (their
ids are the engine's chunk ids, tests/unit/engine/test_template_ids.py) unless the parser throws.

The engine rewrites every prompt with `parse_prompt_attention` (ggk 0.9.7 sdist,
vendor/engine/diffusion/src/core/util.cpp, lines 806-906) before any tokenizer sees it;
the student and T5 paths tokenize the chunks' text (conditioner.hpp
PixArtT5Embedder::compute_qwen_hidden / get_learned_condition, LLMEmbedder::tokenize).
The `engine` column of TABLE is what that C++ function returns, joined: it was produced by
compiling util.cpp's parse_prompt_attention with g++ and running it on these lines (the
same harness agreed with prompt_syntax.engine_text on 20,010 random prompts built from
brackets, escapes, weights, BREAK, B, non-ASCII and out-of-range weights).
"""

from __future__ import annotations

from collections import Counter

import pytest

from gguf_trainer.engine.prompt_syntax import (
    PromptSyntaxError,
    engine_text,
    parse_prompt_attention,
    training_text,
)
from gguf_trainer.materials.image_sources import folder_entries
from gguf_trainer.stages import corpus_build
from gguf_trainer.store.schema_errors import validate_settings

# prompt, engine (util.cpp output joined; None = std::stof throws), that text with whitespace
# collapsed (what rule 1 stored; rule 2 stores the prompt itself)
TABLE = [
    ("a red fox, oil painting", "a red fox, oil painting", "a red fox, oil painting"),
    ("an (important) word", "an important word", "an important word"),
    ("(masterpiece), (best quality:1.2), a cat", "masterpiece, best quality, a cat",
     "masterpiece, best quality, a cat"),
    ("a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).", "a house on a hill, sun, sky.",
     "a house on a hill, sun, sky."),
    ("(unnecessary)(parens)", "unnecessaryparens", "unnecessaryparens"),
    ("(unbalanced", "unbalanced", "unbalanced"),
    ("[faded", "faded", "faded"),
    ("a smiley :) face", "a smiley :) face", "a smiley :) face"),  # ")" with no "(" is text
    ("ratio 16:9) wide shot", "ratio 16 wide shot", "ratio 16 wide shot"),  # ":9)" vanishes
    # only "\(" loses its backslash in the C++ port (A1111's Python strips all escapes)
    ("\\(literal\\] and \\) \\[ \\\\ kept", "(literal\\] and \\) \\[ \\\\ kept",
     "(literal\\] and \\) \\[ \\\\ kept"),
    ("a ( red) car", "a  red car", "a red car"),  # whitespace collapsed again, as for every prompt
    ("a BREAK b", "a BREAK b", "a BREAK b"),  # BREAK reaches the student/T5 tokenizer as a word
    ("aBREAK Blue BREAKfast", "aBREAK Blue BREAKfast", "aBREAK Blue BREAKfast"),
    ("((a cat:1.2):0.5)", "a cat", "a cat"),
    ("[[dim]] [[[dimmer:2]]]", "dim dimmer:2", "dim dimmer:2"),  # ":2]" is no weight
    ("(a cat:-1.5) [b]", "a cat b", "a cat b"),
    ("(a cat:+.5)", "a cat", "a cat"),
    ("(a:1.2.3)", "a", "a"),  # stof reads "1.2"
    ("(a cat:.)", None, None),  # stof(".") throws invalid_argument: the engine cannot run it
    ("café (crème:1.1) 猫 [ねこ]", "café crème 猫 ねこ", "café crème 猫 ねこ"),
    ("()", "", ""),
]


@pytest.mark.parametrize("prompt, engine, joined", TABLE, ids=[t[0] for t in TABLE])
def test_prompt_is_parsed_as_the_engine_does_and_kept_for_training(prompt, engine, joined):
    tally: Counter = Counter()
    if engine is None:
        with pytest.raises(PromptSyntaxError):
            engine_text(prompt)
        assert training_text(prompt, tally) is None and tally == {"syntax_error": 1}
        return
    assert engine_text(prompt) == engine and " ".join(engine.split()) == joined
    assert training_text(prompt, tally) == prompt and not tally  # the syntax is kept


def test_weights_are_the_engines():
    """util.cpp's own doc example (float32 weights, BREAK as weight -1, neighbours merged)."""
    got = parse_prompt_attention("a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).")
    assert [t for t, _ in got] == ["a ", "house", " ", "on", " a ", "hill", ", sun, ", "sky", "."]
    assert [round(w, 4) for _, w in got] == [1.0, 1.573, 1.1, 1.0, 1.1, 0.55, 1.1, 1.4641, 1.1]
    assert parse_prompt_attention("a BREAK b") == [("a ", 1.0), ("BREAK", -1.0), (" b", 1.0)]
    assert parse_prompt_attention("") == [("", 1.0)]


def settings(**c):
    return validate_settings({"pack": "t5xxl_pixart", "name": "pig_t", "corpus": c})


PLAIN = [f"a plain prompt number {i} about a lake" for i in range(20)]


def test_corpus_files_keep_weight_syntax_and_skip_what_the_engine_throws_on(tmp_path, caplog):
    src = tmp_path / "p.txt"
    src.write_text("\n".join(PLAIN + ["(masterpiece:1.2), a red fox", "a [blurry] castle at night",
                                      "(a broken weight:.) here"]) + "\n", encoding="utf-8")
    jl = tmp_path / "p.jsonl"
    jl.write_text('{"text": "(a jsonl prompt), with weights"}\n', encoding="utf-8")
    train, val = corpus_build.build_split(
        settings(files=[str(src), str(jl)], n_val=4, empty_frac=0.0))
    texts = {s.text for s in train + val}
    assert {"(masterpiece:1.2), a red fox", "a [blurry] castle at night",
            "(a jsonl prompt), with weights"} <= texts
    assert set(PLAIN) <= texts and not any("broken weight" in t for t in texts)
    assert f"{src}: 1 {corpus_build.REASONS['syntax_error']}" in caplog.text


def test_prompt_datasets_keep_weight_syntax(caplog):
    pools = {"gustavosta": PLAIN + ["portrait of a lady, (intricate:1.3), [[blur]]", "(x:.)"]}
    train, val = corpus_build.build_split(settings(presets=["gustavosta"], n_val=4, empty_frac=0.0),
                                    preset_pools=pools)
    assert "portrait of a lady, (intricate:1.3), [[blur]]" in {s.text for s in train + val}
    assert f"prompt dataset gustavosta: 1 {corpus_build.REASONS['syntax_error']}" in caplog.text


def test_image_captions_keep_weight_syntax(tmp_path):
    (tmp_path / "a.png").write_bytes(b"not decoded here")
    (tmp_path / "a.txt").write_text("a (red:1.2) door\n(bad:.)\n", encoding="utf-8")
    tally: Counter = Counter()
    (entry,) = folder_entries(tmp_path, tally)
    assert entry.captions == ("a (red:1.2) door",)
    assert tally["syntax_error"] == 1 and "syntax" not in tally
