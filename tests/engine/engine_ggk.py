#!/usr/bin/env python3
"""A `ggk` for render tests of the PixArt path whose conditioning dumps come from the engine's
own code (built by engine_build.py), not from a formula: with `--llm S --llm-adapter A` and
SD_DUMP_COND set it writes what ggk 0.9.7's PixArt branch writes (engine-contract §4b):

  t5_ids.txt       the T5 window of the adapter's slot count, from the probe's `pixart` command
                   (PixArtT5Embedder's T5UniGramTokenizer over the vocabulary ggk embeds)
  qwen_hidden.bin  the student's final-norm states on the probe's student ids (pig_clip run by
                   this tool: the engine's Qwen3 graph is not part of the tier's build)
  adapter_out.bin  the adapter GGUF read by the engine's ModelLoader and run by its
                   LLMAdapter::AdapterRunner (adapter_probe) on those states and ids, every
                   slot, pads included

and a small PNG at `-o` for every run; `--t5xxl` (the teacher) writes no dump, as ggk's T5
branch writes none. ENGINE_PROBE, ENGINE_ADAPTER_PROBE: the built drivers; STAND_IN_TOKENIZER:
the student's tokenizer folder (the real ggk reads it from the GGUF).
"""

import os
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path


def arg(flag):
    return sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv else None


def png(path: Path, rgb: tuple) -> None:
    def chunk(kind, data):
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    raw = b"".join(b"\0" + bytes(rgb) * 8 for _ in range(8))
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 8, 8, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def probe_ids(window: int, prompt: str) -> tuple[list[int], list[int]]:
    """(student ids, T5 window) the engine's PixArtT5Embedder makes of `prompt`."""
    text = prompt.encode("utf-8").hex() or "-"
    res = subprocess.run(
        [os.environ["ENGINE_PROBE"]], input=f"pixart {window} {text}\n", capture_output=True,
        text=True, check=True, timeout=120,
    )
    student, t5 = res.stdout.splitlines()[0].split(" | ")
    return [int(x) for x in student.split()], [int(x) for x in t5.split()]


def dump_adapter(out: Path, prompt: str) -> None:
    import numpy as np
    import torch

    from gguf_trainer.model.adapters import load_gguf
    from gguf_trainer.model.student import load_student

    adapter = Path(arg("--llm-adapter"))
    window = load_gguf(adapter).config.num_queries
    student_ids, t5_ids = probe_ids(window, prompt)
    student = load_student(arg("--llm"), os.environ["STAND_IN_TOKENIZER"])
    x = torch.tensor([student_ids])
    with torch.no_grad():
        hidden = student.hidden(x, torch.ones_like(x))[0].float().numpy().astype("<f4")
    hidden.tofile(out / "qwen_hidden.bin")
    (out / "t5_ids.txt").write_text("".join(f"{i}\n" for i in t5_ids))
    with tempfile.TemporaryDirectory() as tmp:
        h, ids = Path(tmp) / "h.bin", Path(tmp) / "ids.txt"
        hidden.tofile(h)
        ids.write_text("".join(f"{i}\n" for i in t5_ids))
        subprocess.run(
            [os.environ["ENGINE_ADAPTER_PROBE"], str(adapter), str(out / "adapter_out.bin"),
             "--hidden", str(h), str(len(student_ids)), "--ids", str(ids)],
            check=True, timeout=300,
        )
    rows = np.fromfile(out / "adapter_out.bin", "<f4").size
    print(f"engine ggk: adapter_out.bin {rows} floats for {len(student_ids)} student tokens")


def main() -> int:
    prompt = arg("-p") or ""
    is_adapter = "--llm-adapter" in sys.argv
    print(f"engine ggk: {'adapter' if is_adapter else 'teacher'} prompt={prompt!r}")
    png(Path(arg("-o")), (200, 40, 40) if is_adapter else (40, 40, 200))
    dump = os.environ.get("SD_DUMP_COND")
    if dump and is_adapter:
        dump_adapter(Path(dump), prompt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
