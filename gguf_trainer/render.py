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

from gguf_trainer.base import bounded

from .check import compare, lead_figures, read_dump, read_ids
from .store.results import printed_command

GGK = "ggk"  # the command the ggk PyPI package installs
FILE_SUFFIXES = (".gguf", ".safetensors", ".ckpt", ".bin", ".pt", ".png", ".jpg", ".jpeg", ".webp")
ADAPTER_FLAGS = ("--llm", "--llm-adapter")  # replaced by the teacher's args in the teacher run
TEACHER_DUMP = "llm_hidden.bin"  # the full teacher's conditioning (MageFlow's Qwen3-VL path)
ADAPTER_DUMP = "adapter_out.bin"
TOKENS_TXT = "tokens.txt"
PLACEHOLDER = re.compile(r"<[^<>]+>")  # a pack's `<qwen3-4b .gguf>`: one file, spaces and all
FILE_FLAG = "--file"  # `gguf-trainer render --file "<placeholder>=PATH"`
FILES_FIELD = "Output › Render it in your ggk › Files for the placeholders"
GGK_FIELD = "Output › Render it in your ggk › ggk command"
MODELS_FIELD = "Output › Render it in your ggk › Folder with ggk's model files"
# A pack's sample edit (`--llm_vision <mmproj> --ref-image pig.png`): a render draws the typed
# prompt, text to image, so the sample's reference picture (no model file) and the vision
# encoder that reads it are left out of both runs.
REFERENCE_FLAGS = ("--ref-image", "--llm_vision")


@dataclass
class Run:
    """One half of a render: the image command and, when it is not already a CFG-1 pass,
    the conditioning pass whose SD_DUMP_COND dump is the prompt's."""

    half: str  # "teacher" | "adapter"
    argv: list[str]
    image: str  # file name under the render folder
    dump: str  # dump folder name under the render folder
    cond_argv: list[str] | None = None  # None: `argv` itself runs at CFG 1 and dumps
    out_at: tuple[int, ...] = ()  # where `-o` stands in argv (and cond_argv): its value follows


@dataclass
class RenderPlan:
    runs: list[Run] = field(default_factory=list)
    no_teacher: str = ""  # why the teacher half is absent ("" = it runs)
    missing: list[str] = field(default_factory=list)  # what to install or point at
    models: str = ""  # the folder both runs start in (ggk's model files are named relative to it)
    placeholders: list[str] = field(default_factory=list)  # the command's `<...>` files
    text_only: str = ""  # what the render left out of the pack's sample edit ("" = nothing)


def find_ggk(configured: str | None) -> str | None:
    """The ggk executable: the configured path when it is an executable file, else `ggk` on
    PATH, else None."""
    if configured:
        path = Path(configured).expanduser()
        return str(path) if path.is_file() and shutil.which(str(path)) else None
    return shutil.which(GGK)


# The options a render sets. ggk's parser (diffusion/cli/common/common.cpp parse_options)
# takes the next argv element as an option's value whatever it starts with, so a prompt `-s`
# is a value: each option is found by its POSITION in the pack's own argv, never by
# searching values (the prompt, a user's file path), and set once.
SET_FLAGS = ("-p", "-s", "-o", "--cfg-scale", "--steps")


def flag_positions(argv: list[str]) -> dict[str, list[int]]:
    """Where each of SET_FLAGS stands as an option in `argv` (the pack's command, before any
    user value is in it): an element equal to the flag that is not itself the value of the
    option before it."""
    out: dict[str, list[int]] = {}
    i = 1
    while i < len(argv):
        if argv[i] in SET_FLAGS:
            out.setdefault(argv[i], []).append(i)
            i += 2  # the next element is its value, whatever it looks like
        else:
            i += 1
    return out


def _set(argv: list[str], pos: dict[str, list[int]], values: dict[str, str]
         ) -> tuple[list[str], dict[str, list[int]]]:
    """argv with each flag's value set at the flag's known positions, or the flag appended
    once when the command has none; and the positions of the result."""
    out, pos = list(argv), {k: list(v) for k, v in pos.items()}
    for flag, value in values.items():
        at = [i for i in pos.get(flag, []) if i + 1 < len(out)]
        if not at:
            pos[flag] = [len(out)]
            out += [flag, value]
        for i in at:
            out[i + 1] = value
    return out, pos


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


def _cfg(argv: list[str], pos: dict[str, list[int]]) -> float | None:
    at = [i for i in pos.get("--cfg-scale", []) if i + 1 < len(argv)]
    if not at:
        return None
    try:
        return float(argv[at[-1] + 1])  # ggk keeps the last value given
    except ValueError:
        return None


def _runs(half: str, argv: list[str], ggk: str, prompt: str, seed: int,
          chosen: dict[str, str] | None = None) -> Run:
    """The run of one half: the pack's `argv` (positions found in it before any user value
    goes in), its placeholders replaced by the user's files (`chosen`), then the prompt,
    seed and output set by position."""
    pos = flag_positions(argv)
    # the pack writes `ggk ...`; the user's may live elsewhere
    argv = [ggk, *((chosen or {}).get(a, a) for a in argv[1:])]
    argv, pos = _set(argv, pos, {"-p": prompt, "-s": str(seed), "-o": f"{half}.png"})
    cfg = _cfg(argv, pos)
    cond = None
    if cfg is None or cfg != 1.0:  # a CFG pass ends on the negative prompt: dump a CFG-1 pass
        cond, _ = _set(argv, pos, {"--cfg-scale": "1", "--steps": "1", "-o": f"{half}-cond.png"})
    return Run(half, argv, f"{half}.png", f"{half}-dump", cond, tuple(pos["-o"]))


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
    encoders), in order: each must be in the model folder."""
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
            "the ggk engine: install it (pip install ggk) so `ggk` is on PATH, or set the "
            f"path of the ggk command with `gguf-trainer render --ggk PATH` (remembered) or in "
            f"{GGK_FIELD}"
        )
    if student is None or not student.is_file():
        plan.missing.append("the student pig_clip-f16.gguf: link it (`gguf-trainer link "
                            f"--project {project.paths.root} student PATH`)")
    if not adapter.is_file():
        plan.missing.append(f"the adapter {adapter.name}: train and export it first")
    student_arg = str(student or "pig_clip-f16.gguf")  # unlinked: named, and said missing above
    # the command every place prints (store.results.printed_command): quoted, so a project
    # folder with a space stays one argument and each placeholder one word
    base = split_command(printed_command(pack, student_arg, str(adapter))[0])
    if any(a in REFERENCE_FLAGS for a in base):
        dropped = [f"{a} {base[i + 1]}" for i, a in enumerate(base[:-1]) if a in REFERENCE_FLAGS]
        base = _drop(base, REFERENCE_FLAGS)
        plan.text_only = (f"the render draws your prompt as text to image: the pack's sample "
                          f"edit ({', '.join(dropped)}) is left out")
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
    plan.placeholders = placeholders([a for _half, argv in runs for a in argv])
    for ph in plan.placeholders:
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
    set_models = f"`gguf-trainer render --models DIR` (remembered) or in {MODELS_FIELD}"
    if names and (models is None or not Path(models).is_dir()):
        plan.missing.append(f"the folder with ggk's model files ({', '.join(names)}): set it "
                            f"with {set_models}")
    elif names:
        absent = [n for n in names if not (Path(models) / n).exists()]
        if absent:
            plan.missing.append(
                f"{', '.join(absent)} in {models}: put ggk's model files there "
                f"or set the folder that holds them with {set_models}"
            )
    plan.runs = [_runs(half, argv, ggk or GGK, prompt, seed, chosen) for half, argv in runs]
    return plan


def teacher_dump_checked(pack) -> bool:
    """Whether the figures read the teacher half's dump through `check`: the slot kinds'
    full teacher (Ming-Image's MingImageEmbedder: ming_te_out.bin + ming_tokens.txt; MOSS-Image's
    LLMEmbedder: llm_hidden.bin + tokens.txt; check/slot_dumps.py) writes the very rows the
    adapter learns with the teacher's ids, which check compares with the adapter run in
    PyTorch on the prompt (the caption and the prompt's own slots leading): the adapter's
    quality against the engine's own teacher, not a port check."""
    from .check.slot_dumps import SLOT_KINDS

    return pack.adapter_kind in SLOT_KINDS


def dump_cosine(teacher_dump: Path, adapter_dump: Path, max_dim: int, sets_of=None,
                taps=()) -> dict | None:
    """The adapter's conditioning against the teacher's, from the two dumps (check.compare:
    cosine, centred cosine, rel_mse), when the teacher's run wrote one with the same token
    ids; None otherwise (ggk writes no teacher dump for the T5 families). `sets_of(ids)`: the
    row sets the lead figures read (check.lead_rows), which then lead as "lead" (tokens and
    pads apart, each centred on its own mean, per tap of `taps`). `max_dim`: the
    widest row the pack's engine writes (its out_dim): with the rows of tokens.txt it bounds
    what is read, so a dump larger than that is a sentence (bounded.LargerThanImplied), not a
    read of many GiB."""
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
    if not rows:
        return None
    size = t_file.stat().st_size
    bounded.check_size(t_file, size, rows * max_dim * 4,
                       f"a dump of {rows} rows (its tokens.txt) of at most {max_dim} f32 values")
    dim_t = size // 4 // rows
    if not dim_t:
        return None
    ref = read_dump(t_file, dim_t, max_rows=rows)
    pred = read_dump(a_file, dim_t, max_rows=rows)
    if pred.shape != ref.shape:
        return None
    out = compare(pred.astype(np.float32), ref)
    if sets_of is not None:
        out["lead"] = lead_figures(pred.astype(np.float32), ref, sets_of(t_ids), taps)
    return out


def figures_line(fig: dict) -> str:
    """The render's conditioning figures in one line: the lead (tokens, pads) first, then the
    plain and centred cosine and rel_mse of all rows."""
    lead = "; ".join(f"{n} centred {f['cos_centered']:.4f} (rel_mse {f['rel_mse']:.4g})"
                     for n, f in (fig.get("lead") or {}).items())
    rest = (f"all rows {fig['cos']:.4f} (centred {fig['cos_centered']:.4f}, rel_mse "
            f"{fig['rel_mse']:.4g})")
    return f"{lead}; {rest}" if lead else rest
