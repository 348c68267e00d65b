"""The engine tier's fixed corpus: 560 prompts and 100 image sizes, the same on every run (a seeded
generator), covering what a tokenizer or parser port gets wrong: plain prompts, trailing
punctuation, the empty prompt, weight syntax, escapes, BREAK, NFC/NFD, full-width text, CJK,
emoji, stray specials, long prompts over every window (T5 120/300, the student's 512) and JSON
captions (Fibo 2.0 cleans and re-dumps a JSON object: empties, scores, structured / short forms,
numbers nlohmann writes its own way, what its parser refuses)."""

from __future__ import annotations

import random
import unicodedata

_WORDS = (
    "a red fox in the snow, sheep in sunglasses portrait of an old lighthouse at dawn koi pond "
    "watercolor misty castle cinematic lighting 35mm photo of a young lady close-up hyper detailed "
    "it's don't we'd they'll I'M YOU'RE x-ray 3d render 1990s 4k 16:9 ratio neon city at night"
)
WORDS = _WORDS.split()
PUNCT = (".", "!", "?", ",", ";", ":", "...", "…", ".\n", " .", "!!", ")", "]", '"', "'")
ODD = (
    "café",
    "cafe\u0301",
    "naïve",
    "Ångström",
    "ｆｕｌｌ ｗｉｄｔｈ",
    "ＡＢＣ１２３",
    "猫が好き",
    "一只戴墨镜的羊",
    "고양이",
    "кот в шляпе",
    "γάτα",
    "😀",
    "🐑🕶️",
    "👩‍🚀",
    "x²",
    "½ cup",
    "٣ cats",
    "a\u00a0b",
    "a\u3000b",
    "tab\there",
    "line\nbreak",
    "  two  spaces  ",
    "<|im_start|>",
    "<|image_pad|>",
    "</s>",
    "<unk>",
    "<think>",
    "<|boi_token|>",
    "ﬁne",
    "Ⅻ",
    "™",
    "\u200b",
    "e\u0301\u0301",
)
WEIGHTED = (
    "(a cat in a hat:1.2)",
    "a (red:1.3) fox",
    "[blurry] castle",
    "((masterpiece)), best quality",
    "(a cat:.)",
    "a \\(literal\\) paren",
    "\\[not weighted\\]",
    "a BREAK b",
    "aBREAK Blue BREAKfast",
    "(unbalanced",
    "smiley :) face",
    "ratio 16:9) wide",
    "(a:1.2.3)",
    "(x:-1.5) [y]",
    "()",
    "[[dim]]",
    "a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).",
    "\\\\ backslash",
    "(nested (deep:2):0.5)",
)

CAPTIONS = (
    (
        '{"short_description":"a red '
        'fox","objects":[],"lighting":{"conditions":"dawn","aesthetic_score":5},'
        '"aesthetic_score":7.5,"preference_score":0.25}'
    ),
    (
        '{"structured_caption":{"short_description":"a cat","text_render":[]},'
        '"edit_instruction":"make it night"}'
    ),
    '{"short_description":"x","text_render":[]}',
    '{"short_description":"","text_render":["",[]]}',
    '{"structured_caption":null}',
    '{"structured_caption":[]}',
    '{"structured_caption":"plain words"}',
    '{"structured_caption":[1,"",{}]}',
    '{"structured_caption":0}',
    '{"a":NaN}',
    '{"a":-Infinity}',
    "[1, 2, 3]",
    '"quoted"',
    "{}",
    '{"edit_instruction":"only"}',
    '{"a":1}{"b":2}',
    '{"x":1E400}',
    '{"objects":[{"description":"","shape":null},{"description":"a hat","tags":["",[]]}],"n":1.0}',
    (
        '{"big":1e20,"e15":1e15,"e16":1e16,"p":1234567890123456.0,"small":1e-05,"s4":0.0001,"neg":-0.0,'
        '"z":0,"f":false,"t":true,"r":123456789.125,"tiny":5e-324,"third":0.3333333333333333}'
    ),
    '{"huge":12345678901234567890123,"u64":18446744073709551615,"i64":-9223372036854775808,"m":-0}',
    (
        '{"short_description":"猫 café","emoji":"🐑",'
        '"esc":"\\u00e9\\n\\t\\"q\\" \\/","ctl":"\\u0001\\u007f"}'
    ),
    '{"lone":"\\ud800"}',
    '{"pair":"\\ud83d\\ude00"}',
    '{"dup":1,"k":2,"dup":3}',
    ' {"padded": "ws"}\n',
    '\ufeff{"bom":"yes"}',
    '{"nested":{"deep":{"deeper":{}}},"keep":[[],[0]]}',
    '{"aesthetic_score":3,"preference_score":2}',
    '{"lighting":{"preference_score":1},"style_medium":"oil"}',
)


def prompts(n: int = 560, seed: int = 17) -> list[str]:
    rng = random.Random(seed)
    out: list[str] = [
        "",
        " ",
        "a",
        ".",
        "a sheep in sunglasses.",
        "a sheep in sunglasses",
        "(a cat in a hat:1.2)",
    ]
    out += list(WEIGHTED) + list(ODD) + list(CAPTIONS)

    def words(k: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(k))

    while len(out) < n:
        kind = len(out) % 8
        if kind == 0:
            p = words(rng.randint(1, 25))
        elif kind == 1:
            p = words(rng.randint(1, 15)) + rng.choice(PUNCT)
        elif kind == 2:
            p = (
                rng.choice(WEIGHTED).replace("cat", words(rng.randint(1, 4)))
                + " "
                + words(rng.randint(0, 6))
            )
        elif kind == 3:
            p = words(rng.randint(0, 6)) + " " + rng.choice(ODD) + " " + words(rng.randint(0, 6))
        elif kind == 4:
            p = unicodedata.normalize(
                rng.choice(("NFC", "NFD", "NFKC", "NFKD")),
                words(3) + " " + rng.choice(ODD) + " café crème",
            )
        elif kind == 5:
            # over 120 and 300 T5 slots; some over 512 student tokens
            p = words(rng.randint(130, 420))
        elif kind == 6:
            p = " BREAK ".join(words(rng.randint(1, 5)) for _ in range(rng.randint(2, 4)))
        else:
            p = (
                rng.choice(ODD)
                + rng.choice(PUNCT)
                + words(rng.randint(0, 8))
                + rng.choice(("", " ", "  "))
            )
        out.append(p)
    return out[:n]


def image_sizes(n: int = 100, seed: int = 23) -> list[tuple[int, int]]:
    """(h, w) pairs: the issue's cases, edges around 384 and 32, and seeded random shapes."""
    rng = random.Random(seed)
    out = [
        (535, 401),
        (592, 78),
        (423, 141),
        (535, 8),
        (384, 384),
        (385, 385),
        (1, 1),
        (16, 16),
        (48, 80),
        (4000, 3000),
        (1000, 1),
        (31, 33),
        (383, 767),
        (768, 1024),
    ]
    while len(out) < n:
        out.append((rng.randint(8, 1600), rng.randint(8, 1600)))
    return out[:n]
