"""Build the engine tier's driver from the pinned ggk 0.9.7 source package (CPU, cmake + g++).

The sdist comes from the package registry (`pip download ggk==0.9.7 --no-deps --no-binary :all:`)
and must match SDIST_SHA256; it is unpacked, the driver (probe.cpp) is configured and built in
~/.cache/gguf-trainer-engine/<sha> of the user's real home (GGUF_TRAINER_ENGINE_CACHE overrides
it), so only a
cold cache pays the build. The template code is not retyped: every registered pack's
`engine_template` names the lines of the pinned source that build its template, and those lines
are cut into snippets.inc and compiled into the driver (with LLMEmbedder::tokenize, TOKENIZE_LINES).
A family whose conditioner builds the template in a file of its own (Fibo 2.0: fibo2.hpp's
Fibo2Conditioner) cites that file: its "members" (the helpers the template calls), "lines" (the
statement that builds `prompt`) and "call" (its encode_prompt call, whose arguments are the
template's prompt range, start row and max length) are cut into fibo2_*.inc and compiled into
probe.cpp's Fibo2Probe.

    python tests/engine/engine_build.py       # builds (or finds) the driver, prints its path and
    times
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pwd
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

SDIST = "ggk-0.9.7.tar.gz"
SDIST_SHA256 = "f733df77aa1695576b220f0ad1cddd184773e89e6a5a5b78009cd814bcf48fe7"
ENGINE = "ggk-0.9.7/vendor/engine"
CONDITIONER = "diffusion/src/conditioning/conditioner.hpp"
FIBO2 = "diffusion/src/conditioning/fibo2.hpp"
FIBO2_STRUCT = "struct Fibo2Conditioner"
TOKENIZE_LINES = (2551, 2623)  # LLMEmbedder::tokenize: template pieces, prompt chunks, padding
HERE = Path(__file__).resolve().parent
DRIVER_SOURCES = ("CMakeLists.txt", "probe.cpp", "vocab_shim.cpp", "adapter_probe.cpp",
                  "t5clip_probe.cpp", "t5clip_vocab.cpp", "command_probe.cpp")
KEEP = ("vendor/engine/gk/", "vendor/engine/diffusion/", "vendor/engine/quantizer/src/kernels/")
DRIVERS = ("adapter_probe", "command_probe")  # after the tokenizer driver, each its own target


class EngineBuildError(RuntimeError):
    pass


def cache_root() -> Path:
    """GGUF_TRAINER_ENGINE_CACHE, else ~/.cache/gguf-trainer-engine of the real home (the test
    suite points HOME at a scratch folder; the build must outlive it)."""
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    return Path(
        os.environ.get("GGUF_TRAINER_ENGINE_CACHE", home / ".cache" / "gguf-trainer-engine")
    )


_HELD = [0]  # this process's depth inside cache_lock (re-entered: build_t5clip calls build)


@contextlib.contextmanager
def cache_lock():
    """The cache folder's exclusive lock (fcntl on <cache>/.lock), held while it is fetched,
    unpacked or built: under pytest-xdist two workers' engine modules may ask at once, and the
    second must find the first's build rather than write the same files beside it."""
    if _HELD[0]:
        _HELD[0] += 1
        try:
            yield
        finally:
            _HELD[0] -= 1
        return
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when f closes
        _HELD[0] = 1
        try:
            yield
        finally:
            _HELD[0] = 0


def build_root() -> Path:
    """The cache folder of the pinned sdist: its tarball, unpacked source, snippets and build."""
    return cache_root() / SDIST_SHA256[:16]


def engine_dir() -> Path:
    """vendor/engine of the pinned sdist, fetched and unpacked when the cache lacks it."""
    root = build_root()
    return unpack(fetch_sdist(root), root / "src")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_sdist(folder: Path) -> Path:
    """The pinned sdist in `folder`, downloaded from the registry when absent; refused when its
    sha256 is not the pinned one."""
    with cache_lock():
        return _fetch_sdist(folder)


def _fetch_sdist(folder: Path) -> Path:
    path = folder / SDIST
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "ggk==0.9.7",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
                str(folder),
                "--quiet",
            ],
            check=True,
        )
    got = _sha256(path)
    if got != SDIST_SHA256:
        raise EngineBuildError(f"{path} has sha256 {got}, not the pinned {SDIST_SHA256}")
    return path


def unpack(sdist: Path, dest: Path) -> Path:
    """vendor/engine of the sdist (only gk, diffusion and the quantizer kernels it includes)."""
    engine = dest / ENGINE
    if (dest / ".unpacked").is_file():
        return engine
    with cache_lock():
        if not (dest / ".unpacked").is_file():  # another worker may have unpacked it meanwhile
            _unpack(sdist, dest)
    return engine


def _unpack(sdist: Path, dest: Path) -> None:
    with tarfile.open(sdist) as tar:
        members = [
            m
            for m in tar.getmembers()
            if any(k in m.name for k in KEEP) and (m.isfile() or m.isdir())
        ]
        tar.extractall(dest, members=members, filter="data")
    (dest / ".unpacked").write_text("ok\n")


def source_lines(engine: Path, file: str, first: int, last: int) -> list[str]:
    """Lines first..last (1-based, inclusive) of a file of the pinned source."""
    lines = (engine / file).read_text(encoding="utf-8").splitlines()
    return lines[first - 1 : last]


def packs_with_templates() -> list:
    from gguf_trainer.packs import get_pack, pack_ids

    return [p for p in map(get_pack, pack_ids()) if p.engine_template]


def llm_embedder_lines(engine: Path) -> tuple[int, int]:
    """The lines of LLMEmbedder::get_learned_condition in the pinned conditioner.hpp: the
    template branches the driver can compile (it provides that function's locals)."""
    lines = (engine / CONDITIONER).read_text(encoding="utf-8").splitlines()
    start = next(i for i, t in enumerate(lines) if t.startswith("struct LLMEmbedder"))
    first = next(
        i for i in range(start, len(lines)) if "SDCondition get_learned_condition(" in lines[i]
    )
    last = next(i for i in range(first, len(lines)) if lines[i].startswith("struct "))
    return first + 1, last


def struct_lines(engine: Path, file: str, head: str) -> tuple[int, int]:
    """The lines (1-based) of the struct that starts with `head` in a file of the pinned source."""
    lines = (engine / file).read_text(encoding="utf-8").splitlines()
    first = next(i for i, t in enumerate(lines) if t.startswith(head))
    last = next(i for i in range(first, len(lines)) if lines[i] == "};")
    return first + 1, last + 1


def template_ranges(t: dict) -> list[tuple[int, int]]:
    """Every line range an engine_template cites: its members, its lines, its call."""
    return (
        [tuple(r) for r in t.get("members", ())]
        + [tuple(t["lines"])]
        + ([tuple(t["call"])] if "call" in t else [])
    )


def unsupported(engine: Path, pack) -> str | None:
    """Why the driver cannot compile this pack's engine_template, or None."""
    t = pack.engine_template
    if t["file"] == FIBO2:
        lo, hi = struct_lines(engine, FIBO2, FIBO2_STRUCT)
        ranges = template_ranges(t)
        if "call" not in t or not all(lo <= a <= b <= hi for a, b in ranges):
            return (
                f"{pack.id}: its engine_template cites {FIBO2}:{ranges}, not members, the prompt "
                f"line and the encode_prompt call of Fibo2Conditioner ({FIBO2}:{lo}-{hi})"
            )
        return None
    lo, hi = llm_embedder_lines(engine)
    if t["file"] != CONDITIONER or not (lo <= t["lines"][0] <= t["lines"][1] <= hi):
        return (
            f"{pack.id}: its engine_template {t['file']}:{t['lines'][0]}-{t['lines'][1]} is not a "
            f"branch of LLMEmbedder::get_learned_condition ({CONDITIONER}:{lo}-{hi}), the code the "
            f"driver compiles (or Fibo2Conditioner in {FIBO2}); give the tier a driver command "
            "for that conditioner"
        )
    return None


def served_branches(engine: Path, pack) -> list[tuple[str, tuple[int, int]]]:
    """(VERSION_*, branch lines) of the other families the pack's one file serves (`serves`:
    Krea2's adapter serves Iris-3B), found by the engine's own chain (engine_source.py); the
    driver runs them as `tmpl PACK@VERSION`."""
    from engine_source import Source

    src, own = Source(engine), pack.engine_template.get("version")
    out = []
    for family in getattr(pack, "serves", "").split(","):
        version = src.family_version(family) if family.strip() else None
        if version and version != own:
            b = src.branch_of(version)
            out.append((version, (b.first, b.last)))
    return out


def _write_if_changed(path: Path, text: str) -> None:
    """A rewrite with the same text would make the build recompile the driver."""
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def write_snippets(engine: Path, folder: Path, failed: dict[str, str]) -> list:
    """tokenize_member.inc and snippets.inc, cut from the pinned conditioner.hpp, and the
    fibo2_*.inc of the pack citing fibo2.hpp; the packs whose template lies elsewhere, or whose
    lines did not compile in the driver (`failed`: pack id -> compiler error), are left out and
    listed in unsupported.txt (their tier tests fail with it). Returns the packs compiled in, with
    their file and cited line ranges."""
    folder.mkdir(parents=True, exist_ok=True)
    first, last = TOKENIZE_LINES
    body = source_lines(engine, CONDITIONER, first, last)
    if "tokenize(std::string text" not in body[0] or body[-1].strip() != "}":
        raise EngineBuildError(f"{CONDITIONER}:{first}-{last} is not LLMEmbedder::tokenize")
    _write_if_changed(
        folder / "tokenize_member.inc", f'#line {first} "{CONDITIONER}"\n' + "\n".join(body) + "\n"
    )
    out, skipped, kept = [], [], []
    fibo2 = {"fibo2_pack.inc": "", "fibo2_members.inc": "", "fibo2_body.inc": ""}
    for pack in packs_with_templates():
        why = unsupported(engine, pack) or failed.get(pack.id)
        t = pack.engine_template
        if not why and t["file"] == FIBO2 and fibo2["fibo2_pack.inc"]:
            why = f"{pack.id}: another pack already cites {FIBO2}; the driver has one Fibo2Probe"
        if why:
            skipped.append(f"{pack.id}\t{why}")
            continue
        kept.append((pack.id, t["file"], template_ranges(t)))
        if t["file"] == FIBO2:

            def cut(a, b):
                return (
                    f'#line {a} "{FIBO2}"\n' + "\n".join(source_lines(engine, FIBO2, a, b)) + "\n"
                )

            fibo2["fibo2_pack.inc"] = (
                f'#define FIBO2_PACK "{pack.id}"\n#define FIBO2_VERSION {t["version"]}\n'
            )
            fibo2["fibo2_members.inc"] = "".join(cut(a, b) for a, b in t["members"])
            fibo2["fibo2_body.inc"] = cut(*t["lines"]) + cut(*t["call"])
            continue
        a, b = t["lines"]
        out.append(
            f'if (pack == "{pack.id}") {{\n    version = {t["version"]};\n'
            f'#line {a} "{t["file"]}"\n' + "\n".join(source_lines(engine, t["file"], a, b)) + "\n}"
        )
        for version, (a, b) in served_branches(engine, pack):
            out.append(
                f'if (pack == "{pack.id}@{version}") {{\n    version = {version};\n'
                f'#line {a} "{CONDITIONER}"\n' + "\n".join(source_lines(engine, CONDITIONER, a, b))
                + "\n}"
            )
    _write_if_changed(folder / "snippets.inc", "\n".join(out) + "\n")
    for name, text in fibo2.items():
        _write_if_changed(folder / name, text)
    _write_if_changed(
        folder / "unsupported.txt", "".join(s.replace("\n", " ") + "\n" for s in skipped)
    )
    return kept


GK_DIFFUSER = "diffusion/src/gk-diffuser.cpp"
CLI_MAIN = "diffusion/cli/main.cpp"
# What cli/common/common.cpp calls of the engine's C API (nm -u of its object): the defaults its
# params start from and the name tables its options parse; cut from gk-diffuser.cpp by name.
API_TABLES = ("rng_type_to_str", "sample_method_to_str", "scheduler_to_str", "prediction_to_str",
              "lora_apply_mode_to_str", "hires_upscaler_to_str")
API_FUNCTIONS = (
    "sd_type_name", "str_to_sd_type", "sd_rng_type_name", "str_to_rng_type",
    "sd_sample_method_name", "str_to_sample_method", "sd_scheduler_name", "str_to_scheduler",
    "sd_prediction_name", "str_to_prediction", "sd_lora_apply_mode_name", "str_to_lora_apply_mode",
    "str_to_sd_hires_upscaler", "sd_cache_params_init", "sd_hires_params_init",
    "sd_ctx_params_init",
    "sd_sample_params_init", "sd_sample_params_to_str", "sd_img_gen_params_init",
    "sd_vid_gen_params_init",
)
DEFAULT_FUNCTIONS = ("static bool sd_version_supports_ref_latent_img_cfg(",
                     "static bool sd_version_supports_img_cfg(", "float sd_get_default_txt_cfg(",
                     "void sd_get_default_resolution(")


def write_command_cuts(engine: Path, folder: Path) -> None:
    """The cmd_*.inc command_probe.cpp compiles: ggk's parser and defaults cut from the pinned
    main.cpp and gk-diffuser.cpp by name (engine_source.Source.function), never retyped."""
    from engine_source import Source

    src = Source(engine)

    def cut(file: str, a: int, b: int) -> str:
        return f'#line {a} "{file}"\n' + "\n".join(source_lines(engine, file, a, b)) + "\n"

    def fn(file: str, head: str) -> str:
        return cut(file, *src.function(file, head))

    main = src.text(CLI_MAIN)
    first = next(i for i, t in enumerate(main) if t.startswith("namespace fs = ")) + 2
    _, last = src.function(CLI_MAIN, "void parse_args(")
    a = next(i for i, t in enumerate(main) if t.strip() == "SDCliParams cli_params;") + 1
    b = next(i for i in range(a, len(main)) if main[i].strip().startswith("parse_args(")) + 1
    api = '#define NONE_STR "NONE"\n' + "".join(
        fn(GK_DIFFUSER, f"const char* {n}[] = {{") for n in API_TABLES
    ) + "".join(fn(GK_DIFFUSER, _api_head(src, n)) for n in API_FUNCTIONS)
    enum = re.search(r"enum SDVersion \{(.*?)\};", (engine / "diffusion/src/model.h").read_text(),
                     re.DOTALL)[1]
    cuts = {
        "cmd_main.inc": cut(CLI_MAIN, first, last),
        "cmd_main_parse.inc": cut(CLI_MAIN, a, b),
        "cmd_api.inc": api,
        "cmd_defaults.inc": "".join(fn(GK_DIFFUSER, h) for h in DEFAULT_FUNCTIONS),
        "cmd_guidance.inc": fn(GK_DIFFUSER, "static void resolve_guidance("),
        "cmd_preset.inc": fn(GK_DIFFUSER, "std::string get_default_ref_image_preset("),
        "cmd_versions.inc": "".join(f'{{"{v}", {v}}},\n'
                                    for v in re.findall(r"\b(VERSION_\w+)", enum)
                                    if v != "VERSION_COUNT"),
    }
    for name, text in cuts.items():
        _write_if_changed(folder / name, text)


def _api_head(src, name: str) -> str:
    """The first line of the C API function `name` as gk-diffuser.cpp writes it."""
    line = next(t for t in src.text(GK_DIFFUSER) if re.match(rf"^[\w* ]+[ *]{name}\(", t))
    return line[: line.index(name) + len(name) + 1]


def unsupported_packs() -> dict[str, str]:
    """Pack id -> why the driver has no template code for it (after build())."""
    path = cache_root() / SDIST_SHA256[:16] / "snippets" / "unsupported.txt"
    lines = path.read_text().splitlines() if path.is_file() else []
    return dict(line.split("\t", 1) for line in lines if "\t" in line)


_ERROR = re.compile(r"(diffusion/src/conditioning/\w+\.hpp):(\d+):\d+: error: (.*)")


_BUILT: dict[str, Path] = {}  # drivers this process already built or found up to date


def build(jobs: int = 2, log=print) -> Path:
    """The driver binary, built when the cache lacks it; logs the build time. A pack whose cited
    lines do not compile in the driver is left out (with the compiler's error) and the rest
    built. Once per process: each test module asks, and a no-op cmake run of the three
    targets costs 5-15 s on a loaded 2-core machine."""
    if "probe" not in _BUILT:
        with cache_lock():
            _BUILT["probe"] = _build(jobs, log)
    return _BUILT["probe"]


def _build(jobs: int, log) -> Path:
    root = build_root()
    sdist = fetch_sdist(root)
    engine = unpack(sdist, root / "src")
    snippets = root / "snippets"
    build_dir = root / "build"
    for name in DRIVER_SOURCES:  # the driver's own sources, copied so the cache is self-contained
        dest = root / "driver" / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.is_file() or dest.read_bytes() != (HERE / name).read_bytes():
            shutil.copyfile(HERE / name, dest)
    for tool in ("cmake", "g++"):
        if shutil.which(tool) is None:
            raise EngineBuildError(
                f"{tool} is not installed; the engine tier needs cmake and g++ "
                "(.ci/run installs them: apt-get install -y cmake g++)"
            )
    t0 = time.perf_counter()
    if (
        not (build_dir / "CMakeCache.txt").is_file()
        or any(d not in (build_dir / "Makefile").read_text() for d in DRIVERS)
    ):
        subprocess.run(
            [
                "cmake",
                "-S",
                str(root / "driver"),
                "-B",
                str(build_dir),
                "-DCMAKE_BUILD_TYPE=Release",
                f"-DENGINE_DIR={engine}",
                f"-DSNIPPET_DIR={snippets}",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    failed: dict[str, str] = {}
    while True:
        kept = write_snippets(engine, snippets, failed)
        res = subprocess.run(
            ["cmake", "--build", str(build_dir), "--target", "probe", "-j", str(jobs)],
            check=False,
            capture_output=True,
            text=True,
        )
        if res.returncode == 0:
            break
        errors = [
            (m.group(1), int(m.group(2)), m.group(3))
            for m in _ERROR.finditer(res.stdout + res.stderr)
        ]
        blamed = {
            pid: msg
            for file, line, msg in errors
            for pid, f, ranges in kept
            if f == file and any(a <= line <= b for a, b in ranges)
        }
        if not blamed:
            raise EngineBuildError(
                "the engine driver did not build:\n" + res.stdout[-6000:] + res.stderr[-6000:]
            )
        for pid, msg in blamed.items():
            failed[pid] = f"its engine_template lines do not compile in the driver: {msg}"
    write_command_cuts(engine, snippets)
    for target in DRIVERS:
        res2 = subprocess.run(
            ["cmake", "--build", str(build_dir), "--target", target, "-j", str(jobs)],
            check=False,
            capture_output=True,
            text=True,
        )
        if res2.returncode != 0:
            raise EngineBuildError(
                f"the {target} driver did not build:\n" + res2.stdout[-6000:] + res2.stderr[-6000:]
            )
    probe = build_dir / "probe"
    log(
        f"engine tier: driver {'built' if 'Linking' in res.stdout else 'up to date'} in "
        f"{time.perf_counter() - t0:.1f} s ({probe})"
        + (f"; left out: {', '.join(failed)}" if failed else "")
    )
    return probe


def build_t5clip(jobs: int = 2, log=print) -> Path:
    """The T5CLIPEmbedder driver (t5clip_probe.cpp: Chroma's T5 and Wan's UMT5 seed windows),
    built after build() when the cache lacks it. Its own target, built only for the tests that
    ask: the engine's UMT5 vocabulary header (45 MB) adds ~35 s of compile at -O0 and 1.5 GB of
    compiler memory (measured on this 2-core machine under load)."""
    probe = build(jobs, log)
    if "t5clip" in _BUILT:
        return _BUILT["t5clip"]
    with cache_lock():
        _BUILT["t5clip"] = _build_t5clip(probe, jobs, log)
    return _BUILT["t5clip"]


def _build_t5clip(probe: Path, jobs: int, log) -> Path:
    t0 = time.perf_counter()
    res = subprocess.run(
        ["cmake", "--build", str(probe.parent), "--target", "t5clip_probe", "-j", str(jobs)],
        check=False,
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise EngineBuildError(
            "the T5CLIPEmbedder driver did not build:\n" + res.stdout[-6000:] + res.stderr[-6000:]
        )
    log(
        f"engine tier: T5CLIPEmbedder driver {'built' if 'Linking' in res.stdout else 'up to date'}"
        f" in {time.perf_counter() - t0:.1f} s"
    )
    return probe.parent / "t5clip_probe"


if __name__ == "__main__":
    print(build())
