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


def _light_modules() -> list[str]:
    names = ["gguf_trainer.cli", "gguf_trainer.stage_list", "gguf_trainer.exit_codes",
             "gguf_trainer.runner.supervisor", "gguf_trainer.runner.status", "gguf_trainer.project",
             "gguf_trainer.project_schema", "gguf_trainer.results", "gguf_trainer.outputs",
             "gguf_trainer.paths"]
    if importlib.util.find_spec("gguf_trainer.runner.control") is not None:
        names.append("gguf_trainer.runner.control")
    return names


def run_py(code: str, tmp_path: Path) -> dict:
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "GGUF_TRAINER_PROJECTS": str(tmp_path / "p")}
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
