"""The terminal's view of a run: one tqdm bar per stage and stage warnings above them.

`gguf-trainer run` feeds `ProgressBars` from the pipeline's progress callback (in process,
or read back from state.json for a launched run). A terminal that goes away (SIGHUP) stops
the drawing, never the training.
"""

from __future__ import annotations

import logging
import sys
import time

from gguf_trainer.runner.status import format_eta

# The stage fields shown after a bar (and in `status`): the centred cosine of the DiT's token
# and pad rows (data/dit_rows.py) first, all rows then short and long prompts apart (absent
# where the val set has no prompt of a bucket), the pack's plain headline after it.
SHOWN_FIELDS = ("step", "loss", "val_cc_tokens", "val_cc_tokens_short", "val_cc_tokens_long",
                "val_cc_pads", "val_cc_pads_short", "val_cc_pads_long", "val_cos", "best_val_cos",
                "prompts_per_s", "detail")


def short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def console_log_handler() -> logging.Handler:
    """Warnings from stage code on the terminal (above the bars); the shell's own lines
    ("pipeline failed" ...) stay in pipeline.log, since the CLI prints the outcome itself."""
    handler = TqdmHandler(logging.WARNING)
    handler.addFilter(lambda record: not record.name.startswith("gguf_trainer.pipeline"))
    logging.getLogger().addHandler(handler)
    return handler


class TqdmHandler(logging.Handler):
    def emit(self, record):
        from tqdm import tqdm

        try:
            tqdm.write(f"{record.levelname.lower()}: {record.getMessage()}", file=sys.stderr)
        except OSError:  # the terminal is gone (SIGHUP); the log file still has the line
            pass


class ProgressBars:
    """One tqdm bar per stage, fed by Report's on_change callback (pipeline thread)."""

    def __init__(self):
        self.bars: dict = {}
        self.last_draw: dict[str, float] = {}
        self.enabled = True

    def __call__(self, name: str, stage: dict) -> None:
        if not self.enabled:
            return
        try:
            self._draw(name, stage)
        except OSError:  # the terminal went away (SIGHUP): keep training, stop drawing
            self.enabled = False

    def _draw(self, name: str, stage: dict) -> None:
        from tqdm import tqdm

        bar = self.bars.get(name)
        if stage["status"] != "running":
            if bar is None:
                how = "done earlier" if stage.get("skipped") else stage["status"]
                tqdm.write(f"{name:<17} {how}", file=sys.stderr)
                return
            bar.set_postfix_str(stage["status"], refresh=False)
            if stage.get("done") is not None:
                bar.n = stage["done"]
            bar.close()
            del self.bars[name]
            return
        if bar is None and stage.get("total") is None:
            return  # nothing to draw before the stage knows its size
        if bar is None:
            bar = self.bars[name] = tqdm(desc=f"{name:<16}", total=stage.get("total"),
                                         unit=stage.get("unit") or "it", file=sys.stderr,
                                         dynamic_ncols=True, leave=True,
                                         bar_format="{desc} {percentage:3.0f}%|{bar}| "
                                                    "{n:.4g}/{total_fmt} {unit}{postfix}")
        now = time.monotonic()
        last = stage.get("total") is not None and stage.get("done") == stage.get("total")
        if not last and now - self.last_draw.get(name, 0.0) < 0.2:
            return
        self.last_draw[name] = now
        if stage.get("total") is not None and bar.total != stage["total"]:
            bar.total = stage["total"]
        if stage.get("unit"):
            bar.unit = stage["unit"]
        if stage.get("done") is not None:
            bar.n = stage["done"]
        extra = " ".join(f"{k}={short(stage[k])}" for k in SHOWN_FIELDS
                         if stage.get(k) is not None)
        bar.set_postfix_str(f"ETA {format_eta(stage.get('eta_s'))} {extra}".rstrip(),
                            refresh=False)
        bar.refresh()

    def close(self) -> None:
        for bar in self.bars.values():
            try:
                bar.close()
            except OSError:  # terminal gone
                pass
        self.bars.clear()
