"""The engine tier's contract check: what ggk 0.9.7 reads for each shipped pack, from its own code.

  * the taps (out_layers), raw vs final norm, the pads (tokenize's min_length, FLUX.3's multiple)
    and the cut (max_length), as the pack's template branch sets them when the driver runs it
    (probe.cpp's `tmpl` answer), against the pack object: `taps` / `teacher_taps` and `padding`;
    Fibo 2.0's from Fibo2Conditioner's own encode_prompt call; the T5 families' windows from
    the T5 embedders' declarations;
  * the families a pack's file also serves (Krea2's serves Iris-3B): their branch's taps and
    start are the pack's, and their cut keeps the template's suffix;
  * every pack's `engine_template` is the whole branch of its own version in the template chain
    (engine_source.py parses the chain and model.h's sd_version_is_*);
  * every line citation in gguf_trainer/ and tests/ (engine_citations.py reads its forms, in
    Python comments and strings and the C++ probes' `//` comments) names
    lines of the pinned sdist; one starting on a branch or function head is that whole block, one
    inside a function stays in it, an identifier it names is on its lines, a constant on its
    line is spelled there; a pack's citation into the template chain lies in the branch of its
    own version (or of a family it serves).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from engine_build import build
from engine_citations import check, citations, parse
from engine_driver import Driver, hexs, template
from engine_source import CONDITIONER, Source

from gguf_trainer.packs import get_pack, pack_ids

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

SHIPPED = [i for i in pack_ids()
           if type(get_pack(i)).__module__.startswith("gguf_trainer.packs.")]
TEMPLATED = [i for i in SHIPPED if get_pack(i).engine_template]
RAW = [i for i in SHIPPED if get_pack(i).adapter_kind == "seeded_resampler"]  # the T5 windows
FAKE_LLM_LAYERS = 36  # probe.cpp FakeLLM config.num_layers: Qwen Image 2.1's {num_layers}
NO_MAX = 100000000  # tokenize's default max_length (conditioner.hpp 2554): no cut
PACKAGE = Path(__file__).resolve().parents[2] / "gguf_trainer"


@pytest.fixture(scope="module")
def src():
    return Source()


@pytest.fixture(scope="module")
def driver():
    d = Driver(build(log=print))
    yield d
    d.close()


def lengths(pack, driver, key=None) -> list[dict]:
    """The template answers for prompts from empty to ~700 student tokens (every residue of a
    pad multiple up to 80 is met on the way)."""
    words = ["a", "red", "fox", "in", "the", "snow,", "under", "a", "pale", "sky"]
    prompts = [""] + [" ".join(words[i % len(words)] for i in range(n))
                      for n in (1, 3, 7, 20, 41, 63, 90, 150, 260, 420, 530)]
    return [template(driver.ask("tmpl", key or pack.id, hexs(p), 0)) for p in prompts]


def pack_taps(pack) -> tuple[tuple[int, ...], str]:
    """(the teacher layers the pack's targets are, "raw" | "norm") as the pack declares them."""
    if pack.adapter_kind == "layerwise":
        return tuple(pack.taps), "raw"
    if hasattr(pack, "tap_layout"):  # the token-aligned Qwen packs: teacher_taps / last layer
        taps = pack.tap_layout(FAKE_LLM_LAYERS).taps
        return tuple(taps), "raw" if taps else "norm"
    return (), "none"  # a resampler of the teacher's own output rows (LLaDA): no tap


def test_llm_taps_are_raw_below_the_norm(src):
    """llm.hpp: out_layers k <= num_layers is decoder layer k's raw output; k = num_layers + 1,
    or no out_layers at all, the final norm. The reading the tap checks below rest on."""
    text = "\n".join(src.text("model/te/llm.hpp"))
    assert "} else if (out_layers.find(i + 1) != out_layers.end()) {\n" \
           "                    intermediate_outputs.push_back(x);" in text
    assert "if (out_layers.find(static_cast<int>(num_layers + 1)) != out_layers.end()) {\n" \
           "                    intermediate_outputs.push_back(normed_x);" in text
    assert "            } else {\n                x = normed_x;\n            }" in text


def contract_problems(pack, answers: list[dict]) -> list[str]:
    """Where the pack's taps (raw layers or the final norm), pads and cut differ from what the
    engine's branch set in these template answers (lengths())."""
    engine, out = answers[0], []
    if not all(a["layers"] == engine["layers"] and a["min"] == engine["min"]
               and a["max"] == engine["max"] for a in answers):
        out.append("the branch's taps or lengths change with the prompt")
    taps, kind = pack_taps(pack)
    if kind != "none" and tuple(engine["layers"]) != taps:
        out.append(f"the engine's branch taps {engine['layers'] or 'the final norm'}, the pack "
                   f"{taps or 'the final norm'}")
    pad = pack.padding
    if engine["min"] != pad.min_length:
        out.append(f"the engine pads to {engine['min']} ids, the pack to {pad.min_length}")
    # a cut past every sample the pack keeps cannot differ (Mage Flow: 2048 + start)
    if (pad.max_length or engine["max"] < pack.max_len_student) and \
            engine["max"] != (pad.max_length or NO_MAX):
        out.append(f"the engine cuts the template at {engine['max']} ids, the pack at "
                   f"{pad.max_length or 'none'} (its samples reach {pack.max_len_student})")
    if engine["hsmin"]:
        out.append(f"the engine zero-pads to {engine['hsmin']} rows; the pack does not")
    # tokenize's pads as they fall: each padded length from the real one, the multiple read off
    padded = [(a["real"], len(a["ids"])) for a in answers]
    grown = [n for real, n in padded if n > max(real, engine["min"])]
    multiple = math.gcd(*grown) if grown else 0
    if multiple != pad.multiple:
        out.append(f"the engine pads to multiples of {multiple}, the pack of {pad.multiple}")
    for real, n in padded:
        want = max(real, engine["min"])
        if multiple:
            want = -(-real // multiple) * multiple
        if n != min(want, engine["max"]):
            out.append(f"{real} real ids padded to {n}, not {min(want, engine['max'])}")
    return out


@pytest.mark.parametrize("pack_id", TEMPLATED)
def test_taps_pads_and_cut_are_the_engines(driver, pack_id):
    pack = get_pack(pack_id)
    answers = lengths(pack, driver)
    found = contract_problems(pack, answers)
    assert not found, f"{pack_id}: " + "; ".join(found)
    engine = answers[0]
    print(f"{pack_id}: taps {engine['layers'] or 'final norm'} ({pack_taps(pack)[1]}), "
          f"min_length {engine['min']}, multiple {pack.padding.multiple}, max_length "
          f"{engine['max'] if engine['max'] != NO_MAX else 'none'}: the pack's")


def test_the_contract_check_catches_a_drifted_pack(driver):
    """A pack whose taps, pads or cut drift from the engine's is reported: the klein pack with
    its tap list shifted, its pads dropped, a cut added; FLUX.3 with its multiple halved."""
    import copy
    from dataclasses import replace

    klein = get_pack("qwen3_flux2_klein")
    answers = lengths(klein, driver)
    assert not contract_problems(klein, answers)
    for change, word in (({"taps": (9, 18, 28)}, "taps"),
                         ({"padding": replace(klein.padding, min_length=0)}, "pads to 512"),
                         ({"padding": replace(klein.padding, max_length=300)}, "cuts")):
        drifted = copy.copy(klein)
        for k, v in change.items():
            object.__setattr__(drifted, k, v)
        assert any(word in p for p in contract_problems(drifted, answers)), change
    flux3 = copy.copy(get_pack("qwen3vl_flux3"))
    object.__setattr__(flux3, "padding", replace(flux3.padding, multiple=40))
    assert any("multiples of 80" in p for p in contract_problems(flux3, lengths(flux3, driver)))


def test_every_pack_length_rule_is_met(driver):
    """The padding rules the tier checks do occur among the shipped packs: pads to a length, to
    a multiple, a cut (a pack set losing them would leave the check above empty)."""
    pads = [get_pack(p).padding for p in TEMPLATED]
    assert any(p.min_length for p in pads) and any(p.multiple for p in pads)
    assert any(p.max_length for p in pads)


def test_served_families_take_the_packs_file(driver, src):
    """A family a pack's one file serves (Krea2 -> Iris-3B): same taps (else ggk aborts at the
    stack check, conditioner.hpp 2816-2840), same start and template; its own cut keeps the
    assistant suffix (the rows past it are cut from the prompt)."""
    from engine_build import served_branches
    from test_engine_adapters import driver_encode

    from gguf_trainer.data.samples import Sample

    encode, seen = driver_encode(), []
    for pack in map(get_pack, TEMPLATED):
        for version, _ in served_branches(src.engine, pack):
            key, short = f"{pack.id}@{version}", "a sheep in sunglasses."
            long_text = "a red fox " * 400
            got = template(driver.ask("tmpl", key, hexs(short), 0))
            assert got["layers"] == tuple(pack.taps), (key, got["layers"], pack.taps)
            assert got["start"] == pack.template_start(Sample(short))
            assert got["ids"] == pack.student_ids(encode, Sample(short))
            cut = template(driver.ask("tmpl", key, hexs(long_text), 0))
            ours = pack.student_ids(encode, Sample(long_text))
            empty = pack.student_ids(encode, Sample(""))
            tail = empty[pack.template_start(Sample("")) :]  # the suffix after the prompt
            assert cut["hsmin"] and len(cut["ids"]) == cut["max"] == cut["start"] + cut["hsmin"]
            assert len(ours) > len(cut["ids"])
            assert cut["ids"][-len(tail):] == tail == ours[-len(tail):]
            assert cut["ids"][: -len(tail)] == ours[: len(cut["ids"]) - len(tail)]
            seen.append(key)
            print(f"{pack.id} serves {version}: taps, start {got['start']} and template the "
                  f"pack's; its cut at {cut['max']} rows keeps the suffix")
    assert seen, "no pack serves a second family any more: drop this check or find the family"


@pytest.mark.parametrize("pack_id", RAW)
def test_t5_windows_are_the_embedders(src, pack_id):
    """The T5 families' slot counts: PixArtT5Embedder's caption_length (the pack's default
    window) and T5CLIPEmbedder's chunk_len, each as the engine declares its default."""
    pack = get_pack(pack_id)
    text = "\n".join(src.text(CONDITIONER))
    embedder = "struct PixArtT5Embedder" if pack.id == "t5xxl_pixart" else "struct T5CLIPEmbedder"
    body = text[text.index(embedder):]
    name = "caption_length" if pack.id == "t5xxl_pixart" else "chunk_len"
    window = int(re.search(rf"size_t {name}\s*=\s*(\d+);", body)[1])
    assert pack.num_queries == window and pack.fixed_rows == window


@pytest.mark.parametrize("pack_id", TEMPLATED)
def test_engine_template_is_the_branch_of_its_version(src, pack_id):
    t = get_pack(pack_id).engine_template
    if t["file"] == CONDITIONER:
        b = src.branch_of(t["version"])
        assert tuple(t["lines"]) == (b.first, b.last), (
            f"{pack_id} cites {t['file']}:{t['lines']}; {t['version']} takes the branch "
            f"`{b.cond}` at {b.first}-{b.last}")
        return
    lines = src.text(t["file"])  # Fibo2Conditioner: its own file, its version in the constructor
    lo, hi = next((i + 1, j + 1) for i, s in enumerate(lines) if s.startswith("struct ")
                  and "Conditioner" in s for j in [next(k for k in range(i, len(lines))
                                                        if lines[k] == "};")])
    body = "\n".join(lines[lo - 1 : hi])
    assert t["version"] in body and "encode_prompt(" in "\n".join(src.lines(t["file"],
                                                                            *t["call"]))
    for a, b in [*t.get("members", ()), t["lines"], t["call"]]:
        assert lo <= a <= b <= hi


# ---------------------------------------------------------------- citations

ROOTS = (PACKAGE, PACKAGE.parent / "tests", PACKAGE.parent / "README.md")


@pytest.fixture(scope="module")
def cited(src):
    return citations(ROOTS, src.knows)


def test_citation_forms_are_read():
    """Every form the code writes a citation in is read, a bare range taking the file last
    named in its docstring or comment run (and no file: no citation)."""
    # the file names spelled apart so that this module's own scan does not read them
    f, u, b, m, l = "conditioner", "util", "fibo2", "ming_image_te", "llm"
    text = (f'''"""Engine ({f}.hpp 3549-3561): pads (2610-2612); Iris-3B (3656-3673).
`LLMEmbedder::tokenize` ({f}.hpp 2551-2622); {f}.hpp:1199 and {f}.hpp:1396-1410, 1533.
{u}.cpp, lines 806-906; {b}.hpp clean_caption (64-86); {l}.hpp 2336-2365 and 2442-2469;
{m}.hpp, cited `T:<line>`: T:40-42.
"""
X = 512  # {f}.hpp:1199
Y = 1
# t5 (2-4 layers, llama.cpp 5-9) (10-20)
''')
    read = parse(Path("m.py"), text, known=lambda name: name != "llama.cpp")
    got = [(c.file, c.first, c.last, c.name, c.line) for c in read]
    assert got == [
        (f"{f}.hpp", 3549, 3561, None, 1), (f"{f}.hpp", 2610, 2612, None, 1),
        (f"{f}.hpp", 3656, 3673, None, 1), (f"{f}.hpp", 2551, 2622, "LLMEmbedder::tokenize", 2),
        (f"{f}.hpp", 1199, 1199, None, 2), (f"{f}.hpp", 1396, 1410, None, 2),
        (f"{f}.hpp", 1533, 1533, None, 2), (f"{u}.cpp", 806, 906, None, 3),
        (f"{b}.hpp", 64, 86, "clean_caption", 3), (f"{l}.hpp", 2336, 2365, None, 3),
        (f"{l}.hpp", 2442, 2469, None, 3), (f"{m}.hpp", 40, 42, None, 4),
        (f"{f}.hpp", 1199, 1199, None, 6)], got
    assert read[-1].code == "X = 512" and read[0].code is None
    more = f'''"""{f}.hpp 1460-1483 T5CLIPEmbedder, 1844-1867 PixArtT5Embedder; the dumps
(MingImageEmbedder, 3911-3932), the edits, 292-316; detect_from_weights 485-530; its default
(default_pixels, 6027); line 1245. Not lines: (4096), (256, 2560), rows 13-14, 2-4 layers.

    cap_query           ne [W, n_cap]            f32 param (539)       torch (n_cap, W)
"""'''
    got = [(c.first, c.last, c.name) for c in parse(Path("m.py"), more)]
    assert got == [(1460, 1483, None), (1844, 1867, "PixArtT5Embedder"),
                   (3911, 3932, "MingImageEmbedder"), (292, 316, None),
                   (485, 530, "detect_from_weights"), (6027, 6027, "default_pixels"),
                   (1245, 1245, None), (539, 539, "cap_query")], got
    # a file in backticks; a lone "(NNN)" after a named file unless a multiple of 32 (a width)
    lone = f'"""`{f}.hpp` 4426-4448: returned (342), `x` (227); widths (2560), (352)."""'
    got = [(c.first, c.last) for c in parse(Path("m.py"), lone)]
    assert got == [(4426, 4448), (342, 342), (227, 227)], got
    md = f"A paragraph ({f}.hpp 2551-2623)\nand more (2898).\n\nNo file here (2898).\n"
    got = [(c.file, c.first, c.line) for c in parse(Path("README.md"), md)]
    assert got == [(f"{f}.hpp", 2551, 1), (f"{f}.hpp", 2898, 2)], got


def test_the_citation_check_catches_drift(src):
    """The two citations found stale by hand (FLUX.3's branch cited 3549-3560, Iris-3B's as a
    bare (3656-3680)) fail the check; the branches as they are (3549-3561, 3656-3673) pass; a
    few lines inside a branch pass, a range cut short of a function or running out of it fails,
    so do a constant or quoted code not on its cited line and a range that slid off the code."""
    f = "conditioner"
    flux3, iris = src.branch_of("VERSION_FLUX3"), src.branch_of("VERSION_IRIS")
    assert (flux3.head, flux3.last, iris.head, iris.last) == (3549, 3561, 3656, 3673)

    def problems(body: str) -> list[str]:
        return [p for c in parse(Path("m.py"), body, src.knows) for p in check(c, src)]

    old = f'''"""Engine (ggk 0.9.7 {f}.hpp 3549-3560): FLUX.3. Iris-3B (3656-3680) too."""'''
    found = problems(old)
    assert len(found) == 2 and "cite 3549-3561" in found[0] and "3656-3680" in found[1], found
    assert not problems(old.replace("3560", "3561").replace("3680", "3673"))
    assert not problems(f'"""{f}.hpp 3550-3555 and (3657-3660)"""')  # lines inside: fine
    tok = src.function(CONDITIONER, "std::tuple<std::vector<int>, std::vector<float>, std::")
    assert not problems(f'"""`LLMEmbedder::tokenize` ({f}.hpp {tok[0]}-{tok[1] - 1})"""')
    assert problems(f'"""{f}.hpp {tok[0]}-{tok[1] - 5}"""')  # cut short
    assert problems(f'"""{f}.hpp {tok[0] + 10}-{tok[1] + 5}"""')  # runs out of it
    assert problems(f"X = 81  # {f}.hpp 2612")  # the pad multiple is 80 on that line
    assert not problems(f"X = 80  # {f}.hpp 2612")
    g = "gk-diffuser"  # quoted code the file has must be on the cited line
    assert not problems(f'"""`chroma_use_t5_mask = false` ({g}.cpp:4390)"""')
    assert problems(f'"""`chroma_use_dit_mask = true` ({g}.cpp:4390)"""')
    assert problems(f'"""{f}.hpp 2613-2616"""')  # FLUX.3's old pad cite: off the code
    a = "llm_adapter"  # a declaration table's row: its tensor on the cited line
    row = f'"""{a}.hpp:\n    cap_query   ne [W, n_cap]   f32 param (539)\n"""'
    assert not problems(row) and problems(row.replace("(539)", "(540)"))


def test_every_citation_is_the_engines(src, cited):
    """Every citation in gguf_trainer/ and tests/ (the probes' C++ included) says what the
    engine's lines are (engine_citations.check: a block cited whole, lines inside a function,
    its identifier and its constant on them)."""
    # the rule catches a citation off its identifier, and takes lines inside its definition
    first, last = src.function(CONDITIONER, "struct PixArtT5Embedder")
    assert src.holds(CONDITIONER, first + 20, first + 30, "PixArtT5Embedder") is True
    assert src.holds(CONDITIONER, last + 5, last + 9, "PixArtT5Embedder") is False
    assert src.holds(CONDITIONER, 1, 2, "no_such_engine_word") is None
    found = {c: check(c, src) for c in cited}
    bad = [p for problems in found.values() for p in problems]
    print(f"{len(cited)} citations checked in {len({c.module for c in cited})} modules, "
          f"{sum(map(bool, found.values()))} stale")
    assert len(cited) > 300 and any(c.file.endswith("conditioner.hpp") for c in cited)
    assert not bad, "citations that are not the engine's:\n" + "\n".join(bad)


def test_pack_citations_into_the_template_chain_are_their_branch(src, cited):
    from engine_build import served_branches

    lo, hi = src.chain_span
    owner = {type(get_pack(p)).__module__.rsplit(".", 1)[1]: get_pack(p) for p in SHIPPED}
    bad, checked = [], 0
    for c in cited:
        pack = owner.get(c.module.stem) if c.module.parent.name == "packs" else None
        a, b = c.first, c.last
        if pack is None or not c.file.endswith("conditioner.hpp") or b < lo or a > hi:
            continue
        checked += 1
        own = pack.engine_template.get("version")
        allowed = ([src.branch_of(own)] if own else []) + [
            src.branch_of(v) for v, _ in served_branches(src.engine, pack)]
        if not any(br.head <= a <= b <= br.last for br in allowed):
            where = [br.cond for br in src.template_chain if br.head <= a <= br.last]
            bad.append(f"{c}: not in the branch of {own} "
                       f"({', '.join(f'{br.head}-{br.last}' for br in allowed)}); "
                       f"it starts in `{where[0] if where else '?'}`")
    assert checked >= 10 and not bad, f"{checked} checked:\n" + "\n".join(bad)
