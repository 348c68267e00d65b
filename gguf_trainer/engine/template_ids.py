"""Every pack's student ids (and PixArt's T5 ids), built as the engine builds them: never by
tokenizing a joined string.

The engine tokenizes a template in pieces (conditioner.hpp `LLMEmbedder::tokenize`,
2551-2623): the text before the prompt, then the prompt's weight chunks
(`parse_prompt_attention`, each chunk on its own), then the text after it; a template with
no prompt range (LLaDA's empty prompt) is one piece. PixArt's student and T5 ids are the
prompt's chunks alone (`PixArtT5Embedder`, 1783-1785 and 1816-1819), an empty student result
being [151643]. Tokenizing the joined string instead merges across the borders: LLaDA's
"a sheep in sunglasses." gives 29 ids where the engine gives 30 ("." and "\\n" are separate
pieces). The weights only rescale the adapter's output rows in the engine; training keeps
them out of the targets.

    Piece(text, prompt=True)              # a prompt range: parsed into weight chunks
    ids = template_ids(bpe.encode, pieces)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gguf_trainer.engine.prompt_syntax import parse_prompt_attention
from gguf_trainer.engine.qwen_ids import PAD_ID

# Changing what ids a stored prompt gets (this rule, a tokenizer port, a template) bumps
# prompt_syntax.RULE_VERSION: the corpus and its shards are redone and `status` says why.
EMPTY_STUDENT_ID = PAD_ID  # PixArtT5Embedder::compute_qwen_hidden: no tokens -> the Qwen pad


@dataclass(frozen=True)
class Piece:
    """One part of a template: fixed text, or (prompt=True) the prompt's range, which the
    engine parses for weight syntax and tokenizes chunk by chunk."""

    text: str
    prompt: bool = False


def chunks(piece: Piece) -> list[str]:
    """The texts the engine tokenizes for one piece."""
    if not piece.prompt:
        return [piece.text]
    # An empty prompt is [""]: T5 encodes "" as [3] ("▁"); Qwen's "" is no id, as the engine's
    # LLMEmbedder, which skips an empty range, has it.
    return [t for t, _ in parse_prompt_attention(piece.text)]


def template_ids(encode: Callable[[str], list[int]], pieces: Sequence[Piece]) -> list[int]:
    """The concatenated ids of every chunk of every piece (PromptSyntaxError: the engine
    throws on this prompt's weight)."""
    ids: list[int] = []
    for piece in pieces:
        for text in chunks(piece):
            ids.extend(encode(text))
    return ids


def student_ids(encode: Callable[[str], list[int]], pieces: Sequence[Piece]) -> list[int]:
    """template_ids, [151643] when nothing is left (only PixArt's raw empty prompt)."""
    return template_ids(encode, pieces) or [EMPTY_STUDENT_ID]
