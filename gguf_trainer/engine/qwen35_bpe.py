"""The Qwen3.5 ids ggk 0.9.7 gives a MOSS-Image / FLUX.3 bridge prompt: its `Qwen35Tokenizer`
over the vocabulary the adapter GGUF carries, and the MOSS template around the prompt.

The engine's tokenizer (vendor/engine/diffusion/src/tokenizers/qwen35_tokenizer.cpp) is the
byte-level `BPETokenizer` with Qwen2's pre-split (`token_split`, tokenize_util.cpp: the same
hand-written reading of the regex, no NFC, no `\\p{M}`), its own 33 special strings
(`qwen35_special_tokens`, ids 248044..248076 in the released vocabulary) and a vocabulary built
from an explicit token list and merge list: `vocab_json_from_tokens` maps tokens[i] -> i (a
repeated string keeps its last id), merges rank in file order. So qwen_bpe.py's port is reused
whole: only the specials and the ids differ. Where Hugging Face's Qwen3.5 tokenizer differs
(its regex adds `\\p{M}` to letters and it NFC-normalises), the engine wins, as for the student.

The template (conditioner.hpp Qwen35BridgeEmbedder::get_learned_condition, 4287-4356):
`<|im_start|>user\\n` + per reference `<|vision_start|>` + n x `<|image_pad|>` + `<|vision_end|>`
+ (prompt, or " " when empty) + `<|im_end|>\\n<|im_start|>assistant\\n<think>\\n`, encoded as ONE
string (no emphasis parsing, no pads): one adapter slot per id.

    bpe = EngineQwen35BPE(tokens, merges)          # the GGUF's tokenizer.ggml.tokens / merges
    ids = bpe.encode(moss_prompt("a sheep"))       # [248045, 846, 198, ...]
"""

from __future__ import annotations

from collections.abc import Sequence

from gguf_trainer.engine.qwen_bpe import EngineQwenBPE, split_specials, token_split

# qwen35_tokenizer.cpp qwen35_special_tokens(), in its order (ids 248044.. in the release).
SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)
FIRST_SPECIAL_ID = 248044  # <|endoftext|> in the released vocabulary (qwen35_tokenizer.cpp 101)
VOCAB_SIZE = 248320  # the 9B's embedding rows: 248044 BPE + 33 specials + unused ids
PREFIX = "<|im_start|>user\n"  # conditioner.hpp 4287
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n"  # 4353
IMAGE_PAD = "<|image_pad|>"


def moss_prompt(text: str, image_tokens: Sequence[int] = ()) -> str:
    """The string the engine tokenizes for a prompt with references of `image_tokens` vision
    rows each (conditioner.hpp 4287, 4336-4351, 4352-4353)."""
    refs = "".join(f"<|vision_start|>{IMAGE_PAD * n}<|vision_end|>" for n in image_tokens)
    return PREFIX + refs + (text if text else " ") + SUFFIX


def padded_tokens(vocab: dict[str, int], size: int = VOCAB_SIZE) -> list[str]:
    """A tokenizer.json vocabulary (added tokens included) as the id-ordered token list the
    GGUF carries, the engine's specials after the last id when absent (qwen35_tokenizer.cpp
    70-78) and `[PAD<i>]` for unused ids up to the embedding table's rows."""
    full = dict(vocab)
    nxt = max(full.values(), default=-1) + 1
    for s in SPECIALS:
        if s not in full:
            full[s], nxt = nxt, nxt + 1
    out = [f"[PAD{i}]" for i in range(max(size, nxt))]
    for token, i in full.items():
        out[i] = token
    return out


class EngineQwen35BPE(EngineQwenBPE):
    """The engine's Qwen3.5 encode over a token list and a merge list ("a b" strings)."""

    def __init__(self, tokens: Sequence[str], merges: Sequence[str]):
        from tokenizers.models import BPE

        vocab = {t: i for i, t in enumerate(tokens)}  # vocab_json_from_tokens: last id wins
        pairs = [tuple(m.split(" ", 1)) for m in merges if " " in m]
        super().__init__(BPE(vocab=vocab, merges=pairs))
        nxt = len(tokens)
        self.special_ids = {}
        for s in SPECIALS:  # registered after the last id when the list lacks them
            if s not in vocab:
                vocab[s], nxt = nxt, nxt + 1
            self.special_ids[s] = vocab[s]

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part in split_specials(text, SPECIALS):
            if part in self.special_ids:
                ids.append(self.special_ids[part])
                continue
            for piece in token_split(part):  # BPETokenizer::token_split, Qwen2's
                ids.extend(self._piece(piece))
        return ids

