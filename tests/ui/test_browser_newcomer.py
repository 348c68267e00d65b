"""Issue 31 items 1-6 in a real headless Chromium, as a first-time user meets them: the pack
description on first load, Download on a pack whose teacher no repo holds, render settings
that survive a reload and a Save, Verify followed to its end, a never-run project's planned
steps following project.json, and a refused Start that saves nothing.

Every wait is for a state the page shows; its deadline only bounds a hang. The GUI runs with
HF_HUB_OFFLINE=1, so the student tokenizer's download ends at once with its own sentence and
nothing reaches the network.
"""

from __future__ import annotations

import json

import pytest
from gui_helpers import CHROMIUM, CHROMIUM_ARGS, GuiServer, demo_project, isolated_env, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def gui(gui_base):
    env = isolated_env(gui_base)
    env["HF_HUB_OFFLINE"] = "1"
    server = GuiServer(gui_base, env=env)
    yield server
    server.stop()
    from conftest import kill_runs

    kill_runs(gui_base)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, gui):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    ctx.add_cookies([gui.cookie()])
    pg = ctx.new_page()
    pg.set_default_timeout(120_000)
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    yield pg
    ctx.close()


@pytest.fixture(scope="module")
def boogu(gui):
    """A new Boogu project: its teacher is "link a local copy" (no public repo holds it)."""
    from gguf_trainer.store.project import create_project

    root = gui.base / "projects" / "boogu_first"
    create_project(root, "qwen3vl_boogu")
    return root


def body(pg) -> str:
    return pg.locator("body").inner_text()


def open_project(pg, gui, root) -> None:
    pg.goto(f"{gui.url}?project={root}")
    wait_for(lambda: str(root) in pg.locator("#header").inner_text(), 300,
             f"the project {root} to open (the header: {pg.locator('#header').inner_text()!r})")


def test_first_load_describes_the_pack_the_picker_shows(page, gui):
    """Item 6: the description was Boogu's while the picker showed PixArt."""
    pg = page
    pg.goto(gui.url)
    wait_for(lambda: pg.locator("#pack-info").inner_text().strip() != "", 300, "the pack info")
    picked = pg.locator("#new-pack input").first.input_value()
    info = pg.locator("#pack-info").inner_text()
    assert "PixArt" in picked and "PixArt" in info and "Boogu" not in info, (picked, info)
    assert pg.errors == [], pg.errors


def test_download_on_a_link_only_pack_says_what_to_link(page, gui, boogu):
    """Item 1: Download ended in `internal error (HFValidationError … '')` on six packs."""
    pg = page
    open_project(pg, gui, boogu)
    row = pg.locator("#materials-md tr", has_text="Teacher")
    wait_for(lambda: "never downloaded" in row.first.inner_text(), 300, "the teacher's row")
    wait_for(lambda: pg.locator("#btn-download").is_enabled(), 300, "Download missing")
    pg.locator("#btn-download").click()
    wait_for(lambda: "never downloaded" in " ".join(
        t.inner_text() for t in pg.locator(".toast-message-text").all()), 300,
        "Download's answer for the teacher")
    text = body(pg)
    assert "internal error" not in text and "HFValidationError" not in text
    assert "interrupted" not in pg.locator("#materials-md").inner_text()
    assert pg.errors == [], pg.errors


def test_render_settings_survive_a_reload_and_a_save(page, gui, boogu):
    """Item 2: the fields were filled once per GUI process; after a reload they looked empty
    and Save wrote the empty fields back, losing both paths."""
    pg = page
    ggk = gui.base / "bin" / "ggk"
    ggk.parent.mkdir(exist_ok=True)
    ggk.write_text("#!/bin/sh\n")
    ggk.chmod(0o755)
    models = gui.base / "models"
    models.mkdir(exist_ok=True)
    open_project(pg, gui, boogu)
    pg.get_by_role("tab", name="Output").click()
    ggk_box = pg.locator("#render-ggk textarea, #render-ggk input").first
    models_box = pg.locator("#render-models textarea, #render-models input").first
    ggk_box.fill(str(ggk))
    models_box.fill(str(models))
    pg.locator("#btn-render-save").click()
    settings = gui.base / "gt_home" / "settings.json"
    wait_for(lambda: settings.is_file() and str(models) in settings.read_text(), 300, "the save")
    pg.reload()
    wait_for(lambda: str(boogu) in pg.locator("#header").inner_text(), 300, "the reload")
    pg.get_by_role("tab", name="Output").click()
    wait_for(lambda: ggk_box.input_value() == str(ggk), 300, "the ggk field to be filled again")
    assert models_box.input_value() == str(models)
    pg.locator("#btn-render-save").click()  # an untouched Save writes nothing back
    wait_for(lambda: "nothing changed" in " ".join(
        t.inner_text() for t in pg.locator(".toast-message-text").all()), 300, "the answer")
    saved = json.loads(settings.read_text())
    assert str(ggk) in json.dumps(saved) and str(models) in json.dumps(saved)
    assert pg.errors == [], pg.errors


def test_verify_is_followed_to_its_end(page, gui):
    """Item 3: the box said "Re-reading every shard…" until Refresh."""
    from gguf_trainer.ui.output_tab import VERIFY_RUNNING

    pg = page
    root = demo_project(gui.env, gui.base / "projects" / "verify_demo", steps=4)
    open_project(pg, gui, root)
    pg.get_by_role("tab", name="Output").click()
    pg.locator("#btn-out-verify").click()
    running = VERIFY_RUNNING.split("\n", 1)[1]
    wait_for(lambda: running in pg.locator("#out-verify").inner_text()
             or "nothing to verify yet" in pg.locator("#out-verify").inner_text(), 300,
             "the verify job to start")
    wait_for(lambda: "nothing to verify yet" in pg.locator("#out-verify").inner_text(), 300,
             f"the verify job's answer without Refresh (shown: "
             f"{pg.locator('#out-verify').inner_text()!r})")
    # a never-run project has nothing to vouch for, and says so
    verdict = pg.locator("#out-verify").inner_text().strip().splitlines()[-1]
    assert verdict.startswith("nothing to verify yet") and "whole" not in verdict, verdict
    assert pg.errors == [], pg.errors


def test_a_never_run_project_follows_its_planned_steps(page, gui, boogu):
    """Item 4: without state.json the Train tab never saw project.json change."""
    from gguf_trainer.runner import control

    pg = page
    open_project(pg, gui, boogu)
    pg.get_by_role("tab", name="Train").click()
    steps = pg.locator("#steps-box textarea, #steps-box input").first
    wait_for(lambda: steps.input_value().strip() != "", 300, "the planned steps")
    new = int(steps.input_value()) + 777
    assert control.update_settings(boogu, {"train.steps": new}, None).ok  # as `set` does
    wait_for(lambda: str(new) in pg.locator("#train-banner").inner_text()
             or steps.input_value() == str(new), 300, "the page to follow project.json")
    assert pg.errors == [], pg.errors


def test_a_refused_start_saves_nothing(page, gui, boogu):
    """Item 5: a stray edit was kept by a Start that then said "Not started"."""
    from gguf_trainer.runner import control

    pg = page
    before = control.read_settings(boogu).values["train"]["lr"]
    open_project(pg, gui, boogu)
    lr = pg.locator("#f-train-lr input").first
    wait_for(lambda: lr.input_value().strip() != "", 300, "the form")
    lr.fill("0.000777")
    pg.get_by_role("tab", name="Train").click()
    wait_for(lambda: pg.locator("#btn-start").is_enabled(), 300, "Start")
    pg.locator("#btn-start").click()
    wait_for(lambda: "Not started" in body(pg), 300, "the refusal")
    assert control.read_settings(boogu).values["train"]["lr"] == before
    assert not (boogu / "state.json").exists() or control.status(boogu)["status"] != "running"
    assert pg.errors == [], pg.errors
