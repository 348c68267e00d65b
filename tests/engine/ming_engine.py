"""The engine tier's Ming-Image drivers (ming_image/, a slot driver: slot_engine.py builds it in
the tier's cache): ming_probe, talked to one command per line by test_ming_teacher_engine.py,
test_ming_adapter_engine.py and test_check_slots_engine.py; ming_vision_probe (the vision
companion read as --llm_vision), run by test_ming_vision_engine.py."""

from __future__ import annotations

from pathlib import Path

import slot_engine

HERE = Path(__file__).resolve().parent / "ming_image"


def build_probe(jobs: int = 2, target: str = "ming_probe") -> Path:
    """`target` (ming_probe, or ming_vision_probe for the vision companion), built in the tier's
    cache (…/<sha>/ming_image) when it lacks it."""
    return slot_engine.build_driver(HERE, target, jobs)


class Probe(slot_engine.Probe):
    """ming_probe over a text encoder file and/or an adapter file ("-" for none)."""

    def __init__(self, binary: Path, te: Path | str = "-", adapter: Path | str = "-"):
        super().__init__(binary, te, adapter)
