"""The student's token ids as ggk 0.9.7's own Qwen2 BPE makes them (engine contract §3.1).

The engine does not run the Hugging Face tokenizer: `Qwen2Tokenizer` (vendor/engine/diffusion/
src/tokenizers/qwen2_tokenizer.cpp, bpe_tokenizer.cpp, tokenize_util.cpp) splits out its 31
special strings, pre-splits the rest with a hand-written `token_split` and BPE-merges each
piece. Where it differs from `tokenizer(text, add_special_tokens=False)`, the engine wins:
  * no NFC normalisation (a decomposed `e\u0301` keeps its two code points);
  * `\\p{N}` is ASCII digits only, `\\p{L}` is the engine's own table (qwen_letters.py);
  * `[^\\s\\p{L}\\p{N}]` tests C `isspace` (ASCII below 256), so a non-ASCII space such as U+00A0
    or U+3000 joins a punctuation run there, while a whitespace run is the engine's wider
    `is_space` list; above 255 that `isspace` reads past its table (qwen_cspace.py) and the
    engine drops the characters it answers "space" for (full-width digits, U+FE0F, many emoji);
  * a contraction keeps the apostrophe and lowercases what follows (`'S` becomes `'s`), and `'d`
    is never split off (the 3-character test compares two characters with "d");
  * `<|boi_token|>` … `<|tms_token|>` are specials (ids 151669-151673).
The merges and vocabulary are the student tokenizer folder's (the same Qwen vocabulary the
engine embeds; tests/engine compares the ids with the engine's). Must not: know templates
(template_ids.py joins pieces).

    bpe = engine_bpe(hf_tokenizer)
    bpe.encode("a cafe\u0301")          # engine ids, no BOS/EOS
"""

from __future__ import annotations

import bisect
import functools

from gguf_trainer.engine.qwen_cspace import LIMIT, cspace_bits
from gguf_trainer.engine.qwen_letters import letter_ranges

# qwen2_tokenizer.cpp qwen2_special_tokens(), in id order from 151643 (the encoder appends
# them after the 256 bytes and the 151387 merges).
SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|boi_token|>", "<|bor_token|>", "<|eor_token|>", "<|bot_token|>", "<|tms_token|>",
)
FIRST_SPECIAL_ID = 151643
SPECIAL_IDS = {s: FIRST_SPECIAL_ID + i for i, s in enumerate(SPECIALS)}

_RANGES = letter_ranges()
_STARTS = [a for a, _ in _RANGES]
# tokenize_util.cpp is_space: the whitespace-run test.
_IS_SPACE = frozenset(
    map(
        chr,
        (
            0x09,
            0x0A,
            0x0B,
            0x0C,
            0x0D,
            0x20,
            0xA0,
            0x1680,
            *range(0x2000, 0x200B),
            0x202F,
            0x205F,
            0x3000,
        ),
    )
)
_C_ISSPACE = frozenset("\t\n\v\f\r ")  # C isspace in the "C" locale, 0..255
# above 255: what the engine's out-of-table lookup answers (qwen_cspace.py)
_CSPACE_BITS = cspace_bits()


def c_isspace(ch: str) -> bool:
    """tokenize_util.cpp's `isspace(cps[i])` on a code point, as the engine computes it."""
    cp = ord(ch)
    if cp < 256:
        return ch in _C_ISSPACE
    return cp < LIMIT and bool(_CSPACE_BITS[cp >> 3] >> (cp & 7) & 1)


@functools.lru_cache(maxsize=65536)
def is_letter(ch: str) -> bool:
    cp = ord(ch)
    k = bisect.bisect_right(_STARTS, cp) - 1
    return k >= 0 and cp <= _RANGES[k][1]


def is_number(ch: str) -> bool:
    return "0" <= ch <= "9"


def _lower(ch: str) -> str:
    return ch.lower() if ch.isascii() else ch  # std::tolower per byte, "C" locale


def split_specials(text: str, specials: tuple[str, ...] = SPECIALS) -> list[str]:
    """tokenize_util.cpp split_with_special_tokens: at each point the earliest special string
    (the first in list order on a tie) is cut out; the text between stays one part. `specials`:
    the tokenizer's list (Qwen2's by default; qwen35_bpe.py passes Qwen3.5's)."""
    out, pos = [], 0
    while pos < len(text):
        best, found = len(text), ""
        for s in specials:
            k = text.find(s, pos)
            if k != -1 and k < best:
                best, found = k, s
        if best > pos:
            out.append(text[pos:best])
        if not found:
            break
        out.append(found)
        pos = best + len(found)
    return out


def token_split(text: str) -> list[str]:
    """tokenize_util.cpp token_split, branch by branch (the engine's reading of Qwen2's regex)."""
    out: list[str] = []
    n, i = len(text), 0
    while i < n:
        cp = text[i]
        if cp == "'" and i + 1 < n:  # (?i:'s|'t|'re|'ve|'m|'ll|'d)
            nxt = _lower(text[i + 1])
            if nxt in ("s", "t", "m"):
                out.append("'" + nxt)
                i += 2
                continue
            if i + 2 < n:
                nxt += _lower(text[i + 2])
                if nxt in ("re", "ve", "ll", "d"):
                    out.append("'" + nxt)
                    i += 3
                    continue
        if is_number(cp):  # \p{N}
            out.append(cp)
            i += 1
            continue
        if not is_letter(cp) and cp not in "\r\n" and i + 1 < n and is_letter(text[i + 1]):
            j = i + 2  # [^\r\n\p{L}\p{N}]\p{L}+
            while j < n and is_letter(text[j]):
                j += 1
            out.append(text[i:j])
            i = j
            continue
        if is_letter(cp):  # \p{L}+
            j = i + 1
            while j < n and is_letter(text[j]):
                j += 1
            out.append(text[i:j])
            i = j
            continue
        if (
            cp == " "
            and i + 1 < n
            and not c_isspace(text[i + 1])
            and not is_letter(text[i + 1])
            and not is_number(text[i + 1])
        ):  # ` [^\s\p{L}\p{N}]+[\r\n]*`
            j = _punct_run(text, i + 2)
            out.append(text[i:j])
            i = j
            continue
        # `[^\s\p{L}\p{N}]+[\r\n]*`
        if not is_letter(cp) and not is_number(cp) and not c_isspace(cp):
            j = _punct_run(text, i + 1)
            out.append(text[i:j])
            i = j
            continue
        if cp in _IS_SPACE:  # \s*[\r\n]+ | \s+(?!\S) | \s+ over the whitespace run
            j = i
            while j < n and text[j] in _IS_SPACE:
                j += 1
            last_nl = max((k for k in range(i, j) if text[k] in "\r\n"), default=-1)
            end = last_nl + 1 if last_nl >= 0 else (j - 1 if j < n and j - i > 1 else j)
            out.append(text[i:end])
            i = end
            continue
        i += 1  # the engine skips anything else
    return out


def _punct_run(text: str, j: int) -> int:
    n = len(text)
    while j < n and not is_letter(text[j]) and not is_number(text[j]) and not c_isspace(text[j]):
        j += 1
    while j < n and text[j] in "\r\n":
        j += 1
    return j


def _byte_chars() -> list[str]:
    """bpe_tokenizer.cpp bytes_to_unicode: the printable-byte map of byte-level BPE."""
    keep = [*range(ord("!"), ord("~") + 1), *range(161, 173), *range(174, 256)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


_BYTE_CHARS = _byte_chars()


def byte_chars() -> list[str]:
    """The 256 printable characters byte-level BPE writes bytes 0..255 as (a vocabulary's)."""
    return list(_BYTE_CHARS)


class EngineQwenBPE:
    """The engine's Qwen2 encode over the merges of a Hugging Face BPE model."""

    def __init__(self, model):
        self.model = model  # tokenizers.models.BPE: vocabulary ids and merge ranks
        self._memo: dict[str, tuple[int, ...]] = {}

    def _piece(self, piece: str) -> tuple[int, ...]:
        hit = self._memo.get(piece)
        if hit is None:
            chars = "".join(_BYTE_CHARS[b] for b in piece.encode("utf-8"))
            hit = tuple(t.id for t in self.model.tokenize(chars))
            if len(self._memo) > 200_000:
                self._memo.clear()
            self._memo[piece] = hit
        return hit

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, no BOS/EOS ("" gives [])."""
        ids: list[int] = []
        for part in split_specials(text):
            if part in SPECIAL_IDS:
                ids.append(SPECIAL_IDS[part])
                continue
            for piece in token_split(part):
                ids.extend(self._piece(piece))
        return ids


@functools.lru_cache(maxsize=8)
def engine_bpe(tokenizer) -> EngineQwenBPE:
    """The engine encode for a loaded student tokenizer (its BPE model; cached per tokenizer)."""
    return EngineQwenBPE(tokenizer.backend_tokenizer.model)
