"""The prompt-weight syntax the engine parses before tokenizing, replicated for training.

At inference the engine passes every prompt through `parse_prompt_attention` (ggk 0.9.7
sdist, `vendor/engine/diffusion/src/core/util.cpp`, a C++ port of A1111's parser): `(x)`,
`(x:1.2)` and `[x]` become weights on chunks of text, `\\(` is a literal `(`, and BREAK is a
separate chunk. Each chunk's text is then tokenized (student and T5 alike: conditioner.hpp
`PixArtT5Embedder::compute_qwen_hidden`/`get_learned_condition`, `LLMEmbedder::tokenize`,
`model/te/t5.hpp` `T5Embedder::tokenize`) and the ids concatenated; the weights only rescale
the adapter's output rows afterwards. So the brackets never reach a model.

Training policy (corpus.py applies it to every prompt of every pack): a prompt keeps its
weight syntax; its student and T5 ids are the engine's, each chunk tokenized on its own
(template_ids.py), and the weights stay out of the targets (the engine applies them to the
adapter's output rows). A prompt the engine's parser throws on is skipped. The parser is an
exact port of the C++ function, quirks included (they decide which characters survive):
  * only `\\(` loses its backslash; `\\)`, `\\[`, `\\]` and `\\\\` are kept verbatim
    (A1111's Python strips all of them; the C++ port does not);
  * a `)` or `]` with no open bracket is kept as text; a `:1.2)` with no open `(` vanishes;
  * BREAK stays the word "BREAK" (only the CLIP conditioner treats it as a separator; the
    student and T5 paths tokenize it, with weight -1);
  * a weight `std::stof` cannot read (`(x:.)`, out of float range) throws in the engine: such a
    prompt cannot run there, so `engine_text` raises PromptSyntaxError and the corpus skips it.
What training does not replicate: the weights (a teacher has no weight input; the engine
scales the adapter's rows by them and restores the global mean).
"""

from __future__ import annotations

import re

import numpy as np

# util.cpp parse_prompt_attention: `re_attention` and `re_break`, verbatim. std::regex in the
# C locale: \b, \d and \s are ASCII-only, hence re.ASCII.
RE_ATTENTION = re.compile(r"\\\(|\\\)|\\\[|\\\]|\\\\|\\|\(|\[|:([+-]?[.\d]+)\)|\)|\]|\bBREAK\b"
                          r"|[^\\()\[\]:B]+|:|\bB", re.ASCII)
RE_BREAK = re.compile(r"\s*\bBREAK\b\s*", re.ASCII)
# strtof's decimal prefix, no exponent here
_STOF = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)", re.ASCII)
_FLT_MAX = float(np.finfo(np.float32).max)
_FLT_MIN = float(np.finfo(np.float32).tiny)
ROUND = np.float32(1.1)
SQUARE = np.float32(1) / np.float32(1.1)
# The rule's version, recorded in the corpus fingerprint (corpus.CorpusStage): bump it when
# training_text changes what a stored prompt would be, or when the ids of a stored prompt
# change (template_ids.py, a tokenizer port, a template). 1: syntax rewritten to the
# joined chunks, ids of the joined template string; 2: syntax kept, the engine's chunked ids.
RULE_VERSION = 2
RULE_CHANGES = {2: "weight syntax is now kept and every prompt's ids are the engine's (template "
                   "pieces and weight chunks tokenized one by one, its Qwen2 BPE and T5 unigram)"}


class PromptSyntaxError(ValueError):
    """A prompt the engine's parser throws on (std::stof of a weight)."""


def _stof(s: str) -> np.float32:
    """std::stof: the longest decimal prefix; invalid_argument / out_of_range raise."""
    m = _STOF.match(s)
    if not m:
        raise PromptSyntaxError(f"the weight {s!r} is not a number")
    value = float(m.group(0))
    if abs(value) > _FLT_MAX or (value != 0 and abs(value) < _FLT_MIN):
        raise PromptSyntaxError(f"the weight {s!r} is out of float range")
    return np.float32(value)


def parse_prompt_attention(text: str) -> list[tuple[str, float]]:
    """[(chunk text, weight)] exactly as util.cpp's parse_prompt_attention returns them
    (weights in float32 arithmetic, BREAK as ("BREAK", -1.0), equal neighbours merged)."""
    res: list[list] = []
    round_brackets: list[int] = []
    square_brackets: list[int] = []

    def multiply_range(start: int, multiplier) -> None:
        for p in range(start, len(res)):
            res[p][1] = np.float32(res[p][1] * multiplier)

    remaining = text
    while True:
        # The C++ loop searches `remaining_text = m.suffix()`, a new string each time: a match
        # never sees the character before it (\b at its start is a string start).
        m = RE_ATTENTION.search(remaining)
        if m is None:
            break
        tok, weight = m.group(0), m.group(1)
        if tok == "(":
            round_brackets.append(len(res))
        elif tok == "[":
            square_brackets.append(len(res))
        elif weight is not None:
            if round_brackets:
                multiply_range(round_brackets.pop(), _stof(weight))
        elif tok == ")" and round_brackets:
            multiply_range(round_brackets.pop(), ROUND)
        elif tok == "]" and square_brackets:
            multiply_range(square_brackets.pop(), SQUARE)
        elif tok == "\\(":
            res.append([tok[1:], np.float32(1.0)])
        elif RE_BREAK.search(tok):
            res.append(["BREAK", np.float32(-1.0)])
        else:
            res.append([tok, np.float32(1.0)])
        remaining = remaining[m.end():]
    for pos in round_brackets:
        multiply_range(pos, ROUND)
    for pos in square_brackets:
        multiply_range(pos, SQUARE)
    if not res:
        res.append(["", np.float32(1.0)])
    i = 0
    while i + 1 < len(res):
        if res[i][1] == res[i + 1][1]:
            res[i][0] += res[i + 1][0]
            del res[i + 1]
        else:
            i += 1
    return [(t, float(w)) for t, w in res]


def engine_text(text: str) -> str:
    """The text the engine's tokenizers receive for `text` (its chunks joined);
    PromptSyntaxError when the engine's parser would throw."""
    if not any(c in text for c in "()[]\\:"):  # fast path: nothing the parser rewrites
        return text
    return "".join(t for t, _ in parse_prompt_attention(text))


def training_text(text: str, tally) -> str | None:
    """The training policy, for every prompt and caption of every pack: `text` as it is (weight
    syntax kept: template_ids tokenizes its chunks as the engine does), or None, counted in
    `tally` ("syntax_error"), when the engine's parser throws on it."""
    try:
        engine_text(text)
    except PromptSyntaxError:
        tally["syntax_error"] += 1
        return None
    return text
