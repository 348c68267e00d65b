"""The demo's prompt corpus: subject x style x setting, generated, no download.

`gguf-trainer demo`, the tiny teachers' tokenizers (trained on these prompts) and the tests
all use the same list, so a tiny tokenizer knows every word the demo sends it.
"""

from __future__ import annotations

import itertools
import random

_SUBJECTS = ["a red fox", "an old lighthouse", "a bowl of ramen", "a cyberpunk street",
             "a snowy cabin", "a golden retriever", "a vintage car", "a koi pond",
             "a desert caravan", "a glass teapot", "a robot gardener", "a medieval castle",
             "a sleeping cat", "a hot air balloon", "a mountain lake", "a jazz musician"]
_STYLES = ["oil painting", "watercolor", "35mm photo", "pixel art", "pencil sketch",
           "studio lighting", "low-poly render", "anime style", "ukiyo-e print", "neon glow"]
_SETTINGS = ["at sunset", "in the rain", "under a full moon", "in autumn", "at dawn", "in fog",
             "on a busy morning", "in winter"]


def demo_prompts(n: int = 420, seed: int = 7) -> list[str]:
    """A varied prompt corpus of our own: subject × style × setting, with a few long tails."""
    combos = [f"{a}, {b}, {c}" for a, b, c in itertools.product(_SUBJECTS, _STYLES, _SETTINGS)]
    rng = random.Random(seed)
    rng.shuffle(combos)
    out = combos[:n]
    for i in range(0, len(out), 9):  # heavy tail: some prompts several times longer
        out[i] = out[i] + ", " + ", ".join(rng.sample(_STYLES + _SETTINGS, 6)) + ", highly detailed"
    return out
