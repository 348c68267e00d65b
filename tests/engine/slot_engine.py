"""What the slot kinds' engine drivers share (qwen35_bridge/ and ming_image/, each its own CMake
project beside the tier's, both including slot_driver.cmake): building one in the tier's cache,
and talking to it one command per line. qwen35_engine.py and ming_engine.py hold each driver's
sources and arguments."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from engine_build import EngineBuildError, build_root, cache_lock, engine_dir

HERE = Path(__file__).resolve().parent
SHARED_CMAKE = HERE / "slot_driver.cmake"
SHARED_HEADER = HERE / "slot_probe.h"  # the probes' shared C++ (ResidentWeights, File, ...)


def require(*tools: str) -> None:
    """One sentence naming the first tool the driver's build lacks."""
    for tool in tools:
        if shutil.which(tool) is None:
            raise EngineBuildError(f"{tool} is not installed (apt-get install -y cmake g++)")


def find_line(lines: list[str], start: int, text: str) -> int:
    """1-based number of the first line at or after `start` (0-based) whose stripped text
    starts with `text`."""
    return next(i for i in range(start, len(lines)) if lines[i].strip().startswith(text)) + 1


def struct_start(lines: list[str], head: str) -> int:
    """0-based index of the line that opens `head` (e.g. "struct Qwen35BridgeEmbedder")."""
    return next(i for i, t in enumerate(lines) if t.startswith(head))


def copy_if_changed(src: Path, dst: Path) -> bool:
    """Copy src over dst unless dst already holds its bytes (keeps make's timestamps); True
    when it copied."""
    if dst.is_file() and dst.read_bytes() == src.read_bytes():
        return False
    shutil.copyfile(src, dst)
    return True


def build_driver(project: Path, target: str, jobs: int = 2,
                 cuts: Callable[[Path, Path], None] | None = None) -> Path:
    """`target` of the CMake project in tests/engine/<project> (its CMakeLists.txt and *.cpp,
    with slot_driver.cmake and slot_probe.h), built in the tier's cache (…/<sha>/<project>) when it
    lacks it. `cuts(engine, folder)` writes the engine lines the sources include into
    <work>/snippets (passed as SNIPPET_DIR). Under the cache's lock (pytest-xdist may run two
    modules building in one folder at once: Ming's four, the bridge's two) and once per process
    and target (a no-op cmake run costs seconds on a loaded 2-core machine; tests ask per case)."""
    key = (project.name, target)
    if key not in _BUILT:
        with cache_lock():
            _BUILT[key] = _build_driver(project, target, jobs, cuts)
    return _BUILT[key]


_BUILT: dict[tuple[str, str], Path] = {}  # (project, target) this process built or found built


def _build_driver(project: Path, target: str, jobs: int,
                  cuts: Callable[[Path, Path], None] | None) -> Path:
    require("cmake", "g++")
    engine = engine_dir()
    work = build_root() / project.name
    defs = [f"-DENGINE_DIR={engine}"]
    if cuts is not None:
        cuts(engine, work / "snippets")
        defs.append(f"-DSNIPPET_DIR={work / 'snippets'}")
    driver = work / "driver"
    driver.mkdir(parents=True, exist_ok=True)
    changed = {src.name for src in (SHARED_CMAKE, SHARED_HEADER, *sorted(project.glob("*.cpp")),
                                    project / "CMakeLists.txt")
               if copy_if_changed(src, driver / src.name)}
    build = work / "build"
    t0 = time.perf_counter()
    # a new target is unknown to the old Makefile until the project is configured again
    cache = build / "CMakeCache.txt"
    if (not cache.is_file() or changed & {"CMakeLists.txt", SHARED_CMAKE.name}
            or (driver / "CMakeLists.txt").stat().st_mtime > cache.stat().st_mtime):
        subprocess.run(["cmake", "-S", str(driver), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                        *defs], check=True, stdout=subprocess.DEVNULL)
    res = subprocess.run(["cmake", "--build", str(build), "--target", target, "-j", str(jobs)],
                         capture_output=True, text=True, check=False)
    if res.returncode:
        raise EngineBuildError(f"{target} did not build:\n" + res.stdout[-6000:]
                               + res.stderr[-6000:])
    print(f"{target} ready in {time.perf_counter() - t0:.1f} s")
    return build / target


class Probe:
    """One driver process over the files it is started with ("-" for none), commands on stdin;
    `ready` is its first line's words (it starts "ready"), every answer a line, none an error."""

    def __init__(self, binary: Path, *files: Path | str):
        self.p = subprocess.Popen([str(binary), *map(str, files)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, encoding="utf-8")
        self.ready = self.p.stdout.readline().split()
        assert self.ready[:1] == ["ready"], self.ready

    def ask(self, line: str) -> str:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline().strip()
        assert out and not out.startswith("error"), (line, out)
        return out

    def ids(self, cmd: str, text: str) -> list[int]:
        out = self.ask(f"{cmd} {text.encode('utf-8').hex() or '-'}")
        return [int(x) for x in out.split()]

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=120)
