"""Side-by-side renders in the user's own ggk: the command lines and the conditioning figure.

Owns: finding the `ggk` command (a configured path, else PATH), turning a pack's declared
engine command into the two runs of a render (the adapter: `--llm <student> --llm-adapter
<GGUF>`; the teacher: the pack's `engine_teacher_args` in their place, or none where ggk has
no teacher path for the family), the conditioning pass (`--cfg-scale 1`, SD_DUMP_COND: with
CFG the dump left on disk is the empty negative prompt's, engine-contract §4b), the model
files the commands name that must be in the user's model folder, the files the user set for
the command's `<placeholders>` (a pack that cannot name ggk's file prints `<z-image-turbo DiT
.gguf>`: one argument, the user's file), and the cosine between the dumps. Must not: spawn,
wait or write (runner/render_job.py runs the plan).

    plan = render_plan(project, "a red fox", seed=42, ggk=find_ggk(None), models=Path("~/ggk"),
                       files={"<z-image-turbo DiT .gguf>": "/m/z_image_turbo-q8_0.gguf"})
    plan.missing          # what to install or point at, one sentence each ([] = ready)
    plan.runs             # [Run(half="teacher"|"adapter", argv, image, dump, cond_argv)]
"""

from __future__ import annotations

import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .check import compare, read_dump, read_ids

GGK = "ggk"  # the command the ggk PyPI package installs
FILE_SUFFIXES = (".gguf", ".safetensors", ".ckpt", ".bin", ".pt", ".png", ".jpg", ".jpeg", ".webp")
ADAPTER_FLAGS = ("--llm", "--llm-adapter")  # replaced by the teacher's args in the teacher run
TEACHER_DUMP = "llm_hidden.bin"  # the full teacher's conditioning (MageFlow's Qwen3-VL path)
ADAPTER_DUMP = "adapter_out.bin"
TOKENS_TXT = "tokens.txt"
PLACEHOLDER = re.compile(r"<[^<>]+>")  # a pack's `<qwen3-4b .gguf>`: one file, spaces and all
FILE_FLAG = "--file"  # `gguf-trainer render --file "<placeholder>=PATH"`
FILES_FIELD = "Output › Render it in your ggk › Files for the placeholders"


@dataclass
class Run:
    """One half of a render: the image command and, when it is not already a CFG-1 pass,
    the conditioning pass whose SD_DUMP_COND dump is the prompt's."""

    half: str  # "teacher" | "adapter"
    argv: list[str]
    image: str  # file name under the render folder
    dump: str  # dump folder name under the render folder
    cond_argv: list[str] | None = None  # None: `argv` itself runs at CFG 1 and dumps


@dataclass
class RenderPlan:
    runs: list[Run] = field(default_factory=list)
    no_teacher: str = ""  # why the teacher half is absent ("" = it runs)
    missing: list[str] = field(default_factory=list)  # what to install or point at
    models: str = ""  # the folder both runs start in (ggk's model files are named relative to it)


def find_ggk(configured: str | None) -> str | None:
    """The ggk executable: the configured path when it is an executable file, else `ggk` on
    PATH, else None."""
    if configured:
        path = Path(configured).expanduser()
        return str(path) if path.is_file() and shutil.which(str(path)) else None
    return shutil.which(GGK)


def _set(argv: list[str], flag: str, value: str) -> list[str]:
    """argv with `flag value` replaced, or appended when absent."""
    out = list(argv)
    if flag in out and out.index(flag) + 1 < len(out):
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def _drop(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        else:
            out.append(a)
    return out


def _cfg(argv: list[str]) -> float | None:
    if "--cfg-scale" in argv and argv.index("--cfg-scale") + 1 < len(argv):
        try:
            return float(argv[argv.index("--cfg-scale") + 1])
        except ValueError:
            return None
    return None


def _runs(half: str, argv: list[str], ggk: str, prompt: str, seed: int) -> Run:
    argv = [ggk, *argv[1:]]  # the pack writes `ggk ...`; the user's may live elsewhere
    argv = _set(_set(_set(argv, "-p", prompt), "-s", str(seed)), "-o", f"{half}.png")
    cfg = _cfg(argv)
    cond = None
    if cfg is None or cfg != 1.0:  # a CFG pass ends on the negative prompt: dump a CFG-1 pass
        cond = _set(_set(_set(argv, "--cfg-scale", "1"), "--steps", "1"), "-o", f"{half}-cond.png")
    return Run(half, argv, f"{half}.png", f"{half}-dump", cond)


def split_command(command: str) -> list[str]:
    """A pack's printed ggk command as argv, each `<...>` placeholder one word (shlex alone
    would cut `<z-image-turbo DiT .gguf>` into three). A placeholder inside a quoted word (a
    prompt) stays part of that word."""
    spans: list[str] = []

    def keep(m: re.Match) -> str:
        spans.append(m.group(0))
        return f"\0{len(spans) - 1}\0"  # no space, no quote: shlex leaves it whole

    words = shlex.split(PLACEHOLDER.sub(keep, command))
    return [re.sub(r"\0(\d+)\0", lambda m: spans[int(m.group(1))], w) for w in words]


def is_placeholder(word: str) -> bool:
    return PLACEHOLDER.fullmatch(word) is not None


def placeholder_key(name: str) -> str:
    """The placeholder as the settings key it: bracketed, inner spaces collapsed, so
    `z-image-turbo DiT .gguf` and `<z-image-turbo  DiT .gguf>` name the same one."""
    inner = " ".join(name.strip().removeprefix("<").removesuffix(">").split())
    return f"<{inner}>"


def placeholders(argv: list[str]) -> list[str]:
    """The command's placeholders, in order, once each."""
    return list(dict.fromkeys(a for a in argv if is_placeholder(a)))


def model_files(argv: list[str], skip: tuple[str, ...]) -> list[str]:
    """The file names a command reads besides the student and adapter (diffusion model, VAE,
    encoders, a reference image), in order: each must be in the model folder."""
    out = []
    for i, a in enumerate(argv[1:], 1):
        if a.lower().endswith(FILE_SUFFIXES) and a not in skip and argv[i - 1] != "-o" \
                and a not in out:
            out.append(a)
    return out


def render_plan(project, prompt: str, seed: int, ggk: str | None,
                models: Path | None, files: dict[str, str] | None = None) -> RenderPlan:
    """The runs of a render of `prompt` at `seed` for this project, and what is missing.
    `files`: the user's file for each placeholder of the command (placeholder_key -> path; a
    relative one is a name in the model folder, as the command's own file names are)."""
    pack = project.pack
    # ggk runs in the model folder (the command names its files relative to it); "" when
    # there is none: render_job runs it in the render folder then (every file is a full path)
    plan = RenderPlan(models=str(models) if models and Path(models).is_dir() else "")
    student = project.material_path("student")
    adapter = project.final_gguf
    if ggk is None:
        plan.missing.append(
            "the ggk engine: install it (pip install ggk) so `ggk` is on PATH, "
            "or set the path of the ggk command"
        )
    if student is None or not student.is_file():
        plan.missing.append("the student pig_clip-f16.gguf: link it in Setup → Materials")
    if not adapter.is_file():
        plan.missing.append(f"the adapter {adapter.name}: train and export it first")
    student_arg = str(student or "pig_clip-f16.gguf")  # unlinked: named, and said missing above
    # quoted: a project folder with a space stays one argument
    base = split_command(
        pack.engine_command(student=shlex.quote(student_arg), adapter=shlex.quote(str(adapter)))
    )
    adapter_argv = base
    runs = [("adapter", adapter_argv)]
    teacher_args = pack.engine_teacher_args
    if teacher_args:
        runs.insert(0, ("teacher", _drop(base, ADAPTER_FLAGS) + split_command(teacher_args)))
    else:
        plan.no_teacher = (
            f"ggk has no teacher path for {pack.title}: it runs only through "
            "the adapter, so the adapter's image is shown alone"
        )
    given = {placeholder_key(k): v for k, v in (files or {}).items() if v}
    unset: list[str] = []
    chosen: dict[str, str] = {}  # placeholder -> the argument in its place
    names = []
    for _half, argv in runs:
        names += [n for n in model_files(argv, (student_arg, str(adapter))) if n not in names]
    for ph in placeholders([a for _half, argv in runs for a in argv]):
        path = given.get(placeholder_key(ph))
        if not path:
            unset.append(ph)
        elif not Path(path).expanduser().is_absolute():
            chosen[ph] = path
            names += [path] if path not in names else []  # in the model folder
        else:
            chosen[ph] = str(Path(path).expanduser())
            if not Path(chosen[ph]).is_file():
                plan.missing.append(
                    f"the file set for {ph}, {chosen[ph]}: it is not a file; set the right path"
                )
    if unset:
        example = f'{FILE_FLAG} "{unset[0]}=PATH"'
        plan.missing.append(
            f"a file for each placeholder in the pack's ggk command ({', '.join(unset)}): "
            f"set each with `gguf-trainer render {example}` (remembered) or in {FILES_FIELD}"
        )
    if names and (models is None or not Path(models).is_dir()):
        plan.missing.append(f"the folder with ggk's model files ({', '.join(names)}): choose it")
    elif names:
        absent = [n for n in names if not (Path(models) / n).exists()]
        if absent:
            plan.missing.append(
                f"{', '.join(absent)} in {models}: put ggk's model files there "
                "or choose the folder that holds them"
            )
    plan.runs = [
        _runs(half, [chosen.get(a, a) for a in argv], ggk or GGK, prompt, seed)
        for half, argv in runs
    ]
    return plan


def dump_cosine(teacher_dump: Path, adapter_dump: Path) -> dict | None:
    """The adapter's conditioning against the teacher's, from the two dumps (check.compare:
    cosine, centred cosine, rel_mse), when the teacher's run wrote one with the same token
    ids; None otherwise (ggk writes no teacher dump for the T5 families)."""
    t_file, a_file = Path(teacher_dump) / TEACHER_DUMP, Path(adapter_dump) / ADAPTER_DUMP
    if not (t_file.is_file() and a_file.is_file()):
        return None
    t_ids, a_ids = (
        read_ids(Path(teacher_dump) / TOKENS_TXT),
        read_ids(Path(adapter_dump) / TOKENS_TXT),
    )
    if t_ids is not None and a_ids is not None and t_ids != a_ids:
        return None  # other templates or prompts: rows do not pair up
    rows = len(t_ids) if t_ids else None
    dim_t = t_file.stat().st_size // 4 // rows if rows else None
    if not dim_t:
        return None
    ref = read_dump(t_file, dim_t)
    pred = read_dump(a_file, dim_t)
    if pred.shape != ref.shape:
        return None
    return compare(pred.astype(np.float32), ref)
