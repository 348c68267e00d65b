"""The engine tier's Ming-Image driver (ming_image/ming_probe.cpp, its own CMake project beside the
tier's): build it in the tier's cache and talk to it, one command per line. Shared by
test_ming_teacher_engine.py and test_ming_adapter_engine.py."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from engine_build import SDIST_SHA256, EngineBuildError, cache_root, fetch_sdist, unpack

HERE = Path(__file__).resolve().parent / "ming_image"


def build_probe(jobs: int = 2) -> Path:
    """ming_probe, built in the tier's cache (…/<sha>/ming_image) when it lacks it."""
    for tool in ("cmake", "g++"):
        if shutil.which(tool) is None:
            raise EngineBuildError(f"{tool} is not installed (apt-get install -y cmake g++)")
    root = cache_root() / SDIST_SHA256[:16]
    engine = unpack(fetch_sdist(root), root / "src")
    work = root / "ming_image"
    driver = work / "driver"
    driver.mkdir(parents=True, exist_ok=True)
    for name in ("CMakeLists.txt", "ming_probe.cpp"):
        src, dst = HERE / name, driver / name
        if not dst.is_file() or dst.read_bytes() != src.read_bytes():
            shutil.copyfile(src, dst)
    build = work / "build"
    t0 = time.perf_counter()
    if not (build / "CMakeCache.txt").is_file():
        subprocess.run(["cmake", "-S", str(driver), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                        f"-DENGINE_DIR={engine}"], check=True, stdout=subprocess.DEVNULL)
    res = subprocess.run(["cmake", "--build", str(build), "--target", "ming_probe", "-j",
                          str(jobs)], capture_output=True, text=True, check=False)
    if res.returncode:
        raise EngineBuildError("ming_probe did not build:\n" + res.stdout[-6000:]
                               + res.stderr[-6000:])
    print(f"ming_probe ready in {time.perf_counter() - t0:.1f} s")
    return build / "ming_probe"


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
