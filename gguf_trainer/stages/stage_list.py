"""The pipeline's stages in order, with their titles: the one definition every client reads.

Torch-free and dependency-free on purpose: the CLI, the control API, status and the GUI
import it to list, order and title stages without loading the stage modules. The stage
objects themselves (inputs, done-test, run) live in the stage modules and are gathered by
`gguf_trainer.runner.stages`, which checks that their names equal `STAGES`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from gguf_trainer.base.paths import tool_files_in

log = logging.getLogger(__name__)

STAGES: tuple[str, ...] = (
    "corpus",
    "precompute_val",
    "precompute_train",
    "train",
    "export",
    "eval",
)

STAGE_TITLES: dict[str, str] = {
    "corpus": "Corpus",
    "precompute_val": "Precompute val",
    "precompute_train": "Precompute train",
    "train": "Train",
    "export": "Export",
    "eval": "Evaluate",
}

# The stages by role, for the torch-free clients (the runner names no stage itself; what
# the stage objects declare — distributed, own_ranks_only, skipped_because — is read there).
SHARD_STAGES: tuple[str, ...] = ("precompute_val", "precompute_train")  # student + teacher
TRAINING = "train"  # checkpoints, train.steps, snapshots, the rank files
EXPORTING = "export"  # writes the adapter GGUF from best.pt
EVALUATING = "eval"  # runs the exported GGUF on the val shards

# Stages whose outputs are rebuilt by `--force` even when they are done.
FORCEABLE: tuple[str, ...] = (EXPORTING, EVALUATING)


def shard_stage(split: str) -> str:
    """The stage that writes `split`'s shards ("val" or "train")."""
    return f"precompute_{split}"


def stages_from(name: str) -> tuple[str, ...]:
    """`name` and every stage after it (what redoing `name` redoes)."""
    return STAGES[STAGES.index(name) :]


def stage_title(name: str) -> str:
    return STAGE_TITLES.get(name, name)


class Stopped(Exception):
    """A stop was requested; raised by a stage between units of work, never mid-write."""


class Stage:
    """What each stage module exposes (one instance, `STAGE`; precompute has one per split).

    The loop in `gguf_trainer.runner.stages` calls, in this order:
      make_inputs(project, recorded)   make what the inputs name and are made (a fitted map)
      inputs(project, upstream, recorded) -> dict | None
          what the stage's outputs are made from (its fingerprint); `upstream` maps earlier
          stage names to their fingerprints, `recorded` is the inputs this stage's manifest
          holds (to stand in for materials that are gone once their outputs exist). None =
          not fingerprinted (export, eval: judged by file times).
      recorded_fingerprints(project) -> set | None
                               the inputs fingerprints the outputs record themselves (shard
                               metadata, a checkpoint's train_fp): a lost manifest is rebuilt
                               from them instead of redoing the stage
      check(project, run)      load and validate the new inputs; raise UserError. Runs before
                               anything is invalidated (validate before destroy).
      tidy(project, run)       repair the outputs before the done-test: drop damaged partial
                               outputs (a truncated shard), never make any; on rank 0 only
      is_done(project, run)    outputs exist and are whole (the manifest test is the loop's)
      run(project, report, run) -> "done" | "stopped"
      clear(paths)             remove the outputs (invalidation)
    `run` is the loop's RunContext: .fingerprint (this stage's), .fingerprints, .cache (a dict
    shared by the stages of one pipeline run, e.g. the loaded student), .force.
    Stage modules never import each other; what they share lives in the library modules.
    `inputs` and `is_done` are predicates: they read, and never write, delete or log (repairs
    belong in `tidy` or `run`), so the loop, status and tests may ask them any time.
    """

    name: str = ""
    restart: bool = False  # partial outputs are discarded before a run (else the stage resumes)
    # the manifest is complete from the start (train: checkpoints resume)
    manifest_first: bool = False
    # keys of RunContext.cache this stage uses (kept open while needed)
    shares: tuple[str, ...] = ()
    # Launched on several ranks: rank 0 announces every stage; the followers run the
    # distributed ones with it (the stage's run shares out the work) and wait out the rest.
    distributed: bool = False
    own_ranks_only: bool = False  # only the first N ranks (its `processes` setting) run it

    def skipped_because(self, project) -> str | None:
        """Why the settings turn this stage off (the status detail), or None: it runs."""
        return None

    @property
    def title(self) -> str:
        return stage_title(self.name)

    def inputs(self, project, upstream: dict, recorded: dict | None) -> dict | None:
        return None

    def folder(self, paths):
        """Where the outputs and the manifest live (None: no manifest)."""
        return

    def recorded_fingerprints(self, project) -> set[str] | None:
        """The fingerprints the outputs themselves record, read without loading a model
        (None: the manifest is their only record, or there are no outputs)."""
        return None

    def check(self, project, run) -> None:
        return None

    def tidy(self, project, run) -> None:
        return None

    def make_inputs(self, project, recorded: dict | None) -> None:
        """Make the inputs that are themselves made (precompute: the vision projection fitted
        from the student and the teacher); the loop calls it just before `inputs`."""
        return

    def is_done(self, project, run) -> bool:
        raise NotImplementedError

    def run(self, project, report, run) -> str:
        raise NotImplementedError

    def clear(self, paths) -> None:
        # The one delete rule, as reset follows it (gguf_trainer.base.safe_delete): only inside
        # the project, never through a symlink, only the files the tool writes there
        # (paths.TOOL_FILES); someone's file keeps the folder and is named in the log.
        from gguf_trainer.base.errors import UserError
        from gguf_trainer.base.safe_delete import empty_owned

        folder = self.folder(paths)
        if folder is not None:
            rel = Path(folder).relative_to(paths.root).as_posix()
            verdict = empty_owned(folder, paths.root, tool_files_in(rel) or ())
            if verdict.foreign:
                log.warning(
                    "%s holds %s, which gguf-trainer did not write: it and the folder "
                    "are kept, only the %s stage's own files there were deleted.",
                    folder,
                    verdict.foreign,
                    self.name,
                )
            if verdict.reason:
                raise UserError(
                    f"{folder} {verdict.reason.removesuffix('; left alone')}, so the "
                    f"{self.name} stage cannot be redone there; "
                    "move it away and start again."
                )

    def __repr__(self) -> str:
        return f"<stage {self.name}>"
