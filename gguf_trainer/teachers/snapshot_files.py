"""The weight files of a Hugging Face snapshot folder, from its index or its *.safetensors."""

from __future__ import annotations

import json
from pathlib import Path

from gguf_trainer.base.errors import UserError


def weight_files(root: Path) -> list[str]:
    """The safetensors files the snapshot's `model.safetensors.index.json` names (or every
    *.safetensors in `root` without an index), sorted; UserError for a broken index or none."""
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(
                set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
            )
        except (ValueError, KeyError, AttributeError):
            raise UserError(
                f"{index} is not a weight index; download the snapshot again."
            ) from None
    else:
        files = sorted(p.name for p in root.glob("*.safetensors"))
    if not files:
        raise UserError(f"{root} has no *.safetensors weights; run the download again.")
    return files
