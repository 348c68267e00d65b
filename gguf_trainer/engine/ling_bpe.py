"""The Ling ids ggk 0.9.7 gives a Ming-Image prompt: its `LingTokenizer` over the tokenizer.json the
adapter GGUF carries (`tokenizer_json`), and the Ming template around the prompt. These ids are
the Ming adapter's slots (one seeded query each) and the rows the teacher's directvlm head emits.

The engine's tokenizer (vendor/engine/diffusion/src/tokenizers/ling_tokenizer.cpp) is the
byte-level `BPETokenizer` with its own hand-written reading of the Ling pre-tokenizer regex
(`token_split`, ported below line for line: lowercase contractions only, a whitespace run ending
in a newline is one piece, otherwise the last space goes to the next word), the engine's
`is_letter` / `is_number` (0-9) / `is_space` tables (tokenize_util.cpp, shared with qwen_bpe.py),
its 22 special strings of which only those in the vocabulary are kept (ling_tokenizer.cpp
149-160), and the vocabulary `hf_tokenizer_json_extract_vocab` builds: model.vocab with the
added tokens merged in, merges ranked in file order.

The template (ming_image_te.hpp build_prompt_tokens, 1240-1266): the prefix is encoded alone,
then [`<image>` + n x `<imagePatch>` + `</image>`, the text prefixed with "\\n"] when there is an
input image, then text + suffix encoded as one string.

    bpe = EngineLingBPE(tokenizer_json_text)
    ids = ming_prompt_ids(bpe, "a sheep")          # prefix ids + ids of "a sheep<|role_end|>..."
"""

from __future__ import annotations

import json

from gguf_trainer.engine.qwen_bpe import (
    _IS_SPACE,
    EngineQwenBPE,
    is_letter,
    is_number,
    split_specials,
)

# ling_tokenizer.cpp 199-222, in its order (split_with_special_tokens takes the first on a tie).
SPECIALS = (
    "<|startoftext|>", "<|endoftext|>", "[CLS]", "[gMASK]", "<|role_end|>", "<tool_call>",
    "</tool_call>", "<tool_response>", "</tool_response>", "<role>", "</role>", "<image>",
    "<imagePatch>", "</image>", "<video>", "</video>", "<framePatch>", "<audio>", "</audio>",
    "<audioPatch>", "<think>", "</think>",
)
UNK_ID = 156892  # ling_tokenizer.cpp 195: a piece the vocabulary lacks
IMAGE_PATCH, IMAGE_START, IMAGE_END = 157157, 157158, 157159  # ming_image_te.hpp 40-42
PREFIX = ("<role>SYSTEM</role>你是一个友好的AI助手。\n\ndetailed thinking off<|role_end|>"
          "<role>HUMAN</role>")  # ming_image_te.hpp 1246-1248
SUFFIX = "<|role_end|><role>ASSISTANT</role>"  # ming_image_te.hpp 1249


def _is_space(ch: str) -> bool:
    return ch in _IS_SPACE  # a set of characters


def _is_newline(ch: str) -> bool:
    return ch in "\r\n"


def _is_symbol(ch: str) -> bool:
    return not _is_space(ch) and not is_letter(ch) and not is_number(ch)


def ling_token_split(text: str) -> list[str]:
    """LingTokenizer::token_split (ling_tokenizer.cpp 22-122) on code points."""
    out: list[str] = []
    n, i = len(text), 0
    while i < n:
        cp = text[i]
        if cp == "'" and i + 1 < n:  # lowercase contractions only
            c1 = text[i + 1]
            if c1 in "sdmt":
                out.append(text[i : i + 2])
                i += 2
                continue
            if i + 2 < n and c1 + text[i + 2] in ("ll", "ve", "re"):
                out.append(text[i : i + 3])
                i += 3
                continue
        j = i  # [^\r\n\p{L}\p{N}]?\p{L}+
        if not is_letter(cp) and not is_number(cp) and not _is_newline(cp) and j + 1 < n \
                and is_letter(text[j + 1]):
            j += 1
        if j < n and is_letter(text[j]):
            while j < n and is_letter(text[j]):
                j += 1
            out.append(text[i:j])
            i = j
            continue
        if is_number(cp):
            out.append(cp)
            i += 1
            continue
        j = i  # ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        if text[j] == " " and j + 1 < n and _is_symbol(text[j + 1]):
            j += 1
        if j < n and _is_symbol(text[j]):
            while j < n and _is_symbol(text[j]):
                j += 1
            while j < n and _is_newline(text[j]):
                j += 1
            out.append(text[i:j])
            i = j
            continue
        if _is_space(cp):
            j = i
            while j < n and _is_space(text[j]):
                j += 1
            last_newline = max((k for k in range(i, j) if _is_newline(text[k])), default=-1)
            if last_newline >= 0:
                end = last_newline + 1
            elif j == n or j - i == 1:
                end = j
            else:
                end = j - 1
            out.append(text[i:end])
            i = end
            continue
        out.append(cp)  # unreachable for well-formed input
        i += 1
    return out


def read_tokenizer_json(text: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab with the added tokens merged in, merges in rank order), as
    hf_tokenizer_json_extract_vocab / _merges read them (both merge representations)."""
    data = json.loads(text)
    model = data["model"]
    vocab = dict(model["vocab"])
    for added in data.get("added_tokens", ()):
        vocab[added["content"]] = int(added["id"])
    merges = []
    for m in model.get("merges", ()):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        merges.append((a, b))
    return vocab, merges


class EngineLingBPE(EngineQwenBPE):
    """The engine's Ling encode over a Hugging Face tokenizer.json's text."""

    def __init__(self, tokenizer_json: str):
        from tokenizers.models import BPE

        vocab, merges = read_tokenizer_json(tokenizer_json)
        self.vocab_size = max(vocab.values()) + 1  # encoder_len
        self.specials = tuple(s for s in SPECIALS if s in vocab)  # 149-160: only those present
        self.special_ids = {s: vocab[s] for s in self.specials}
        super().__init__(BPE(vocab=vocab, merges=merges, unk_token=None))
        self._unk = UNK_ID

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part in split_specials(text, self.specials):
            if part in self.special_ids:
                ids.append(self.special_ids[part])
                continue
            for piece in ling_token_split(part):
                ids.extend(self._piece(piece))
        return ids


def ming_prompt_ids(bpe: EngineLingBPE, text: str, n_image: int = 0) -> tuple[list[int], int]:
    """(the Ling ids of Ming's template around `text`, the first `<imagePatch>` index or -1):
    build_prompt_tokens (ming_image_te.hpp 1243-1266)."""
    ids = bpe.encode(PREFIX)
    start = -1
    body = text
    if n_image > 0:
        start = len(ids) + 1
        ids += [IMAGE_START] + [IMAGE_PATCH] * n_image + [IMAGE_END]
        body = "\n" + body
    return ids + bpe.encode(body + SUFFIX), start
