"""The demo from a non-editable install: `pip install .` into a fresh venv, then
`gguf-trainer demo` run from outside the checkout. This proves the package data (the tiny
demo teachers, the pack files) ships in the wheel, not only in the source tree.

The fresh venv gets the project alone (`--no-deps`); its dependencies (torch & co.) come
from the test environment's site-packages through a plain path line in a `.pth` file. Such
a line adds the folder without running that folder's own `.pth` hooks, so the test
environment's editable install of gguf_trainer cannot shadow the installed copy (the test
checks where the package was imported from).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _site_packages(prefix: Path) -> Path:
    return Path(sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)}))


@pytest.mark.slow
def test_demo_runs_from_a_non_editable_install(tmp_path):
    env_dir = tmp_path / "fresh"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    (_site_packages(env_dir) / "test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HOME"] = str(tmp_path / "home")
    env["GGUF_TRAINER_HOME"] = str(tmp_path / "home" / ".gguf-trainer")
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", str(REPO)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
        check=False,
    )
    assert install.returncode == 0, install.stdout + install.stderr

    where = subprocess.run(
        [str(python), "-c", "import gguf_trainer; print(gguf_trainer.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(env_dir), where  # the installed copy, not the checkout

    demo = subprocess.run(
        # 20 steps, not the default 40: the default run is test_t5_demo's (the same code); this
        # one proves the installed package data and entry point, and 20 steps beat the mean
        [str(env_dir / "bin" / "gguf-trainer"), "demo", "--dir", str(tmp_path / "demo"),
         "--steps", "20"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=900,
        check=False,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    evaluation = json.loads((tmp_path / "demo" / "eval.json").read_text())
    ggufs = list((tmp_path / "demo").rglob("*-f16.gguf"))
    assert any("adapter" in g.name for g in ggufs), ggufs
    # The default demo trains against the tiny real teacher shipped as package data.
    assert evaluation["beats_baseline"] and not evaluation["mock"], evaluation
    print("installed at", where, "demo val cos", evaluation["val_cos"])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-s"]))
