"""The engine tier: every registered pack's conditioning against ggk 0.9.7's own code, built from
the pinned source package (engine_build.py) and fed by a small driver (probe.cpp), on a fixed
corpus of 560 prompts and 100 image sizes (tier_corpus.py). Ids must be identical:

  * the prompt parser (chunks and float32 weights);
  * student ids, for every pack: the engine's template code, cut from the pinned conditioner.hpp
    at the lines the pack's `engine_template` cites and run by LLMEmbedder::tokenize, or, for a raw
    prompt pack, PixArtT5Embedder's chunked Qwen2 ids ([151643] for nothing);
  * the template start row (prompt_template_encode_start_idx) and the image runs' rows;
  * T5 seed windows (120 and 300 slots) of the packs seeded by T5 v1.1, from the engine's own
    T5UniGramTokenizer over the vocabulary it embeds;
  * reference image sizes, vision-token counts and the shapes clip_preprocess throws on;
  * Fibo 2.0's reference pixels (fibo2_images.py) against the dump of its own loop, bit for bit.
  (the exported adapters through ggk's ModelLoader and runners: test_engine_adapters.py; taps,
  pads, lengths, citations: test_engine_contract.py; printed commands: test_ggk_commands.py)
A new pack is covered by declaring `engine_template` (or none, for a raw prompt): no test code.
"""

from __future__ import annotations

import json
import time

import pytest
from engine_build import build, unsupported_packs
from engine_driver import Driver, fields, hexs, ids
from tier_corpus import image_sizes, prompts

from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.prompt_syntax import PromptSyntaxError, parse_prompt_attention
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.engine.qwen_vl_images import engine_refuses, vision_tokens
from gguf_trainer.engine.t5_unigram import T5Unigram
from gguf_trainer.model.student import load_tokenizer
from gguf_trainer.packs import get_pack, pack_ids
from gguf_trainer.teachers.t5 import window_ids
from gguf_trainer.tiny import qwen_tokenizer_dir

# A cold build of the engine's code takes minutes on 2 cores: the tier runs in the full suite
# (.ci/run), not in the quick `-m "not slow"` pass, and the first test (which waits for the
# build) gets more than the suite's 600 s per test on a slow machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

PROMPTS = prompts()
SIZES = image_sizes()
PACKS = pack_ids()
T5_V11_VOCAB = 32128


@pytest.fixture(scope="module")
def driver():
    t0 = time.perf_counter()
    path = build(log=print)
    d = Driver(path)
    yield d
    d.close()
    print(f"engine tier: build/lookup {time.perf_counter() - t0 - d.seconds:.1f} s, "
          f"{d.calls} driver calls in {d.seconds:.1f} s")


@pytest.fixture(scope="module")
def encode():
    return engine_bpe(load_tokenizer(qwen_tokenizer_dir())).encode


def test_the_corpus_covers_the_cases():
    assert len(PROMPTS) >= 500 and len(set(PROMPTS)) >= 480 and len(SIZES) == 100
    assert "" in PROMPTS and any(len(p) > 2000 for p in PROMPTS)
    assert any("BREAK" in p for p in PROMPTS) and any("\\(" in p for p in PROMPTS)


def test_the_ports_tables_are_the_engines(driver):
    """qwen_letters.py is tokenize_util.cpp's is_letter table; qwen_cspace.py is what the engine's
    isspace(char32_t) answers past 255 on this machine's C library."""
    import re

    from engine_build import ENGINE, cache_root

    from gguf_trainer.engine.qwen_cspace import LIMIT, cspace_bits
    from gguf_trainer.engine.qwen_letters import letter_ranges

    util = f"*/src/{ENGINE}/diffusion/src/tokenizers/tokenize_util.cpp"
    src = next(cache_root().glob(util)).read_text()
    body = src[src.index("bool is_letter") : src.index("bool is_space")]
    assert letter_ranges() == [
        (int(a, 16), int(b, 16))
        for a, b in re.findall(r"\{0x([0-9A-Fa-f]+),\s*0x([0-9A-Fa-f]+)\}", body)
    ]
    engine = {int(c) for c in driver.ask("cspace").split() if int(c) < LIMIT}
    bits = cspace_bits()
    ours = {c for c in range(256, LIMIT) if bits[c >> 3] >> (c & 7) & 1}
    assert engine == ours, (
        f"this C library's isspace past 255 differs from qwen_cspace.py's in "
        f"{len(engine ^ ours)} code points: regenerate the table from `probe cspace`"
    )


def test_prompt_parser(driver):
    bad = []
    for p in PROMPTS:
        got = driver.ask("parse", hexs(p))
        if got.startswith("throw"):
            with pytest.raises(PromptSyntaxError):
                parse_prompt_attention(p)
            continue
        engine = [
            (bytes.fromhex(c.split(":", 1)[1]).decode("utf-8"), float(c.split(":", 1)[0]))
            for c in got.split(" ")
        ]
        ours = [(t, float(f"{w:.9g}")) for t, w in parse_prompt_attention(p)]
        if engine != ours:
            bad.append((p, engine, ours))
    assert not bad, f"{len(bad)} of {len(PROMPTS)} prompts parse differently, e.g. {bad[0]!r}"


# The packs whose student ids come from LLMEmbedder's template (engine_template) or, for the
# T5 embedders, the raw prompt; the slot kinds' ids (the Qwen3.5 bridge, Ming) have their own
# engine tests (test_qwen35_bridge_engine.py, test_ming_adapter_engine.py).
ID_PACKS = [p for p in PACKS if get_pack(p).engine_template
            or get_pack(p).adapter_kind == "seeded_resampler"]


@pytest.mark.parametrize("pack_id", ID_PACKS)
def test_student_ids_and_start_rows(driver, encode, pack_id):
    pack = get_pack(pack_id)
    assert pack_id not in unsupported_packs(), unsupported_packs().get(pack_id)
    bad, n = [], 0
    for p in PROMPTS:
        if driver.ask("parse", hexs(p)).startswith("throw"):
            continue  # the engine cannot run it; the corpus skips it
        sample = Sample(p)
        if pack.engine_template:
            start, engine_ids, _, _ = fields(driver.ask("tmpl", pack_id, hexs(p), 0))[:4]
            want, want_start = ids(engine_ids), int(start.split()[1])
        else:
            want, want_start = ids(driver.ask("pixart", 120, hexs(p)).split(" | ")[0]), 0
        n += 1
        got = pack.student_ids(encode, sample)
        if got != want or pack.template_start(sample) != want_start:
            bad.append((p, len(want), len(got)))
    print(f"{pack_id}: {n} prompts, student ids identical to the engine's for {n - len(bad)}")
    assert n >= 500 and not bad, (
        f"{len(bad)} prompts differ (prompt, engine ids, ours): {bad[:5]!r}"
    )


@pytest.fixture(scope="module")
def engine_t5(driver, tmp_path_factory):
    path = tmp_path_factory.mktemp("t5") / "tokenizer.json"
    driver.ask("t5json", path)
    model = json.loads(path.read_text(encoding="utf-8").rstrip("\0"))["model"]
    return T5Unigram(
        [p or "<empty_token>" for p, _ in model["vocab"]], [s for _, s in model["vocab"]]
    )


@pytest.mark.parametrize("pack_id", [p for p in PACKS if get_pack(p).seed_vocab == T5_V11_VOCAB])
def test_t5_seed_windows(driver, engine_t5, pack_id):
    """The pack's seed rule (teachers/t5.py SeedTokenizer: the T5 port over each weight chunk, then
    the window) on the engine's own vocabulary, against the engine's T5UniGramTokenizer."""
    from gguf_trainer.engine.template_ids import Piece, template_ids

    bad, n = [], 0
    for window in (120, 300):
        for p in PROMPTS:
            got = driver.ask("pixart", window, hexs(p))
            if got.startswith("throw"):
                continue
            n += 1
            want = ids(got.split(" | ")[1])
            ours = window_ids(template_ids(engine_t5.encode, [Piece(p, prompt=True)]), window)
            if ours != want:
                bad.append((window, p))
    # "" = "▁" + EOS
    assert ids(driver.ask("pixart", 120, hexs("")).split(" | ")[1])[:3] == [3, 1, 0]
    print(f"{pack_id}: {n} T5 windows identical to the engine's for {n - len(bad)}")
    assert not bad, f"{len(bad)} windows differ, e.g. {bad[:5]!r}"


@pytest.mark.parametrize("pack_id", [p for p in PACKS if get_pack(p).vis_dim])
def test_image_sizes_runs_and_refusals(driver, encode, pack_id):
    """The pack's size rule (`image_size`), its vision-token counts, its refusals (the shapes
    the engine's clip_preprocess throws on at that size), ids, runs and start row."""
    pack = get_pack(pack_id)
    size = pack.image_size
    bad, refused = [], 0
    for k, (h, w) in enumerate(SIZES):
        text = PROMPTS[k * 5 % len(PROMPTS)]
        if driver.ask("parse", hexs(text)).startswith("throw"):
            text = "make it night."
        shapes = [(h, w)] + ([SIZES[(k + 1) % len(SIZES)]] if k % 4 == 0 else [])
        # Qwen Image 2.1's pipeline resizes before the conditioner (test_qwen_image_2_1_refs.py
        # runs that rule): the conditioner gets the sized pictures
        given = [size(*s) for s in shapes] if getattr(size, "sized_by_pipeline", False) else shapes
        got = driver.ask("tmpl", pack_id, hexs(text), len(shapes), *[x for s in given for x in s])
        if got.startswith("throw"):
            refused += 1
            if not any(engine_refuses(*s, size) for s in shapes):
                bad.append(("engine throws, we accept", shapes))
            continue
        if any(engine_refuses(*s, size) for s in shapes):
            bad.append(("we refuse, the engine takes", shapes))
            continue
        start, engine_ids, runs, sizes = fields(got)[:4]
        runs = [tuple(map(int, r.split(":"))) for r in runs.split()]
        sizes = [tuple(map(int, s.split(":"))) for s in sizes.split()]
        counts = [vision_tokens(*s, size) for s in shapes]
        sample = Sample(text, images=tuple(f"{i}.png" for i in range(len(shapes))))
        ours = pack.student_ids(encode, sample, counts)
        # the images' runs come first; a prompt may spell <|image_pad|> itself (precompute drops it)
        our_runs = _runs(ours, pack.image_pad_id)[: len(shapes)]
        if (
            sizes != [size(*s) for s in shapes]
            or [n for _, n in runs] != counts
            or ours != ids(engine_ids)
            or our_runs != runs
            or pack.template_start(sample) != int(start.split()[1])
        ):
            bad.append((shapes, sizes, runs, our_runs))
    print(
        f"{pack_id}: {len(SIZES)} image samples, {refused} refused by the engine's clip_preprocess"
    )
    assert not bad, f"{len(bad)} image samples differ, e.g. {bad[:3]!r}"


def _noise(h: int, w: int):
    """probe.cpp's `tmpl` pixels as an 8-bit (h, w, 3) picture: ((k · 2654435761) mod 2³²) >> 24
    at k = x + w·(y + h·c)."""
    import numpy as np

    k = np.arange(3 * h * w, dtype=np.uint64)
    v = ((k * np.uint64(2654435761)) % np.uint64(2**32)) >> np.uint64(24)
    return v.reshape(3, h, w).transpose(1, 2, 0).astype(np.uint8)


def test_fibo2_reference_pixels_are_the_engines(driver, tmp_path):
    """What Fibo2Conditioner hands the vision tower (its SD_DUMP_COND ref0_rgb.bin: the 768 px
    step, the grid step, both 8-bit bicubic, then 2v - 1) equals preprocess_fibo2 of the same
    picture, every float; the preset the driver plays is the engine's "fibo2" one."""
    import os
    import re

    import numpy as np
    from engine_build import ENGINE, cache_root
    from PIL import Image

    from gguf_trainer.engine.fibo2 import MAX_SIDE, preprocess_fibo2

    model = next(cache_root().glob(f"*/src/{ENGINE}/diffusion/src/model/diffusion/model.hpp"))
    preset = re.search(r'\{"fibo2", \[\] \{(.*?)\}\(\)\}', model.read_text(), re.DOTALL)[1]
    assert "vlm_resize_mode             = RefImageResizeMode::LONGEST_SIDE;" in preset
    assert f"vlm_max_size                = {MAX_SIDE};" in preset
    pack = "qwen3vl_fibo2"  # the pack citing fibo2.hpp (Fibo2Probe)
    assert get_pack(pack).engine_template["file"].endswith("fibo2.hpp")
    dump = tmp_path / "dump"
    dump.mkdir()
    d = Driver(driver.path, env={**os.environ, "SD_DUMP_COND": str(dump)})
    bad, sizes = [], SIZES[:14] + SIZES[14::9]
    try:
        for h, w in sizes:
            got = d.ask("tmpl", pack, hexs("make it night"), 1, h, w)
            assert not got.startswith("throw"), got
            tw, th = map(int, (dump / "ref0_shape.txt").read_text().split())
            engine = np.fromfile(dump / "ref0_rgb.bin", dtype="<f4").reshape(3, th, tw)
            Image.fromarray(_noise(h, w)).save(tmp_path / "p.png")
            ours = preprocess_fibo2(tmp_path / "p.png")
            if ours.shape != engine.shape or not np.array_equal(ours, engine):
                bad.append(((h, w), ours.shape, engine.shape))
    finally:
        d.close()
    print(f"{pack}: {len(sizes)} reference pictures, pixels identical to the engine's for "
          f"{len(sizes) - len(bad)}")
    assert not bad, f"{len(bad)} pictures differ, e.g. {bad[:3]!r}"


def _runs(ids_, pad):
    out, i = [], 0
    while i < len(ids_):
        if ids_[i] == pad:
            j = i
            while j < len(ids_) and ids_[j] == pad:
                j += 1
            out.append((i, j - i))
            i = j
        else:
            i += 1
    return out
