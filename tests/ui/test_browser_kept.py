"""Output tab › Kept steps in a real browser: the rows rendered from the kept steps carry their
own Export and Delete; Delete removes that step's files and its row, the others stay."""

from __future__ import annotations

import json

import pytest
from gui_helpers import wait_for
from test_browser import browser, page, tab  # noqa: F401  (fixtures: the same Chromium page)

from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import control

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_each_kept_step_row_exports_and_deletes_itself(page, gui, gui_base):  # noqa: F811
    root = gui_base / "kept-proj"
    control.new_project(root, "t5xxl_pixart", overrides={"train.history": True})
    paths = ProjectPaths(root)
    paths.history.mkdir(parents=True)
    for step in (500, 1000):
        paths.kept_step(step).write_bytes(b"x" * 1000)
        paths.kept_side(step).write_text(json.dumps({"step": step, "val_cos": 0.5,
                                                     "reason": "schedule"}))
    pg = page
    pg.goto(f"{gui.url}?project={root}")
    wait_for(lambda: str(root) in pg.locator("#header").inner_text(), 300, "the project to open")
    tab(pg, "Output")
    wait_for(lambda: "kept step(s)" in pg.locator("#out-kept").inner_text(), 300, "the table")
    wait_for(lambda: pg.locator("#btn-kept-delete-500").is_visible(), 300, "step 500's row")
    assert pg.locator("#btn-kept-export-1000").is_visible()
    assert "2 kept step(s)" in pg.locator("#out-kept").inner_text()
    pg.locator("#btn-kept-delete-500").click()
    wait_for(lambda: not paths.kept_step(500).exists(), 300, "step 500 to be deleted")
    wait_for(lambda: pg.locator("#btn-kept-delete-500").count() == 0, 300, "its row to go")
    assert pg.locator("#btn-kept-delete-1000").is_visible() and paths.kept_step(1000).exists()
    assert "1 kept step(s)" in pg.locator("#out-kept").inner_text()
    assert not paths.kept_side(500).exists()
    assert pg.errors == [], pg.errors
