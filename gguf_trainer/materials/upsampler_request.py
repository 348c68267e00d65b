"""FLUX.3's prompt-upsampler request: what `ggk --prompt-upsampler` sends its Qwen3.5 server to
turn a short prompt into the caption FLUX.3 Image Klein was trained on, so that a corpus can
hold the captions its text encoder will read (corpus.caption_endpoint, stages/corpus_captions).

Ported line by line from ggk 0.9.7's `src/ggk/diffuser/pup.py` (which follows Black Forest
Labs' reference flux3/pup.py): temperature 0, top_p 0.95, top_k 20, min_p 0, presence penalty
1.5 for a generation request (t2i) and 0 for an edit (i2i), stop at `<|im_end|>` and
`<|endoftext|>`, thinking off (`chat_template_kwargs.enable_thinking`), the i2i scaffold after
the reference images, each reference RGB over white, resized to the per-count pixel budget on
a 32-pixel grid and sent as JPEG q92; a server context of 20480 (the t2i system prompt alone
is ~11k Qwen tokens). pup.py's max_tokens (3584) is corpus.caption_max_tokens' default.

The system prompts are BFL's `pup_prompts_external_vlm.json` (Apache-2.0), shipped unchanged
with its NOTICE and the license text in flux3_upsampler/ beside this module rather than read
from an installed ggk: gguf-trainer does not depend on ggk (the engine often lives in another
environment or on another machine, or is a build with no Python package), and a corpus must
not change because some ggk was installed or upgraded. The text's sha256 is part of every
cached caption's key (caption_client), so a changed prompt never reuses a caption.

Library code: no projects, no network (caption_client sends the body built here).

    body = chat_body("a red fox", "qwen3.5-9b", max_tokens=512)
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path

PROMPTS_FILE = Path(__file__).with_name("flux3_upsampler") / "pup_prompts_external_vlm.json"

STOP_TOKENS = ["<|im_end|>", "<|endoftext|>"]
MAX_REFERENCES = 10
SAMPLING = {"temperature": 0.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0}
MAX_TOKENS = 3584  # pup.py's SAMPLING["max_tokens"]: corpus.caption_max_tokens' default
PRESENCE_PENALTY = {"t2i": 1.5, "i2i": 0.0}
I2I_SCAFFOLD = ("Reference images follow in order (the first image, the second image, ...).\n"
                "User request: {instruction}\n"
                "Output the caption.")
REFERENCE_MULTIPLE = 32
MAX_ASPECT_RATIO = 200
MAX_PIXELS_BY_REFS = {1: 1024 * 1024, 2: 724 * 724,
                      **{n: 512 * 512 for n in range(3, MAX_REFERENCES + 1)}}
JPEG_QUALITY = 92
CONTEXT_SIZE = 20480  # the server's context pup.py starts it with (the README's server line)
GENERATE_TIMEOUT_S = 900  # pup.py's wait for one caption


@functools.lru_cache(maxsize=1)
def _prompts() -> dict[str, str]:
    return json.loads(PROMPTS_FILE.read_text(encoding="utf-8"))


def system_prompt(task: str) -> str:
    """BFL's system prompt for `task` ("t2i" or "i2i")."""
    return _prompts()[task]


@functools.lru_cache(maxsize=4)
def system_sha256(task: str) -> str:
    """sha256 of the system prompt's UTF-8 text: part of a cached caption's key."""
    return hashlib.sha256(system_prompt(task).encode("utf-8")).hexdigest()


def task_of(images: Sequence) -> str:
    """pup.py's choice: an edit request (i2i) when there are references, else t2i."""
    return "i2i" if images else "t2i"


# ------------------------------------------------------------- references

def reference_size(width: int, height: int, n_refs: int) -> tuple[int, int]:
    """The size a reference is sent at: pup.py's reference_size (ValueError past 200:1)."""
    if max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
        raise ValueError(f"aspect ratio of {width}x{height} exceeds {MAX_ASPECT_RATIO}:1")

    def floor(v):
        return max(REFERENCE_MULTIPLE,
                   math.floor(v / REFERENCE_MULTIPLE) * REFERENCE_MULTIPLE)

    cap = MAX_PIXELS_BY_REFS[min(n_refs, MAX_REFERENCES)]
    w = max(REFERENCE_MULTIPLE, round(width / REFERENCE_MULTIPLE) * REFERENCE_MULTIPLE)
    h = max(REFERENCE_MULTIPLE, round(height / REFERENCE_MULTIPLE) * REFERENCE_MULTIPLE)
    if w * h > cap:
        beta = math.sqrt(width * height / cap)
        w, h = floor(width / beta), floor(height / beta)
    if w * h > cap:
        if w == REFERENCE_MULTIPLE:
            h = floor(cap / w)
        else:
            w = floor(cap / h)
    return w, h


def encode_reference(path: Path, n_refs: int) -> bytes:
    """JPEG bytes of a reference as the upsampler saw it in training (pup.py's
    encode_reference with Pillow): EXIF-transposed, alpha over white, LANCZOS to the budget."""
    from PIL import Image, ImageOps

    with Image.open(path) as opened:
        image = ImageOps.exif_transpose(opened)
        if image.mode in ("RGBA", "LA", "PA") or (
            image.mode == "P" and "transparency" in image.info
        ):
            rgba = image.convert("RGBA")
            image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)),
                                          rgba)
        image = image.convert("RGB")
        size = reference_size(image.width, image.height, n_refs)
        if image.size != size:
            image = image.resize(size, Image.Resampling.LANCZOS)
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


# ------------------------------------------------------------------ the request

def chat_body(prompt: str, model: str, max_tokens: int = MAX_TOKENS,
              images: Sequence[Path] = ()) -> dict:
    """The /v1/chat/completions body pup.py's `upsample` posts, for `model` (the id the server
    lists) and at most `max_tokens` new tokens."""
    task = task_of(images)
    if images:
        content: list[dict] = [
            {"type": "image_url", "image_url": {
                "url": "data:image/jpeg;base64,"
                + base64.b64encode(encode_reference(p, len(images))).decode("ascii")}}
            for p in images
        ]
        content.append({"type": "text", "text": I2I_SCAFFOLD.format(instruction=prompt)})
        user: str | list = content
    else:
        user = prompt
    return {
        "model": model,
        "messages": [{"role": "system", "content": system_prompt(task)},
                     {"role": "user", "content": user}],
        "stream": False,
        "stop": STOP_TOKENS,
        "presence_penalty": PRESENCE_PENALTY[task],
        "chat_template_kwargs": {"enable_thinking": False},
        **SAMPLING,
        "max_tokens": int(max_tokens),
    }


def strip_think(text: str) -> str:
    """The caption without a think block (a template without thinking control can still open
    one; an unclosed one drops the rest), stripped: pup.py's _strip_think."""
    while "<think>" in text:
        start = text.find("<think>")
        end = text.find("</think>", start)
        if end < 0:
            text = text[:start]
            break
        text = text[:start] + text[end + len("</think>"):]
    return text.strip()


def caption_of(reply) -> str:
    """The caption in a chat-completion reply (think block stripped; "" for an empty one).
    ValueError when the reply is not an OpenAI chat completion."""
    try:
        content = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ValueError("no choices[0].message.content") from None
    if content is not None and not isinstance(content, str):
        raise ValueError("choices[0].message.content is not text")
    return strip_think(content or "")
