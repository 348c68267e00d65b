"""The pipeline's stages in order, with their titles: the one definition every client reads.

Torch-free and dependency-free on purpose: the CLI, the control API, status and the GUI
import it to list, order and title stages without loading the stage modules. The stage
objects themselves (inputs, done-test, run) live in the stage modules and are gathered by
`gguf_trainer.runner.stages`, which checks that their names equal `STAGES`.
"""

from __future__ import annotations

STAGES: tuple[str, ...] = ("corpus", "precompute_val", "precompute_train", "train", "export", "eval")

STAGE_TITLES: dict[str, str] = {
    "corpus": "Corpus", "precompute_val": "Precompute val", "precompute_train": "Precompute train",
    "train": "Train", "export": "Export", "eval": "Evaluate",
}

# Stages whose outputs are rebuilt by `--force` even when they are done.
FORCEABLE: tuple[str, ...] = ("export", "eval")


def stage_title(name: str) -> str:
    return STAGE_TITLES.get(name, name)
