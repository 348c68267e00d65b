"""The import graph (design.md, "Modules"): the package's folders are the ladder, each imports
only folders below it (function-level imports count), no circle between folders, stages are
siblings, and the light paths (CLI, control API, stage list) load neither torch nor transformers."""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import gguf_trainer

PKG = Path(gguf_trainer.__file__).parent
HEAVY = ("torch", "transformers")
# The ladder, bottom to top: a module's rung is its top folder (a top-level module is its own
# rung). Names on one rung may import each other, but no circle may join them.
LADDER = (
    ("base",),
    ("engine", "model"),
    ("data",),
    ("machine",),
    ("teachers",),
    ("materials", "tiny"),
    ("packs",),
    ("store",),
    ("stages", "check", "demo"),
    ("render",),
    ("runner",),
    ("ui",),
    ("cli",),
)
RUNG = {name: i for i, names in enumerate(LADDER) for name in names}
MAX_TOP_MODULES = 8  # .py files directly in gguf_trainer/, besides __init__ and __main__


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
    to the most specific module that exists (`from gguf_trainer import project` is project).
    A fresh copy of one parse per test run (parsing every module takes seconds; six tests ask)."""
    return {m: set(names) for m, names in _parsed_graph().items()}


@functools.cache
def _parsed_graph() -> dict[str, frozenset[str]]:
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
        graph[module] = frozenset(out)
    return graph


def rung(module: str) -> int:
    """The ladder rung of a module ("" is the package's own __init__, the floor)."""
    return RUNG[module.split(".")[0]] if module else 0


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """top folder -> the top folders its modules import (a top-level module is its own folder)."""
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        top = module.split(".")[0]
        out.setdefault(top, set()).update(
            t.split(".")[0] for t in targets if t and t.split(".")[0] != top
        )
    return out


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


def test_every_module_has_a_rung():
    """A new top folder or top-level module must be placed on the ladder (here and in
    design.md) before it can be imported."""
    unplaced = sorted({m.split(".")[0] for m in import_graph() if m} - set(RUNG))
    assert not unplaced, f"place these on the ladder: {unplaced}"


def test_the_package_top_holds_few_modules():
    top = sorted(p.name for p in PKG.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(top) <= MAX_TOP_MODULES, top


def test_the_import_graph_has_no_circle():
    """Function-level imports count: an import inside a function hides a circle from Python,
    not from the reader."""
    found = circles(import_graph())
    assert found == [], "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_circle_joins_two_folders():
    """Folders on one rung may import each other one way only."""
    found = circles(folder_graph(import_graph()))
    assert found == [], "folder circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_circle_finder_finds_circles():
    """Not vacuous: a function-level back edge makes a circle, a chain does not."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_arrows_run_down_the_ladder():
    graph = import_graph()
    up = sorted(f"{a} -> {b}" for a in graph for b in graph[a] if rung(b) > rung(a))
    assert up == [], "imports pointing up the ladder:\n" + "\n".join(up)


def test_no_stage_imports_another_stage():
    graph = import_graph()
    stages = {m for m in graph if m.startswith("stages.") and m != "stages.stage_list"}
    crossing = sorted(f"{a} -> {b}" for a in stages for b in graph[a]
                      if b in stages and b.split("_")[0] != a.split("_")[0])
    assert crossing == [], crossing


def test_the_graph_sees_package_and_function_level_imports():
    """The reader is not vacuous: it finds known edges, lazy ones included, and the rungs
    are in the ladder's order (a teacher importing a pack would count as up)."""
    graph = import_graph()
    assert "base.locks" in graph["runner.lock"]
    assert "model.checkpoints" in graph["stages.export"] or "data.checkpoints" in graph[
        "stages.export"]  # imported inside a function
    assert "materials.spec" in graph["packs.base"]
    assert rung("base.locks") < rung("model.student") < rung("teachers.t5") \
        < rung("packs.base") < rung("store.project") < rung("stages.train") \
        < rung("runner.supervisor") < rung("ui.app") < rung("cli")
    assert folder_graph({"a.x": {"b.y", "a.z"}, "b.y": set(), "a.z": set()}) == {
        "a": {"b"}, "b": set()}


def _light_modules() -> list[str]:
    names = ["gguf_trainer." + m for m in (
        "cli", "stages.stage_list", "base.exit_codes", "runner.supervisor", "runner.status",
        "store.project", "store.project_schema", "store.results", "stages.export", "base.paths")]
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


MAX_MODULE_LINES = 600  # style.md §5: split by role before 600 lines


def test_no_module_outgrows_one_idea():
    sizes = {p.relative_to(PKG).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
             for p in PKG.rglob("*.py")}
    assert sizes, "no modules found"
    too_long = {m: n for m, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not too_long, f"split these modules (over {MAX_MODULE_LINES} lines): {too_long}"
