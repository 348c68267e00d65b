"""Every file name inside a project folder, in one place (style.md §2).

Other modules never spell these names as literals; they ask a `ProjectPaths`.
Importing this module is cheap: no torch, no pydantic.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path

# Where new projects go by default (the demo, the GUI's New project); materials are searched
# in its projects too (discovery).
PROJECTS_ROOT = Path(
    os.environ.get("GGUF_TRAINER_PROJECTS", "~/gguf-trainer/projects")
).expanduser()

PROJECT_JSON = "project.json"
STATE_JSON = "state.json"
PIPELINE_LOG = "pipeline.log"
METRICS_JSONL = "metrics.jsonl"
LOCK_FILE = "pipeline.lock"
STOP_REQUEST = "stop.request"
SNAPSHOT_REQUEST = "snapshot.request"
SNAPSHOTS_JSON = "snapshots.json"
EXPORTS_JSON = "exports.json"
EVAL_JSON = "eval.json"
SNAPSHOT_JOB_JSON = "snapshot-job.json"
SNAPSHOT_LOG = "snapshot.log"
SNAPSHOT_LOCK = "snapshot.lock"
MANIFEST_JSON = "manifest.json"
HASHES_JSON = "hashes.json"  # sha256 of big input files by path, size and mtime
EXIT_JSON = "exit.json"  # written by the launcher's monitor: how the pipeline process ended
KILLED_JSON = "killed.json"  # written by supervisor.kill before SIGKILL: "the user did it"
SAMPLES_SUFFIX = ".jsonl"  # data/{split}.jsonl: the corpus's sample records (data.samples)
IMAGES_DIR = "images"  # data/images/: the corpus's copies of referenced images, by content hash
CAPTIONS_JSONL = "captions.jsonl"  # data/captions.jsonl: upsampler captions (corpus_captions)
# A stand-in built by the package (demo and test materials) says so, and discovery never links
# it into another project: a snapshot folder holds this file, a student GGUF this string key.
RENDERS_DIR = "renders"  # renders/<time>-s<seed>/: a side-by-side render in the user's ggk
RENDER_JSON = "render.json"  # in each render folder: prompt, seed, command lines, figures
TINY_MARKER = "GGUF_TRAINER_TINY"
TINY_GGUF_KEY = "gguf_trainer.tiny"
COMPANION_KINDS = ("sigvq", "vision")  # <base>_<kind>-f16.gguf beside an export (LLaDA, Ming)
LAST, BEST = "last", "best"  # the two checkpoints: checkpoints/<name>.pt and <name>.json
VISION_PROJ = "vision_proj.safetensors"  # the project's frozen vis_dim -> in_dim map (vision.py)

DATA_DIR = "data"
SHARDS_DIR = "shards"
CHECKPOINTS_DIR = "checkpoints"
MATERIALS_DIR = "materials"
RANKS_DIR = "ranks"  # a launched run's follower ranks: one progress file and one log each
RANK_PREFIX = "rank-"  # ranks/rank-NNNNN.json (progress) and ranks/rank-NNNNN.log
RANK_GLOB = f"{RANK_PREFIX}*.json"
STALE_PREFIX = "checkpoints.stale-"
VERIFIED_JSON = "verified.json"  # in shards/<split>/: shards verified by (size, mtime)
CHECKPOINT_KINDS = ("last", "best")  # checkpoints/<kind>.pt and its summary <kind>.json
HISTORY_DIR = "history"  # checkpoints/history/step<N>.pt + step<N>.json: kept steps
KEPT_PREFIX = "step"  # a kept step's name, `step<N>`; also how `snapshot --checkpoint` names one
# What the tool writes inside each folder a reset deletes (globs relative to that folder, one
# per depth; atomic's ".<name>.*.tmp" files count too). Anything else there is someone
# else's, and reset leaves the whole folder alone (safe_delete.check_owned).
TOOL_FILES = {
    DATA_DIR: (f"*{SAMPLES_SUFFIX}", MANIFEST_JSON, f"{IMAGES_DIR}/*"),
    SHARDS_DIR: ("*/*.safetensors", f"*/{MANIFEST_JSON}", f"*/{VERIFIED_JSON}"),
    CHECKPOINTS_DIR: ("*.pt", "*.json", f"{HISTORY_DIR}/{KEPT_PREFIX}*.pt",
                      f"{HISTORY_DIR}/{KEPT_PREFIX}*.json"),
    RANKS_DIR: (RANK_GLOB, f"{RANK_PREFIX}*.log"),
}


def tool_files_in(rel: str) -> tuple[str, ...] | None:
    """TOOL_FILES for a folder below one of its keys ("shards/val" -> "*.safetensors", ...):
    the globs whose leading components match `rel`'s, with those components cut off."""
    top, *below = rel.split("/")
    globs = TOOL_FILES.get(top)
    if globs is None or not below:
        return globs
    n = len(below)
    return tuple(
        "/".join(parts[n:])
        for parts in (g.split("/") for g in globs)
        if len(parts) > n and all(fnmatch.fnmatchcase(b, q) for b, q in zip(below, parts))
    )


def checkpoint_file(which: str) -> str:
    return f"{which}.pt"


def checkpoint_side_file(which: str) -> str:
    return f"{which}.json"


def kept_name(step: int) -> str:
    """step500: a kept step's file stem (checkpoints/history/step500.pt)."""
    return f"{KEPT_PREFIX}{int(step)}"


def rank_file_name(rank: int, suffix: str = ".json") -> str:
    """rank-00001.json (progress) or, with suffix ".log", rank-00001.log."""
    return f"{RANK_PREFIX}{int(rank):05d}{suffix}"


@dataclass(frozen=True)
class ProjectPaths:
    """Where each file of the project at `root` lives."""

    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root).expanduser().resolve())

    @property
    def project_json(self) -> Path:
        return self.root / PROJECT_JSON

    @property
    def state_json(self) -> Path:
        return self.root / STATE_JSON

    @property
    def pipeline_log(self) -> Path:
        return self.root / PIPELINE_LOG

    @property
    def metrics_jsonl(self) -> Path:
        return self.root / METRICS_JSONL

    @property
    def lock(self) -> Path:
        return self.root / LOCK_FILE

    @property
    def stop_request(self) -> Path:
        return self.root / STOP_REQUEST

    @property
    def snapshot_request(self) -> Path:
        return self.root / SNAPSHOT_REQUEST

    @property
    def snapshots_json(self) -> Path:
        return self.root / SNAPSHOTS_JSON

    @property
    def exports_json(self) -> Path:
        return self.root / EXPORTS_JSON

    @property
    def eval_json(self) -> Path:
        return self.root / EVAL_JSON

    @property
    def snapshot_job_json(self) -> Path:
        return self.root / SNAPSHOT_JOB_JSON

    @property
    def snapshot_log(self) -> Path:
        return self.root / SNAPSHOT_LOG

    @property
    def snapshot_lock(self) -> Path:
        return self.root / SNAPSHOT_LOCK

    @property
    def hashes_json(self) -> Path:
        return self.root / HASHES_JSON

    @property
    def exit_json(self) -> Path:
        return self.root / EXIT_JSON

    @property
    def killed_json(self) -> Path:
        return self.root / KILLED_JSON

    @property
    def data(self) -> Path:
        return self.root / DATA_DIR

    def samples(self, split: str) -> Path:
        return self.root / DATA_DIR / f"{split}{SAMPLES_SUFFIX}"

    @property
    def data_images(self) -> Path:
        return self.root / DATA_DIR / IMAGES_DIR

    @property
    def captions(self) -> Path:
        return self.root / DATA_DIR / CAPTIONS_JSONL

    @property
    def vision_proj(self) -> Path:
        return self.root / VISION_PROJ

    @property
    def shards(self) -> Path:
        return self.root / SHARDS_DIR

    def shard_dir(self, split: str) -> Path:
        return self.root / SHARDS_DIR / split

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS_DIR

    def checkpoint(self, which: str) -> Path:
        return self.root / CHECKPOINTS_DIR / checkpoint_file(which)

    @property
    def history(self) -> Path:
        return self.root / CHECKPOINTS_DIR / HISTORY_DIR

    def kept_step(self, step: int) -> Path:
        return self.history / checkpoint_file(kept_name(step))

    def kept_side(self, step: int) -> Path:
        return self.history / checkpoint_side_file(kept_name(step))

    @property
    def materials(self) -> Path:
        return self.root / MATERIALS_DIR

    @property
    def ranks(self) -> Path:
        return self.root / RANKS_DIR

    def rank_file(self, rank: int) -> Path:
        return self.root / RANKS_DIR / rank_file_name(rank)

    def rank_log(self, rank: int) -> Path:
        return self.root / RANKS_DIR / rank_file_name(rank, ".log")

    def exists(self) -> bool:
        return self.project_json.is_file()
