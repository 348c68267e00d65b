"""A real headless Chromium (Playwright + Debian's chromium) against a running GUI process.

Every tab renders without console errors; a demo run started in the page shows the chart and
the stage strip advancing; Stop and Resume work; the planned steps Apply; Copy copies the ggk
command; the HF token is stored but never shown; the file browser stays in its roots; the
GUI's own token: refused without it, and the printed ?token= address opens the page. The
screenshots of each tab are what the README shows: set GGUF_TRAINER_SCREENSHOT_DIR=docs to
refresh them (default: the test's tmp folder).

Chromium: `apt-get install -y chromium` (CI's .ci/run does it). Missing, the test fails
with that sentence; it is never skipped.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from gui_helpers import CHROMIUM, CHROMIUM_ARGS, demo_project, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slow]
TOKEN = "hf_BROWSERtokenNEVERshown0123456789"
TABS = ("Setup", "Train", "Hardware", "Logs", "Output")


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"Chromium not found at {CHROMIUM}: install it with `apt-get install -y chromium` "
            "(or point GGUF_TRAINER_CHROMIUM at a chromium binary)",
            pytrace=False,
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "the playwright package is missing: pip install playwright (Chromium itself "
            "comes from apt: apt-get install -y chromium)",
            pytrace=False,
        )

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(gui_base) -> Path:
    out = Path(os.environ.get("GGUF_TRAINER_SCREENSHOT_DIR") or gui_base / "shots")
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture
def page(browser, gui):
    """A page whose browser holds the GUI's token cookie (as after the printed address)."""
    yield from _page(browser, gui, with_cookie=True)


@pytest.fixture
def bare_page(browser, gui):
    """A page whose browser has never seen the token."""
    yield from _page(browser, gui, with_cookie=False)


def _page(browser, gui, with_cookie: bool):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=gui.url.rstrip("/"))
    if with_cookie:
        ctx.add_cookies([gui.cookie()])
    pg = ctx.new_page()
    # a busy machine serves the GUI slowly: Playwright's waits are bounds on a hang, not speed
    pg.set_default_timeout(120_000)
    pg.errors = []
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    yield pg
    ctx.close()


def tab(pg, name):
    pg.get_by_role("tab", name=name).click()


def stage_text(pg, stage):
    return pg.locator(f"#stage-{stage}").inner_text()


def lines_drawn(pg, plot: str) -> bool:
    """Vega draws each series as an SVG path; an empty or missing `d` is no line."""
    paths = pg.locator(f"{plot} .mark-line path")
    return paths.count() > 0 and len(paths.first.get_attribute("d") or "") > 10


def steps_box(pg):
    return pg.locator("#steps-box textarea, #steps-box input").first


def no_error_badge(pg) -> bool:
    """Gradio's red "Error" pill on an event's outputs (it stays until they next update)."""
    return pg.get_by_text("Error", exact=True).count() == 0


def train_step(pg) -> int | None:
    m = re.search(r"(\d+)/(\d+) steps", stage_text(pg, "train"))
    return int(m.group(1)) if m else None


@pytest.fixture(scope="module")
def demo_root(gui) -> Path:
    """`gguf-trainer demo --no-run`, switched to the mock teacher (MOCK is labelled)."""
    from gguf_trainer.runner import control

    root = demo_project(gui.env, gui.base / "projects" / "demo_browser", steps=2000)
    small = {
        "precompute.mock_teacher": True,
        "corpus.n_train": 96,
        "corpus.n_val": 16,
        "precompute.shard_size": 32,
        "precompute.val_shard_size": 16,
    }
    assert control.update_settings(root, small, None).ok
    return root


def test_gui_run_stop_resume_copy_and_screenshots(page, gui, shots, demo_root):
    from gguf_trainer.runner import control

    pg = page
    root = demo_root
    pg.goto(f"{gui.url}?project={root}")
    wait_for(lambda: str(root) in pg.locator("#header").inner_text(), 300, "the project to open")
    for name in TABS:  # every tab renders
        tab(pg, name)
        pg.wait_for_timeout(600)
    tab(pg, "Hardware")
    wait_for(lambda: "Versions" in pg.locator("#hw-text").inner_text(), 300, "the hardware tab")
    # torch's facts come from a subprocess; they appear without pressing Refresh
    wait_for(lambda: "CUDA available" in pg.locator("#hw-text").inner_text(), 300, "torch's facts")

    # start the demo from the page: the stage strip advances and the chart fills. Every wait
    # is for a state; its deadline only bounds a hang, so it is generous for a busy machine.
    tab(pg, "Train")
    pg.locator("#btn-start").click()
    wait_for(lambda: (train_step(pg) or 0) >= 1, 900, "training to begin", every_s=0.5)
    first = train_step(pg)
    wait_for(lambda: (train_step(pg) or 0) > first, 300, "the step count to advance")
    assert "stage-done" in pg.locator("#stage-corpus").get_attribute("class")
    assert "stage-running" in pg.locator("#stage-train").get_attribute("class")
    assert "MOCK" in pg.locator("#train-banner").inner_text()
    wait_for(lambda: lines_drawn(pg, "#loss-plot"), 300, "the loss chart's line")
    wait_for(lambda: lines_drawn(pg, "#cos-plot"), 300, "the cosine chart's lines")
    wait_for(lambda: "loss" in pg.locator("#train-metrics").inner_text(), 300, "current metrics")

    # Stop: "stopping…" until the run has ended, then Resume
    pg.locator("#btn-stop").click()
    wait_for(lambda: "STOPPED" in pg.locator("#train-banner").inner_text(), 300, "the run to stop")
    stopped_at = train_step(pg)
    assert pg.locator("#btn-start").inner_text().strip() == "Resume"
    assert pg.locator("#btn-stop").is_disabled()
    pg.locator("#btn-start").click()
    wait_for(
        lambda: "RUNNING" in pg.locator("#train-banner").inner_text(), 300, "the run to resume"
    )
    wait_for(lambda: (train_step(pg) or 0) > stopped_at, 300, "training to continue after resume")

    # planned steps, by state and not by speed: stop, plan two steps past the step the run
    # stopped at (read from status), Apply, Resume: it ends there, then export and eval
    pg.locator("#btn-stop").click()
    wait_for(lambda: "STOPPED" in pg.locator("#train-banner").inner_text(), 300, "the second stop")
    target = int(control.status(root)["step"]) + 2
    steps_box(pg).fill(str(target))
    pg.locator("#btn-apply-steps").click()
    wait_for(
        lambda: f"train.steps = {target}" in pg.locator("body").inner_text(), 300, "the steps note"
    )
    pg.locator("#btn-start").click()
    wait_for(lambda: "DONE" in pg.locator("#train-banner").inner_text(), 900, "the run to finish")
    assert "stage-done" in pg.locator("#stage-eval").get_attribute("class")
    # one pair of numbers everywhere (two views of one run once read "5680 / 8000" and
    # "8000/8000" side by side)
    wait_for(
        lambda: f"step {target} / {target}" in pg.locator("#train-banner").inner_text(),
        300,
        "the banner's step counts",
    )
    assert f"{target}/{target} steps" in stage_text(pg, "train")
    assert f"{target} / {target}" in pg.locator("#train-metrics").inner_text()
    assert steps_box(pg).input_value() == str(target)
    assert "ETA" not in stage_text(pg, "train")  # the ETA is shown once, in the progress line
    pg.wait_for_timeout(1500)  # let the chart finish drawing
    strokes = pg.locator("#cos-plot .mark-line path").evaluate_all(
        "ps => ps.map(p => p.getAttribute('stroke'))"
    )
    # the val token rows' centred cosine, train cos and val cos, each coloured
    assert len(strokes) == 3 and all(strokes), strokes
    # all are labelled: the legend is inside the chart's box, not cut off below it
    legend = pg.locator("#cos-plot .role-legend")
    assert all(name in legend.text_content()
               for name in ("val centred cos", "train cos", "val cos"))
    assert (
        legend.bounding_box()["y"] + legend.bounding_box()["height"]
        <= pg.locator("#cos-plot").bounding_box()["y"]
        + pg.locator("#cos-plot").bounding_box()["height"]
    )
    pg.screenshot(path=str(shots / "gui-train.png"), full_page=True)

    # Output: the ggk command, and Copy puts it on the clipboard
    tab(pg, "Output")
    box = pg.locator("#ggk-command textarea")
    wait_for(lambda: "--llm-adapter" in box.input_value(), 300, "the ggk command")
    pg.locator("#ggk-command button[aria-label='Copy']").click()
    assert pg.evaluate("navigator.clipboard.readText()") == box.input_value()
    wait_for(lambda: "cos" in pg.locator("#out-eval").inner_text(), 300, "the evaluation")
    pg.screenshot(path=str(shots / "gui-output.png"), full_page=True)

    tab(pg, "Logs")
    wait_for(
        lambda: "launch" in pg.locator("#log-text textarea").input_value(), 300, "the pipeline log"
    )
    gap = (
        "(() => { const t = document.querySelector('#log-text textarea'); "
        "return t.scrollHeight - t.scrollTop - t.clientHeight; })()"
    )
    wait_for(lambda: pg.evaluate(gap) < 5, 300, "the log to show its end")
    pg.screenshot(path=str(shots / "gui-logs.png"), full_page=True)
    pg.locator("#log-which").get_by_text("Training progress").click()
    wait_for(
        lambda: re.search(r"step \d+: loss", pg.locator("#log-text textarea").input_value()),
        300,
        "the training progress lines",
    )
    tab(pg, "Hardware")
    pg.screenshot(path=str(shots / "gui-hardware.png"), full_page=True)

    # Setup: the HF token goes to huggingface_hub's store and is never shown back
    tab(pg, "Setup")
    pg.locator("#hf-token input").fill(TOKEN)
    pg.locator("#btn-token").click()
    wait_for(
        lambda: "token is stored" in pg.locator("#token-md").inner_text(), 300, "the token status"
    )
    token_file = Path(gui.env["HF_HOME"]) / "token"
    assert token_file.read_text() == TOKEN
    assert pg.locator("#hf-token input").input_value() == ""
    pg.reload()
    wait_for(lambda: str(root) in pg.locator("#header").inner_text(), 300, "the reload")
    assert TOKEN not in pg.content()
    pg.screenshot(path=str(shots / "gui-setup.png"), full_page=True)

    # Start on a finished project starts nothing: it says so and offers more steps
    tab(pg, "Train")
    pg.locator("#btn-start").click()
    wait_for(lambda: "already done" in pg.locator("body").inner_text(), 300, "the done notice")
    offered = target + 1000
    wait_for(lambda: steps_box(pg).input_value() == str(offered), 300, "the offered steps")
    assert "DONE" in pg.locator("#train-banner").inner_text()
    assert pg.errors == [], pg.errors


def test_file_browser_and_field_errors(page, gui, demo_root):
    from gguf_trainer.runner import control

    pg = page
    root = demo_root
    control.kill(root)  # a run the test before left behind (it failed mid-run) is not inherited
    pg.goto(f"{gui.url}?project={root}")
    wait_for(lambda: str(root) in pg.locator("#header").inner_text(), 300, "the project to open")
    pg.locator("#browse-materials-student-path").click()  # a field far below the project box
    wait_for(lambda: pg.locator("#fb-entries").first.is_visible(), 300, "the file browser")
    wait_for(
        lambda: "pig_clip-tiny-f16.gguf" in pg.locator("#fb-entries").inner_text(),
        300,
        "the listing",
    )
    # it opens in view, saying which field asked (not off-screen by the project box)
    box = pg.locator("#file-browser").first.bounding_box()  # (Gradio repeats the id inside)
    assert 0 <= box["y"] < 1000 - 200 and 0 <= box["x"] < 1400, box
    use = pg.locator("#fb-use").bounding_box()
    assert 0 <= use["y"] and use["y"] + use["height"] <= 1000, use  # its button is on screen
    pg.locator("#fb-use").click(trial=True, timeout=60_000)  # and nothing covers it
    assert "student" in pg.locator("#fb-for").inner_text().lower()
    folder = pg.locator("#fb-folder textarea, #fb-folder input").first
    folder.fill("/etc")
    folder.press("Enter")
    wait_for(
        lambda: "outside the browse roots" in pg.locator("#fb-msg").inner_text(), 300, "the refusal"
    )
    assert pg.locator("#fb-entries input").count() == 0  # the old listing is gone, not left to pick
    assert "passwd" not in pg.locator("#fb-entries").inner_text()
    pg.locator("#file-browser").get_by_role("button", name="Close").click()

    # Materials: where each came from, and Replace with a checked copy (a demo's files must
    # never be linked into a real project without a word)
    student_row = pg.locator("#materials-md tr", has_text="Student: pig_clip GGUF")
    assert "in the project folder" in student_row.inner_text()
    pg.locator("#replace-path textarea, #replace-path input").first.fill(
        str(root / "README-none.gguf")
    )
    pg.locator("#btn-replace").click()
    wait_for(lambda: "does not exist" in pg.locator("body").inner_text(), 300,
             "the refused replace")
    assert no_error_badge(pg)

    # Reset… lists exactly what would be deleted (the dry run) before anything is
    tab(pg, "Train")
    had_checkpoints = (root / "checkpoints").is_dir()
    pg.get_by_text("Reset…", exact=True).first.click()
    pg.locator("#btn-reset").click()
    wait_for(
        lambda: "deletes exactly" in pg.locator("#reset-plan").inner_text(), 300, "the reset plan"
    )
    assert ("checkpoints" in pg.locator("#reset-plan").inner_text()) == had_checkpoints
    pg.get_by_role("button", name="Cancel").click()
    assert (root / "checkpoints").is_dir() == had_checkpoints  # nothing deleted
    tab(pg, "Setup")

    # the memory pre-flight of the saved settings, asked in a subprocess (the GUI has no torch)
    pg.locator("#btn-preflight").click()
    try:
        wait_for(
            lambda: "Pre-flight: fits" in pg.locator("#preflight-md").inner_text(),
            300,
            "the pre-flight",
        )
    except AssertionError as e:  # say what the page showed instead
        raise AssertionError(
            f"{e}; it shows {pg.locator('#preflight-md').inner_text()!r}"
        ) from None

    # an invalid value is refused next to its field, nothing else is lost
    width = pg.locator("#f-train-width input")
    width.fill("100")
    pg.locator("#btn-save").click()
    wait_for(lambda: "⚠" in pg.locator("#f-train-width").inner_text(), 300, "the field error")
    assert "100 is not a multiple of 64" in pg.locator("#f-train-width").inner_text()
    assert "field-error" in pg.locator("#f-train-width").get_attribute("class")  # the error style
    assert no_error_badge(pg)
    assert pg.errors == [], pg.errors


def test_create_a_project_in_the_page(bare_page, gui):
    """Opened as a user does: the bare address is refused, the printed ?token= one opens it
    (the cookie set, the token gone from the address bar)."""
    from gguf_trainer.ui import gui_token

    pg = bare_page
    res = pg.goto(gui.url)
    assert res.status == 401 and "needs its token" in pg.locator("body").inner_text()
    # the 401 page's own console lines, its favicon's too: on a busy machine that request
    # ended after the clear and read as an error of the page that follows
    pg.wait_for_load_state("networkidle")
    pg.errors.clear()
    pg.goto(gui_token.with_token(gui.url, gui.token))
    assert pg.url == gui.url  # redirected to the bare address
    cookie = {c["name"]: c for c in pg.context.cookies()}[gui_token.cookie_name(gui.port)]
    assert cookie["value"] == gui.token and cookie["httpOnly"] and cookie["sameSite"] == "Lax"
    wait_for(lambda: pg.locator("#btn-create").is_visible(), 300, "the page")
    parent = gui.base / "projects"
    pg.locator("#new-parent textarea, #new-parent input").first.fill(str(parent))
    pg.locator("#new-name textarea, #new-name input").first.fill("made_in_page")
    pg.locator("#btn-create").click()
    wait_for(
        lambda: str(parent / "made_in_page") in pg.locator("#header").inner_text(),
        300,
        "the new project to open",
    )
    assert (parent / "made_in_page" / "project.json").is_file()
    pg.locator("#btn-create").click()  # again: refused with the sentence, nothing overwritten
    wait_for(
        lambda: "already holds a project" in pg.locator("body").inner_text(), 300, "the refusal"
    )
    assert no_error_badge(pg)  # one warning toast, no red badge left on the Setup parts
    assert pg.errors == [], pg.errors


def test_toasts_replace_each_other_and_the_render_box_fits_the_pack(page, gui, demo_root):
    """Issue 31 item 7/8: Gradio gathers the toasts of one kind in one box, "Info (2)",
    "(3)", each under the last: a press's toast replaces the one before (the newest alone, no
    count), its lines are lines and its brackets text; the Render box's placeholder files
    field shows only for a pack whose command has placeholders (PixArt's has none)."""
    from gguf_trainer.runner import control

    pg = page
    root = demo_root
    control.kill(root)
    pg.goto(f"{gui.url}?project={root}")
    wait_for(lambda: str(root) in pg.locator("#header").inner_text(), 300, "the project to open")
    tab(pg, "Output")
    wait_for(lambda: pg.locator("#render-status").inner_text().strip() != "", 300,
             "the render box to say what it needs")
    wait_for(lambda: not pg.locator("#render-files").is_visible(), 300,
             "the placeholder box to hide (PixArt's command has no placeholder)")
    assert "choose it" not in pg.locator("#render-status").inner_text()
    assert "--models" not in pg.locator("#render-status").inner_text()  # the GUI's field words
    save = pg.locator("#btn-render-save")

    def press_and_wait(what):
        """Click Save and wait for a toast not on the page before (its box may have closed
        since the last one: counting the box's items waited forever on a busy machine)."""
        pg.evaluate("() => document.querySelectorAll('.toast-message-item')"
                    ".forEach(e => { e.dataset.seen = '1'; })")
        save.click()
        wait_for(lambda: pg.locator(".toast-message-item:not([data-seen])").count() >= 1, 300,
                 what)

    for n in range(3):  # three presses, three "nothing changed" toasts of one kind
        press_and_wait(f"toast {n + 1}")
    shown = [t for t in pg.locator(".toast-message-text").all() if t.is_visible()]
    assert len(shown) == 1 and "nothing changed" in shown[0].inner_text()
    assert not any(c.is_visible() for c in pg.locator(".toast-count").all())  # no "(3)"
    # Gradio closed a kind's box 10 s after its FIRST toast: a toast 7 s later was gone 3 s
    # after it came. Each box now stays 10 s after its newest toast (app.TOAST_JS).
    wait_for(lambda: pg.locator(".toast-message-item").count() == 0, 300, "the toasts to close")
    press_and_wait("the first toast")
    first = time.monotonic()
    time.sleep(7)
    press_and_wait("the second toast")
    time.sleep(max(0.0, first + 12 - time.monotonic()))  # past the first toast's 10 s
    assert any(t.is_visible() for t in pg.locator(".toast-message-text").all())
    wait_for(lambda: pg.locator(".toast-message-item").count() == 0, 300, "the box to close")
    # a toast's lines and brackets, as common.info hands them to Gradio (which sets HTML)
    from gguf_trainer.ui.common import toast_html

    text = pg.evaluate("h => { const d = document.createElement('div'); d.innerHTML = h; "
                       "document.body.appendChild(d); const t = d.innerText; d.remove(); "
                       "return t; }", toast_html("• a <b.gguf>\n• c"))
    assert text.splitlines() == ["• a <b.gguf>", "• c"]
    assert pg.errors == [], pg.errors
