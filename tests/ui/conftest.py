"""GUI test fixtures (helpers in gui_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gui_helpers import GuiServer


@pytest.fixture(scope="module")
def gui_base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gui")


@pytest.fixture(scope="module")
def gui(gui_base):
    server = GuiServer(gui_base)
    yield server
    server.stop()
    kill_runs(gui_base)


def kill_runs(base: Path) -> None:
    """Runs are detached: a failed test must not leave one training in the background."""
    from gguf_trainer.runner import control

    for pj in base.rglob("project.json"):
        try:
            control.kill(pj.parent)
        except Exception as e:  # noqa: BLE001 - best effort cleanup; say what was left
            print(f"could not kill the run of {pj.parent}: {e}")
