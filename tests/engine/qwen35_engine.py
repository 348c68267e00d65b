"""The engine tier's Qwen3.5 bridge drivers (qwen35_bridge/): qwen35_probe (a slot driver,
slot_engine.py: the engine's Qwen35Tokenizer, read_gguf_tokenizer cut verbatim from
model_io/gguf_io.cpp, the MOSS template lines of Qwen35BridgeEmbedder cut verbatim from
conditioner.hpp, LLMAdapter::Qwen35BridgeRunner), used by test_qwen35_bridge_engine.py and
test_check_slots_engine.py; and ref_probe (the bridge's reference-picture preprocessing cut from
conditioner.hpp over core/tensor.hpp, one g++ call), used by test_qwen35_bridge_refs.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

from engine_build import (
    CONDITIONER,
    EngineBuildError,
    _write_if_changed,
    build_root,
    engine_dir,
    source_lines,
)
from slot_engine import Probe, build_driver, find_line, require, struct_start

__all__ = ["Probe", "build_probe", "build_ref_probe"]

HERE = Path(__file__).resolve().parent / "qwen35_bridge"
GGUF_IO = "diffusion/src/model_io/gguf_io.cpp"
STRUCT = "struct Qwen35BridgeEmbedder"


def _cut(engine: Path, file: str, a: int, b: int) -> str:
    """Lines a..b of the pinned `file` under their #line, so the compiler cites the engine."""
    return f'#line {a} "{file}"\n' + "\n".join(source_lines(engine, file, a, b)) + "\n"


def write_cuts(engine: Path, folder: Path) -> None:
    """moss_template.inc (conditioner.hpp: the prompt's first line, then the text, the suffix
    and the encode call of Qwen35BridgeEmbedder::get_learned_condition) and
    read_gguf_tokenizer.inc (gguf_io.cpp), each with its #line."""
    folder.mkdir(parents=True, exist_ok=True)
    cond = (engine / CONDITIONER).read_text(encoding="utf-8").splitlines()
    s = struct_start(cond, STRUCT)
    first = find_line(cond, s, 'std::string prompt = "<|im_start|>user\\n";')
    a = find_line(cond, first, "prompt += text.empty()")
    b = find_line(cond, a, "std::vector<int> slot_tokens = qwen35_tokenizer->encode(prompt")
    if b - a != 4:
        raise EngineBuildError(f"{CONDITIONER}:{a}-{b} is not the MOSS template's end")
    io = (engine / GGUF_IO).read_text(encoding="utf-8").splitlines()
    f0 = find_line(io, 0, "bool read_gguf_tokenizer(")
    f1 = next(i for i in range(f0, len(io)) if io[i] == "}") + 1
    _write_if_changed(folder / "moss_template.inc",
                      _cut(engine, CONDITIONER, first, first) + _cut(engine, CONDITIONER, a, b))
    _write_if_changed(folder / "read_gguf_tokenizer.inc", _cut(engine, GGUF_IO, f0, f1))


def build_probe(jobs: int = 2) -> Path:
    """qwen35_probe, built in the tier's cache (…/<sha>/qwen35_bridge) when it lacks it; its
    Probe is started over one adapter file."""
    return build_driver(HERE, "qwen35_probe", jobs, cuts=write_cuts)


def build_ref_probe() -> Path:
    """ref_probe over bridge_refs.inc: Qwen35BridgeEmbedder's lines from the reference picture's
    width up to (not including) its student->encode_image call."""
    require("g++")
    engine = engine_dir()
    cond = (engine / CONDITIONER).read_text(encoding="utf-8").splitlines()
    s = struct_start(cond, STRUCT)
    a = next(i for i in range(s, len(cond))
             if cond[i].strip() == "const int64_t width  = image.shape()[0];") + 1
    b = next(i for i in range(a, len(cond)) if "student->encode_image(" in cond[i])  # excluded
    work = build_root() / "qwen35_bridge_refs"
    work.mkdir(parents=True, exist_ok=True)
    (work / "bridge_refs.inc").write_text(_cut(engine, CONDITIONER, a, b))
    (work / "ref_probe.cpp").write_bytes((HERE / "ref_probe.cpp").read_bytes())
    out = work / "ref_probe"
    res = subprocess.run(["g++", "-std=c++17", "-O2", f"-I{engine / 'diffusion/src'}",
                          f"-I{work}", str(work / "ref_probe.cpp"), "-o", str(out)],
                         capture_output=True, text=True, check=False)
    if res.returncode:
        raise EngineBuildError("ref_probe did not build:\n" + res.stderr[-6000:])
    return out
