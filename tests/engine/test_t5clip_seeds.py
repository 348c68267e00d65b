"""The engine tier for T5CLIPEmbedder's seed windows (Chroma: T5 v1.1; Wan: UMT5): every pack whose
adapter reads the 512-slot T5CLIP window gets its seed ids from the pack's rule (the T5 port over
each weight chunk, then the window) on the engine's own vocabulary, and they must be identical to
the window ggk 0.9.7's T5CLIPEmbedder builds (t5clip_probe.cpp, over the tier's 560 prompts:
empty, weights, escapes, BREAK, CJK, emoji, prompts past 512 pieces). Wan's vocabulary is the
engine's UMT5 table (umt5.hpp, 256300 pieces; the seed table has 256384 rows).
"""

from __future__ import annotations

import json

import pytest
from engine_build import build_t5clip
from test_engine_tier import Driver, hexs, ids
from tier_corpus import prompts

from gguf_trainer.engine.t5_unigram import T5Unigram
from gguf_trainer.engine.template_ids import Piece, template_ids
from gguf_trainer.packs import get_pack, pack_ids
from gguf_trainer.teachers.t5 import T5CLIP_WINDOWS, check_window, window_ids

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

PROMPTS = prompts()
# the seed table's rows -> the engine's tokenizer: T5UniGramTokenizer(is_umt5) and its specials
VOCABS = {
    32128: ("t5", {"<pad>": 0, "</s>": 1, "<unk>": 2}),
    256384: ("umt5", {"<pad>": 0, "</s>": 1, "<s>": 2, "<unk>": 3}),
}
T5CLIP_PACKS = [p for p in pack_ids() if get_pack(p).num_queries in T5CLIP_WINDOWS]


@pytest.fixture(scope="module")
def t5clip():
    d = Driver(build_t5clip(log=print))
    yield d
    d.close()


@pytest.fixture(scope="module")
def engine_vocab(t5clip, tmp_path_factory):
    """The engine's own T5 / UMT5 vocabulary as this tool's T5 port, by name."""
    out = {}
    for name, special in VOCABS.values():
        path = tmp_path_factory.mktemp(name) / "tokenizer.json"
        t5clip.ask("json", name, path)
        model = json.loads(path.read_text(encoding="utf-8").rstrip("\0"))["model"]
        out[name] = T5Unigram(
            [p or "<empty_token>" for p, _ in model["vocab"]], [s for _, s in model["vocab"]],
            special,
        )
    return out


def test_every_t5clip_family_is_covered():
    assert {"t5xxl_chroma", "umt5xxl_wan"} <= set(T5CLIP_PACKS)
    assert all(get_pack(p).seed_vocab in VOCABS for p in T5CLIP_PACKS)


@pytest.mark.parametrize("pack_id", T5CLIP_PACKS)
def test_t5clip_seed_windows(t5clip, engine_vocab, pack_id):
    pack = get_pack(pack_id)
    window = check_window(pack.num_queries, T5CLIP_WINDOWS)  # the 512 window is accepted
    name, _special = VOCABS[pack.seed_vocab]
    tok = engine_vocab[name]
    bad, n, cut = [], 0, 0
    for p in PROMPTS:
        got = t5clip.ask("t5clip" if name == "t5" else "umt5", window, hexs(p))
        if got.startswith("throw"):
            continue  # the engine's parser refuses it; so does ours (test_prompt_parser)
        n += 1
        want = ids(got)
        pieces = template_ids(tok.encode, [Piece(p, prompt=True)])
        cut += len(pieces) + 1 > window
        if window_ids(pieces, window) != want:
            bad.append((p[:80], want[:8]))
    empty = ids(t5clip.ask("t5clip" if name == "t5" else "umt5", window, hexs("")))
    assert empty[1:3] == [1, 0] and empty[0] == tok.encode("")[0]  # "" = "▁" + EOS
    weighted = "a (red:1.3) fox, [blurry] \\(not a weight\\)"
    assert window_ids(template_ids(tok.encode, [Piece(weighted, prompt=True)]), window) == ids(
        t5clip.ask("t5clip" if name == "t5" else "umt5", window, hexs(weighted))
    )
    print(f"{pack_id}: {n} {name} windows of {window} slots ({cut} cut at the window) identical "
          f"to the engine's T5CLIPEmbedder for {n - len(bad)}")
    assert n >= 500 and cut > 0 and not bad, f"{len(bad)} windows differ, e.g. {bad[:5]!r}"
