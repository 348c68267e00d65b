#!/usr/bin/env python3
"""A stand-in for the `ggk` command in render tests: no model runs, but it writes what the
real engine writes (engine-contract §4b): the image at `-o`, and with SD_DUMP_COND set the
conditioning dumps of the path the arguments select:
  --llm S --llm-adapter A  qwen_hidden.bin, adapter_out.bin [L, DIM] and tokens.txt
  --llm T (no adapter)     llm_hidden.bin [L, DIM] and tokens.txt (the full Qwen3-VL teacher)
  --t5xxl F                nothing (ggk's T5 branch writes no dump)
Rows are a fixed function of the prompt and seed; the adapter's are the teacher's plus
noise, so the cosine is known to the test. STAND_IN_SLEEP_S makes it slow (cancel tests);
STAND_IN_FAIL makes it exit 3.
"""

import os
import struct
import sys
import time
import zlib
from pathlib import Path

import numpy as np

DIM = 16


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


def main() -> int:
    if os.environ.get("STAND_IN_FAIL"):
        print("stand-in ggk: failing on purpose")
        return 3
    time.sleep(float(os.environ.get("STAND_IN_SLEEP_S", "0")))
    prompt, seed = arg("-p") or "", int(arg("-s") or 0)
    is_adapter = "--llm-adapter" in sys.argv
    print(f"stand-in ggk: {'adapter' if is_adapter else 'teacher'} prompt={prompt!r} seed={seed}")
    png(Path(arg("-o")), (200, 40, 40) if is_adapter else (40, 40, 200))
    dump = os.environ.get("SD_DUMP_COND")
    if dump:
        ids = [ord(c) for c in prompt]
        teacher = np.random.default_rng(seed).standard_normal((len(ids), DIM)).astype("<f4")
        out = Path(dump)
        if is_adapter:
            noise = np.random.default_rng(seed + 1).standard_normal(teacher.shape).astype("<f4")
            (teacher + 0.3 * noise).astype("<f4").tofile(out / "adapter_out.bin")
            teacher[:, :8].tofile(out / "qwen_hidden.bin")
            (out / "tokens.txt").write_text("".join(f"{i}\n" for i in ids))
        elif "--llm" in sys.argv:
            teacher.tofile(out / "llm_hidden.bin")
            (out / "tokens.txt").write_text("".join(f"{i}\n" for i in ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
