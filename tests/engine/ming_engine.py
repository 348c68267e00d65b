"""The engine tier's Ming-Image driver (ming_image/ming_probe.cpp, its own CMake project beside the
tier's): build it in the tier's cache and talk to it, one command per line. Shared by
test_ming_teacher_engine.py and test_ming_adapter_engine.py; ming_vision_probe (the vision
companion read as --llm_vision) by test_ming_vision_engine.py."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from engine_build import SDIST_SHA256, EngineBuildError, cache_root, fetch_sdist, unpack

HERE = Path(__file__).resolve().parent / "ming_image"


def build_probe(jobs: int = 2, target: str = "ming_probe") -> Path:
    """`target` (ming_probe, or ming_vision_probe for the vision companion), built in the tier's
    cache (…/<sha>/ming_image) when it lacks it."""
    for tool in ("cmake", "g++"):
        if shutil.which(tool) is None:
            raise EngineBuildError(f"{tool} is not installed (apt-get install -y cmake g++)")
    root = cache_root() / SDIST_SHA256[:16]
    engine = unpack(fetch_sdist(root), root / "src")
    work = root / "ming_image"
    driver = work / "driver"
    driver.mkdir(parents=True, exist_ok=True)
    changed = set()
    for name in ("CMakeLists.txt", "ming_probe.cpp", "ming_vision_probe.cpp"):
        src, dst = HERE / name, driver / name
        if not dst.is_file() or dst.read_bytes() != src.read_bytes():
            shutil.copyfile(src, dst)
            changed.add(name)
    build = work / "build"
    t0 = time.perf_counter()
    # a new target is unknown to the old Makefile until the project is configured again
    cache = build / "CMakeCache.txt"
    if (not cache.is_file() or "CMakeLists.txt" in changed
            or (driver / "CMakeLists.txt").stat().st_mtime > cache.stat().st_mtime):
        subprocess.run(["cmake", "-S", str(driver), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                        f"-DENGINE_DIR={engine}"], check=True, stdout=subprocess.DEVNULL)
    res = subprocess.run(["cmake", "--build", str(build), "--target", target, "-j",
                          str(jobs)], capture_output=True, text=True, check=False)
    if res.returncode:
        raise EngineBuildError(f"{target} did not build:\n" + res.stdout[-6000:]
                               + res.stderr[-6000:])
    print(f"{target} ready in {time.perf_counter() - t0:.1f} s")
    return build / target


class Probe:
    """One driver process over a text encoder file and/or an adapter file ("-" for none)."""

    def __init__(self, binary: Path, te: Path | str = "-", adapter: Path | str = "-"):
        self.p = subprocess.Popen([str(binary), str(te), str(adapter)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, encoding="utf-8")
        line = self.p.stdout.readline().split()
        assert line[:1] == ["ready"], line
        self.ready = line

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
