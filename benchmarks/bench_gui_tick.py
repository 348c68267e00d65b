"""GUI polling cost: one timer tick with a 20k-step history ÷ one with a 100-step history.

Each measured tick follows a live run: one new metrics row is appended and state.json is
rewritten (as the trainer does every log interval), then the app's real tick handler runs
and Gradio's own postprocessing of what it returned (the LinePlot DataFrame → JSON, the
Markdown) is applied, i.e. the work the server does before bytes go to the browser. The
first tick after a page load reads the whole history once; that load is reported
separately and not part of the ratio. Target: ratio <= 1.5 (ticks read only new bytes,
thin each series to at most 2,000 points, and re-send a plot only when a kept point was
added).

Times are never asserted. Usage: python benchmarks/bench_gui_tick.py [--ticks N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


def make_project(base: Path, history: int) -> Path:
    from gguf_trainer.base import atomic
    from gguf_trainer.runner.state import empty_state
    from gguf_trainer.store.project import create_project

    root = base / f"p{history}"
    create_project(root, "t5xxl_pixart", overrides={"train.steps": history + 100_000})
    with open(root / "metrics.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(_row(step)) + "\n" for step in range(1, history + 1))
    st = empty_state()
    st.update(status="done", stage="train", step=history, steps=history + 100_000,
              stages={"train": {"status": "done", "done": history, "total": history + 100_000,
                                "unit": "steps"}})
    atomic.write_json(root / "state.json", st)
    return root


def _row(step: int) -> dict:
    row = {
        "step": step,
        "time": 1.7e9 + step,
        "loss": 1.0 / (1 + step * 1e-3),
        "cos": 0.5 + step * 1e-6,
        "lr": 2e-4,
        "steps_per_s": 9.5,
    }
    if step % 10 == 0:
        row["val_cos"] = 0.45 + step * 1e-6
    return row


def find_tick(app):
    for fn in app.fns.values():
        if getattr(fn.fn, "__name__", "") == "tick":
            return fn
    raise SystemExit("the app has no tick handler")


def postprocess(block_fn, outputs) -> None:
    import gradio as gr

    for comp, value in zip(block_fn.outputs, outputs):
        if isinstance(value, dict) and value.get("__type__") == "update":
            continue
        if value is gr.skip() or isinstance(value, type(gr.skip())):
            continue
        comp.postprocess(value)


def measure(app, root: Path, ticks: int) -> tuple[float, float, float]:
    """(first tick after a page load, mean steady tick, median steady tick) in seconds. The
    mean counts the ticks that re-send a plot (every `stride`-th row once thinned)."""
    from gguf_trainer.base import atomic
    from gguf_trainer.ui import live

    block_fn = find_tick(app)
    cur = live.Cursor()
    args = (str(root), cur, "pipeline", False, False)
    t = time.perf_counter()
    postprocess(block_fn, block_fn.fn(*args))
    load = time.perf_counter() - t
    step = json.loads((root / "metrics.jsonl").read_text().rsplit("\n", 2)[-2])["step"]
    times = []
    for i in range(ticks):
        step += 1
        with open(root / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(_row(step)) + "\n")
        st = atomic.read_json(root / "state.json")
        st["step"] = step
        st["stages"]["train"]["done"] = step
        atomic.write_json(root / "state.json", st)
        t = time.perf_counter()
        postprocess(block_fn, block_fn.fn(*args))
        times.append(time.perf_counter() - t)
    return load, statistics.fmean(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ticks", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        os.environ.setdefault("GGUF_TRAINER_HOME", str(base / "home"))
        from gguf_trainer.ui.app import build_app

        app = build_app()
        small, big = make_project(base, 100), make_project(base, 20_000)
        measure(app, small, 20)  # warm-up: imports, caches
        load_s, mean_s, med_s = measure(app, small, args.ticks)
        load_b, mean_b, med_b = measure(app, big, args.ticks)
    print(
        f"page load (first tick): 100 steps {load_s * 1e3:.1f} ms, 20k steps {load_b * 1e3:.1f} ms"
    )
    print(
        f"steady tick over {args.ticks} ticks: 100 steps mean {mean_s * 1e3:.2f} ms (median "
        f"{med_s * 1e3:.2f}), 20k steps mean {mean_b * 1e3:.2f} ms (median {med_b * 1e3:.2f})"
    )
    print(f"ratio 20k ÷ 100 (means) = {mean_b / mean_s:.2f}  (target <= 1.5)")


if __name__ == "__main__":
    main()
