"""T5 ids as ggk 0.9.7's own unigram tokenizer makes them (the PixArt seeds and the teacher's ids).

A port of `T5UniGramTokenizer::encode` (vendor/engine/diffusion/src/tokenizers/
t5_unigram_tokenizer.cpp): runs of two or more spaces become one (the only normalisation:
no NFKC, lines 283-288), `<pad>`/`</s>`/`<unk>` in the text are their ids, Metaspace prepends
`▁` and turns each space into `▁` (std::getline: a trailing space is dropped, "" becomes "▁"),
then the Viterbi best path over the piece scores (float32 sums, the first best kept on a tie),
where a character no piece covers is one `<unk>` of its own at min score − 10 (sentencepiece
merges a run of them; the engine does not). sentencepiece's `EncodeAsIds` differs on `…`,
full-width text, CJK and the empty prompt (it gives [] where the engine gives [3] = `▁`).
Pieces and scores come from the teacher snapshot's `spiece.model` (the table the engine embeds
for T5 v1.1; tests/engine compares the ids with the engine's).

    tok = T5Unigram.from_spm(path)
    tok.encode("")                      # [3]: the piece "▁"
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

SPECIAL = {"<pad>": 0, "</s>": 1, "<unk>": 2}  # T5; UMT5 (is_umt5) has <s> 2 and <unk> 3
UNK_PENALTY = np.float32(10.0)
_MULTI_SPACE = re.compile(" {2,}")
META = "\u2581"


def metaspace(text: str) -> str:
    """MetaspacePreTokenizer::tokenize: "▁" + the space-separated parts joined by "▁"
    (std::getline drops one trailing empty part)."""
    parts = text.split(" ")
    if parts and parts[-1] == "":
        parts.pop()
    return META + META.join(parts)


class T5Unigram:
    def __init__(
        self, pieces: list[str], scores: list[float], special: dict[str, int] | None = None
    ):
        self.ids = {p: i for i, p in reversed(list(enumerate(pieces)))}  # first id of a piece wins
        self.special = dict(SPECIAL if special is None else special)
        self.unk_id = self.special["<unk>"]
        self._split = re.compile("(" + "|".join(map(re.escape, self.special)) + ")")
        self.scores = np.asarray(scores, dtype=np.float32)
        self.unk_score = np.float32(self.scores.min() - UNK_PENALTY)
        self.max_len = max(len(p) for p in pieces)
        self._memo: dict[str, list[int]] = {}

    @classmethod
    def from_spm(cls, path: Path | str) -> T5Unigram:
        import sentencepiece as spm

        proc = spm.SentencePieceProcessor()
        proc.Load(str(path))
        n = proc.get_piece_size()
        pieces = [proc.id_to_piece(i) or "<empty_token>" for i in range(n)]
        special = {
            pieces[i]: i
            for i in (proc.pad_id(), proc.eos_id(), proc.unk_id(), proc.bos_id())
            if i >= 0
        }
        return cls(pieces, [proc.get_score(i) for i in range(n)], special)

    def _viterbi(self, text: str) -> list[int]:
        """EncodeOptimized over characters (pieces end on character boundaries, so character
        positions give the byte-level lattice's paths in the same order)."""
        n = len(text)
        if n == 0:
            return []
        best = [np.float32(0.0)] * (n + 1)
        start = [-1] * (n + 1)
        ident = [-1] * (n + 1)
        ids, scores = self.ids, self.scores
        for s in range(n):
            here = best[s]
            single = False
            for e in range(s + 1, min(n, s + self.max_len) + 1):
                pid = ids.get(text[s:e])
                if pid is None:
                    continue
                cand = np.float32(scores[pid] + here)
                if start[e] == -1 or cand > best[e]:
                    best[e], start[e], ident[e] = cand, s, pid
                if e == s + 1:
                    single = True
            if not single:
                cand = np.float32(self.unk_score + here)
                if start[s + 1] == -1 or cand > best[s + 1]:
                    best[s + 1], start[s + 1], ident[s + 1] = cand, s, self.unk_id
        out, e = [], n
        while e > 0:
            out.append(ident[e])
            e = start[e]
        return out[::-1]

    def encode(self, text: str) -> list[int]:
        """The engine's ids for `text` (no EOS: pad_tokens adds it)."""
        hit = self._memo.get(text)
        if hit is not None:
            return list(hit)
        normalized = _MULTI_SPACE.sub(" ", text)
        parts = [p for p in self._split.split(normalized) if p] or [""]
        ids: list[int] = []
        for part in parts:
            if part in self.special:
                ids.append(self.special[part])
            else:
                ids.extend(self._viterbi(metaspace(part)))
        if len(self._memo) > 65536:
            self._memo.clear()
        self._memo[text] = tuple(ids)
        return ids
