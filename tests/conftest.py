"""Shared fixtures. Everything is built here, offline, from gguf_trainer.tiny (tiny students,
teachers and tokenizers) and a local Hub-protocol server (hub_server.py) for downloads.

The folders: tests/unit mirrors the package's rungs (unit/engine, unit/packs, ...), tests/e2e
runs whole pipelines and demos, tests/engine compares with ggk's own code built from its
source package (the engine tier), tests/ui drives the GUI. Tiers by marker: `pytest` runs
everything the machine can (the README's test command); `-m "not slow"` leaves out the
subprocess runs and the engine tier; `-m browser` needs Chromium; `-m gpu` needs CUDA and is
skipped without it.
"""

from __future__ import annotations

import os
import tempfile

import pytest
from hub_server import hub_server  # noqa: F401 - fixture: a local Hub-protocol server (HF_ENDPOINT)

# Two cores on CI: keep torch from oversubscribing them in every test process.
os.environ.setdefault("OMP_NUM_THREADS", "2")

# Tests never touch the real home: ~/.gguf-trainer/settings.json (auto-resume's memory),
# ~/gguf-trainer/projects (demo's default) and the Hugging Face cache all go to a
# throw-away folder, set before any gguf_trainer module reads them (child processes
# inherit it).
_TEST_HOME = tempfile.mkdtemp(prefix="gguf-trainer-test-home-")
os.environ["HOME"] = _TEST_HOME
os.environ["GGUF_TRAINER_HOME"] = os.path.join(_TEST_HOME, ".gguf-trainer")
os.environ["GGUF_TRAINER_PROJECTS"] = os.path.join(_TEST_HOME, "gguf-trainer", "projects")
os.environ["HF_HOME"] = os.path.join(_TEST_HOME, ".cache", "huggingface")
# The GUI's token (ui/gui_token.py): every GUI a test starts, and every request, browser and
# gradio_client it drives, uses this one (GuiServer.token, .headers).
os.environ["GGUF_TRAINER_TOKEN"] = "gguf-trainer-test-token-0123456789"


@pytest.fixture(scope="session")
def qwen_tokenizer_dir():
    from gguf_trainer.tiny import qwen_tokenizer_dir

    return qwen_tokenizer_dir()


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_materials(tmp_path_factory):
    """A tiny pig_clip-layout student GGUF, its tokenizer/config folder and a prompt file."""
    from gguf_trainer.tiny.prompts import demo_prompts
    from gguf_trainer.tiny.student import (
        tiny_qwen3_config,
        write_tiny_student,
        write_tiny_tokenizer_dir,
    )

    root = tmp_path_factory.mktemp("materials")
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(demo_prompts(120)) + "\n", encoding="utf-8")
    return {
        "student": write_tiny_student(root / "pig_clip-tiny-f16.gguf"),
        "tokenizer": write_tiny_tokenizer_dir(root / "pig-clip-tokenizer", tiny_qwen3_config()),
        "prompts": prompts,
    }
