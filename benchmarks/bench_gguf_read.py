"""Opening a GGUF that carries a 248k-token vocabulary: gguf.GGUFReader vs base/gguf_read.py.

The file is a real qwen35_bridge export (model/export.py, a small adapter) carrying the released
Qwen3.5 vocabulary as tokenizer.ggml.tokens / merges (tiny/qwen35.py: 248,320 tokens, ~247k
merges), the file the bridge demo, inspect and the engine tier read. One run of each reader,
in this order: GGUFReader(path) then read_gguf(path) (open: metadata + tensor table + mapped
views), then each one's tokens and merges as Python lists (what read_adapter's metadata holds),
then read_adapter (inspect's whole read) for reference. The figure is GGUFReader / read_gguf
for the open and for open + lists. Times are never asserted; equality is the unit tests' job
(tests/unit/base/test_gguf_read.py).

Measured (2 cores shared with ~8 busy processes, load ~11, 2026-12-02): the 14.5 MB export opens
in 105.3 s with GGUFReader and 2.50 s with read_gguf (42x; with the two lists 107.4 vs 2.58 s,
41x); read_adapter 2.2 s. On a quieter machine (load ~1): GGUFReader ~16.5 s, read_gguf ~0.3 s.

Effect, same box and load (~8-12), before (efa43d5) / after (that + this reader and
engine_reference's per-file cache), OMP_NUM_THREADS=1: tests/e2e/test_qwen35_bridge_demo.py
811 s / 286 s (demo subprocess 356 / 201 s, the export test 430 / 52 s); `gguf-trainer inspect
--json` on the demo's 30 MB bridge export 115.8 / 8.6 s (identical JSON);
tests/engine/test_qwen35_bridge_engine.py 371 / 78 s (each export's readback and load_gguf).
The Ming demo reads no big metadata array (its vocabulary is a tensor): read_adapter on a
Ling-vocabulary Ming export 0.07 / 0.04 s.

load_gguf's read (the view, then the arrays): two opens (read_adapter(path), then
read_adapter_arrays(path): what load_gguf did before) vs one (open_adapter, both from it: what it
does now), run after the above so both find the file in the page cache; the same view and the
same arrays are asserted. Measured (2 cores shared, load ~8, 2026-12-02, one run): two opens
8.12 s, one open 4.04 s (2.0x) on the 14.5 MB export above.

Usage: python benchmarks/bench_gguf_read.py [--file existing.gguf]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

LISTS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")


def write_bridge_export(dest: Path) -> Path:
    from gguf_trainer.model.adapters import AdapterConfig, build_adapter
    from gguf_trainer.model.export import write_adapter_gguf
    from gguf_trainer.tiny.qwen35 import qwen35_vocabulary

    tokens, merges = qwen35_vocabulary()
    cfg = AdapterConfig("qwen35_bridge", 64, 64, 128, 1, num_queries=8, seed_vocab=len(tokens),
                        seed_rank=8, vis_dim=16)
    write_adapter_gguf(dest, build_adapter(cfg).state_dict(), cfg, metadata={},
                       tokenizer={"tokens": tokens, "merges": merges, "pre": "qwen35"})
    return dest


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def contents(reader, keys) -> list:
    return [reader.fields[k].contents() for k in keys]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", type=Path, help="read this GGUF instead of writing a bridge export")
    args = ap.parse_args()
    import gguf  # imported before any timing: both readers use its constants

    from gguf_trainer.base.gguf_read import read_gguf
    from gguf_trainer.model.adapter_file import open_adapter, read_adapter, read_adapter_arrays

    with tempfile.TemporaryDirectory() as tmp:
        path = args.file or write_bridge_export(Path(tmp) / "bridge.gguf")
        theirs, t_open_theirs = timed(lambda: gguf.GGUFReader(path))
        ours, t_open_ours = timed(lambda: read_gguf(path))
        keys = [k for k in LISTS if k in theirs.fields]
        lists_theirs, t_lists_theirs = timed(lambda r=theirs: contents(r, keys))
        lists_ours, t_lists_ours = timed(lambda r=ours: contents(r, keys))
        assert lists_theirs == lists_ours  # the figure compares equal work
        _, t_inspect = timed(lambda: read_adapter(path))
        (view2, arr2), t_two = timed(lambda: (read_adapter(path), read_adapter_arrays(path)))

        def one_open():
            reader = open_adapter(path)
            return read_adapter(path, reader), read_adapter_arrays(path, reader)

        (view1, arr1), t_one = timed(one_open)
        assert view1 == view2 and arr1.keys() == arr2.keys()
        assert all((arr1[k] == arr2[k]).all() for k in arr1)
        result = {
            "file": str(args.file or "qwen35_bridge export with the Qwen3.5 vocabulary"),
            "bytes": Path(path).stat().st_size,
            "items": {k: len(v) for k, v in zip(keys, lists_ours)},
            "open_s": {"GGUFReader": round(t_open_theirs, 3), "read_gguf": round(t_open_ours, 3)},
            "open_plus_lists_s": {"GGUFReader": round(t_open_theirs + t_lists_theirs, 3),
                                  "read_gguf": round(t_open_ours + t_lists_ours, 3)},
            "read_adapter_s": round(t_inspect, 3),
            "view_plus_arrays_s": {"two_opens": round(t_two, 3), "one_open": round(t_one, 3)},
            "ratio_view_plus_arrays": round(t_two / t_one, 2),
            "ratio_open": round(t_open_theirs / t_open_ours, 1),
            "ratio_open_plus_lists": round((t_open_theirs + t_lists_theirs)
                                           / (t_open_ours + t_lists_ours), 1),
        }
        del theirs, ours  # drop the mappings before the folder goes
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
