"""The MageFlow demo corpus: small synthetic images and edit instructions (offline, seeded).

Images are flat-coloured scenes with a shape and a gradient, 64–160 px per side, so each
has 4–20 vision tokens after the engine's preprocessing (real images have up to 144); the
mock vision tower sees their colours and layout. Never a training set for a real adapter.

    jsonl = write_demo_corpus(folder, prompts)   # folder/demo_images/*.png +
                                                 # folder/demo_corpus.jsonl
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from gguf_trainer.base.atomic import atomic_path, write_text

SIZES = ((64, 64), (64, 96), (96, 128), (128, 160), (160, 96), (96, 64))  # (h, w)
COLOURS = {"red": (220, 40, 40), "blue": (40, 70, 220), "green": (40, 180, 70),
           "yellow": (235, 210, 40), "purple": (140, 60, 190), "white": (240, 240, 240),
           "black": (20, 20, 20), "orange": (240, 140, 30)}
SHAPES = ("square", "stripe", "circle")
EDITS = ("make it night", "add falling snow", "turn this into a watercolor painting",
         "change the background to a beach at sunset", "make the {shape} {colour}",
         "remove the {shape}", "replace the {shape} with a small bird", "{caption}",
         "{caption}, pixel art", "add a red hat")
TWO_IMAGE = ("combine the two images into one scene", "apply the style of Image 2 to Image 1",
             "put the {shape} from Image 1 into Image 2")
N_IMAGES = 48


def _image(rng: random.Random, h: int, w: int):
    import numpy as np

    bg, fg = rng.sample(sorted(COLOURS), 2)
    shape = rng.choice(SHAPES)
    x = np.empty((h, w, 3), dtype=np.float32)
    x[:] = COLOURS[bg]
    x *= np.linspace(0.6, 1.0, w, dtype=np.float32)[None, :, None]  # a left-to-right gradient
    cy, cx, r = rng.randrange(h), rng.randrange(w), rng.randrange(8, max(9, min(h, w) // 2))
    yy, xx = np.mgrid[0:h, 0:w]
    mask = {"square": (abs(yy - cy) < r) & (abs(xx - cx) < r),
            "stripe": abs(yy - cy) < r // 3,
            "circle": (yy - cy) ** 2 + (xx - cx) ** 2 < r * r}[shape]
    x[mask] = COLOURS[fg]
    return x.clip(0, 255).astype(np.uint8), f"a {fg} {shape} on a {bg} background", shape


def write_demo_corpus(folder, prompts: list[str], seed: int = 5) -> Path:
    from PIL import Image

    folder = Path(folder)
    images_dir = folder / "demo_images"
    images_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    images = []
    for i in range(N_IMAGES):
        h, w = SIZES[i % len(SIZES)]
        pixels, caption, shape = _image(rng, h, w)
        path = images_dir / f"img_{i:03d}.png"
        with atomic_path(path, suffix=".png") as tmp:
            Image.fromarray(pixels).save(tmp, format="PNG")
        images.append((path.relative_to(folder).as_posix(), caption, shape))
    records = [{"text": p} for p in prompts]
    for k in range(len(prompts)):
        rel, caption, shape = images[k % N_IMAGES]
        if k % 10 == 9:  # a few two-image samples
            other = images[(k * 7 + 3) % N_IMAGES][0]
            text = rng.choice(TWO_IMAGE).format(shape=shape)
            records.append({"text": text, "images": [rel, other]})
        else:
            text = rng.choice(EDITS).format(shape=shape, caption=caption,
                                            colour=rng.choice(sorted(COLOURS)))
            records.append({"text": text, "images": [rel]})
    rng.shuffle(records)
    out = folder / "demo_corpus.jsonl"
    write_text(out, "".join(json.dumps(r) + "\n" for r in records))
    return out
