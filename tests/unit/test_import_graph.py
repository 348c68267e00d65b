"""The import graph (style.md §1): stages are siblings over libraries, and the light paths
(CLI, control API, stage list) load neither torch nor transformers."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import gguf_trainer

PKG = Path(gguf_trainer.__file__).parent
STAGE_MODULES = ("corpus", "precompute", "train", "outputs", "evaluate")
LIBRARIES = ("materials", "hardware", "checkpoints", "scoring", "student", "adapters", "shards",
             "metrics", "export", "samples", "stage_list", "paths", "atomic", "errors")
HEAVY = ("torch", "transformers")


def imported_modules(module: str) -> set[str]:
    """Every gguf_trainer module `module` imports, at module level or inside functions."""
    path = PKG / (module.replace(".", "/") + ".py")
    package = ("gguf_trainer." + module).rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out |= {n.removeprefix("gguf_trainer.") for n in names if n.startswith("gguf_trainer.")}
    return out


@pytest.mark.parametrize("module", STAGE_MODULES)
def test_no_stage_imports_another_stage(module):
    others = set(STAGE_MODULES) - {module}
    assert not (imported_modules(module) & others), imported_modules(module) & others


@pytest.mark.parametrize("module", [m for m in LIBRARIES if (PKG / f"{m}.py").exists()])
def test_libraries_import_no_stage(module):
    assert not (imported_modules(module) & set(STAGE_MODULES))


def test_the_graph_reader_sees_imports():
    """The reader above is not vacuous: it finds known edges, lazy ones included."""
    assert {"hardware", "materials", "shards"} <= imported_modules("precompute")
    assert "checkpoints" in imported_modules("outputs")  # imported inside a function


# ---- the whole graph: no circle, the ladder's order, libraries below the runner and the GUI
# The ladder, bottom to top. A module's rung is its package (teachers/, tiny/, packs/, runner/,
# ui/) or, for a top-level module, the set naming it; any other top-level module is a library.
BASE = {"paths", "errors", "atomic", "locks", "exit_codes", "project_file", "places"}
# The project model: modules that read packs (settings schema, materials, corpus sources).
PROJECT_MODEL = {"project_schema", "project", "results", "materials", "discovery", "prompt_presets",
                 "image_sources", "corpus_sources", "instructions", "vision", "check", "render",
                 "demo", "mageflow_demo"}
RUNGS = ("base", "library", "teachers", "packs", "project model", "stages", "runner", "ui/cli")
UPWARD_ALLOWED = 1  # at most one arrow may run back up the ladder


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name ("" is the package itself)."""
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG).with_suffix("").parts)
        if "demo_materials" in parts:  # shipped remote code of a tiny teacher, not ours to import
            continue
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the modules it imports, at module level or inside functions, each resolved
    to the most specific module that exists (`from gguf_trainer import project` is project)."""
    files = module_files()

    def known(name: str) -> str | None:
        while name not in files:
            if not name:
                return None
            name = name.rsplit(".", 1)[0] if "." in name else ""
        return name

    graph = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".") if package else []
                    base = base[: len(base) - node.level + 1]
                    base = ".".join(base + ([node.module] if node.module else []))
                    base = "gguf_trainer" + ("." + base if base else "")
                else:
                    base = node.module or ""
                names = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                if name == "gguf_trainer" or name.startswith("gguf_trainer."):
                    target = known(name.removeprefix("gguf_trainer").removeprefix("."))
                    if target is not None and target != module:
                        out.add(target)
        graph[module] = out
    return graph


def rung(module: str) -> int:
    top = module.split(".")[0]
    name = ("base" if top in BASE or module == "" else
            "teachers" if top in ("teachers", "tiny") else
            "packs" if top == "packs" else
            "project model" if top in PROJECT_MODEL else
            "stages" if top in STAGE_MODULES else
            "runner" if top == "runner" else
            "ui/cli" if top in ("ui", "cli") else "library")
    return RUNGS.index(name)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root, edges in graph.items():
        if root in index:
            continue
        work = [(root, iter(sorted(edges)))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_import_graph_has_no_circle():
    """Function-level imports count: an import inside a function hides a circle from Python,
    not from the reader."""
    found = circles(import_graph())
    assert found == [], "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_circle_finder_finds_circles():
    """Not vacuous: a function-level back edge makes a circle, a chain does not."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_arrows_run_down_the_ladder():
    graph = import_graph()
    up = sorted(f"{a} ({RUNGS[rung(a)]}) -> {b} ({RUNGS[rung(b)]})"
                for a in graph for b in graph[a] if rung(b) > rung(a))
    assert len(up) <= UPWARD_ALLOWED, "imports pointing up the layers:\n" + "\n".join(up)


def test_no_library_module_imports_the_runner_or_the_gui():
    graph = import_graph()
    below = [m for m in graph if rung(m) < RUNGS.index("runner")]
    bad = sorted(f"{m} -> {t}" for m in below for t in graph[m]
                 if t.split(".")[0] in ("runner", "ui", "cli"))
    assert bad == [], bad


def test_the_graph_sees_package_and_function_level_imports():
    graph = import_graph()
    assert "project" in graph["runner.control"]  # `from gguf_trainer import project`, in functions
    assert "packs.base" in graph["materials"]  # inside a function
    assert {"runner.lock", "runner.ranks"} <= set(graph) and "locks" in graph["runner.lock"]
    # the rungs are in the ladder's order, so a teacher importing a pack would count as up
    assert rung("locks") < rung("student") < rung("teachers.t5") < rung("packs.base") \
        < rung("project") < rung("train") < rung("runner.control") < rung("ui.app") == rung("cli")


def _light_modules() -> list[str]:
    names = ["gguf_trainer.cli", "gguf_trainer.stage_list", "gguf_trainer.exit_codes",
             "gguf_trainer.runner.supervisor", "gguf_trainer.runner.status", "gguf_trainer.project",
             "gguf_trainer.project_schema", "gguf_trainer.results", "gguf_trainer.outputs",
             "gguf_trainer.paths"]
    if importlib.util.find_spec("gguf_trainer.runner.control") is not None:
        names.append("gguf_trainer.runner.control")
    return names


def run_py(code: str, tmp_path: Path) -> dict:
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin",
           "GGUF_TRAINER_PROJECTS": str(tmp_path / "p")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_light_paths_load_no_torch(tmp_path):
    """Importing the CLI, the control API and the stage list, and running light CLI commands
    (help, status of a folder without a project), loads neither torch nor transformers."""
    modules = _light_modules()
    code = f"""
import contextlib, io, json, sys
for name in {modules!r}:
    __import__(name)
from gguf_trainer import cli
for argv in (["--help"], ["status", "--project", {str(tmp_path / "none")!r}]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            cli.main(argv)
        except SystemExit:
            pass
print(json.dumps({{m: m in sys.modules for m in {list(HEAVY)!r}}}))
"""
    loaded = run_py(code, tmp_path)
    assert loaded == {m: False for m in HEAVY}, loaded


MAX_MODULE_LINES = 700  # issue 21: a module that outgrows this holds more than one idea


def test_no_module_outgrows_one_idea():
    sizes = {p.relative_to(PKG).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
             for p in PKG.rglob("*.py")}
    assert sizes, "no modules found"
    too_long = {m: n for m, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not too_long, f"split these modules (over {MAX_MODULE_LINES} lines): {too_long}"
