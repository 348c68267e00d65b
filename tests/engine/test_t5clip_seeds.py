"""The engine tier for T5CLIPEmbedder's seed windows (Chroma: T5 v1.1; Wan: UMT5): every pack whose
adapter reads the 512-slot T5CLIP window gets its seed ids from the pack's rule (the T5 port over
each weight chunk, then the window) on the engine's own vocabulary, and they must be identical to
the window ggk 0.9.7's T5CLIPEmbedder builds (t5clip_probe.cpp, over the tier's 560 prompts:
empty, weights, escapes, BREAK, CJK, emoji, prompts past 512 pieces). Wan's vocabulary is the
engine's UMT5 table (umt5.hpp, 256300 pieces; the seed table has 256384 rows).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_build import build_t5clip
from engine_driver import Driver, hexs, ids
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


def write_spiece(vocab_json: Path, special: dict[str, int], path: Path) -> Path:
    """A snapshot's spiece.model holding the engine's own pieces and scores (the file training
    reads, teachers/t5.py SeedTokenizer): specials as control pieces (<unk> unknown), the
    engine's empty UMT5 pieces as unmatchable control placeholders (a model proto holds no empty
    piece; the engine's lattice never matches one either)."""
    from sentencepiece import sentencepiece_model_pb2 as spm_pb2

    model = json.loads(vocab_json.read_text(encoding="utf-8").rstrip("\0"))["model"]
    proto = spm_pb2.ModelProto()
    proto.trainer_spec.model_type = spm_pb2.TrainerSpec.UNIGRAM
    ids = {"<pad>": "pad_id", "</s>": "eos_id", "<s>": "bos_id", "<unk>": "unk_id"}
    proto.trainer_spec.bos_id = -1
    for piece, i in special.items():
        setattr(proto.trainer_spec, ids[piece], i)
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = True
    for k, (piece, score) in enumerate(model["vocab"]):
        p = proto.pieces.add()
        p.piece, p.score = piece or f"<empty_token_{k}>", score
        if piece in special or not piece:
            p.type = p.UNKNOWN if piece == "<unk>" else p.CONTROL
    path.write_bytes(proto.SerializeToString())
    return path


@pytest.mark.parametrize("pack_id", [p for p in pack_ids() if get_pack(p).seed_vocab in VOCABS])
def test_seed_windows_through_the_snapshots_spiece_model(t5clip, tmp_path, pack_id):
    """The seed ids training stores come from the linked snapshot's spiece.model
    (SeedTokenizer); with the engine's own vocabulary written as such a file, they are the
    windows ggk builds (T5CLIPEmbedder, or PixArtT5Embedder for PixArt), every 4th corpus
    prompt (the Python lattice over UMT5's 256,300 pieces is the slow part)."""
    from gguf_trainer.teachers.t5 import CAPTION_LENGTHS, SeedTokenizer

    pack = get_pack(pack_id)
    name, special = VOCABS[pack.seed_vocab]
    t5clip.ask("json", name, tmp_path / "tokenizer.json")
    spiece = write_spiece(tmp_path / "tokenizer.json", special, tmp_path / "spiece.model")
    windows = T5CLIP_WINDOWS if pack.num_queries in T5CLIP_WINDOWS else CAPTION_LENGTHS
    seeds = SeedTokenizer(spiece, pack.num_queries, vocab_limit=pack.seed_vocab, windows=windows)
    if windows is CAPTION_LENGTHS:  # PixArtT5Embedder: the tokenizer driver's `pixart`
        from engine_build import build

        probe = Driver(build(log=print))
        ask = lambda p: probe.ask("pixart", pack.num_queries, hexs(p)).split(" | ")[1]
    else:
        ask = lambda p: t5clip.ask("t5clip" if name == "t5" else "umt5",
                                   pack.num_queries, hexs(p))
    bad, n = [], 0
    try:
        for p in PROMPTS[::4]:
            got = ask(p)
            if got.startswith("throw"):
                continue
            n += 1
            if seeds.seed_ids(p) != ids(got):
                bad.append(p[:80])
    finally:
        if windows is CAPTION_LENGTHS:
            probe.close()
    print(f"{pack_id}: {n} seed windows from a spiece.model of the engine's {name} pieces "
          f"identical to ggk's for {n - len(bad)}")
    assert n >= 120 and not bad, f"{len(bad)} windows differ, e.g. {bad[:5]!r}"
