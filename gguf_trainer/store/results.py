"""Where a project's results are: the exported GGUF, its eval line, the ggk command.

What `gguf-trainer status`/`results` and the GUI's Output tab show after a run. Reads
the project's files only; imports no torch.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from gguf_trainer.base import atomic
from gguf_trainer.data.lead import lead_line
from gguf_trainer.store.project import Project, load_project

# A pack's `<z-image-turbo DiT .gguf>`: a file ggk does not name, standing as one word
# (render.split_command reads the same brackets; one inside a quoted prompt is the prompt's).
PLACEHOLDER_WORD = re.compile(r"(?<!\S)<[^<>]+>(?!\S)")


def placeholder_name(word: str) -> str:
    """The placeholder as settings key it (render.placeholder_key): bracketed, inner spaces
    collapsed."""
    return "<" + " ".join(word.strip().removeprefix("<").removesuffix(">").split()) + ">"


def printed_command(pack, student: str = "pig_clip-f16.gguf", adapter: str | None = None,
                    files: dict[str, str] | None = None, extras: dict[str, str] | None = None
                    ) -> tuple[str, list[str]]:
    """THE ggk command as printed (demo, run, status, the Output tab, the README's table) and
    as render's argv is built: the pack's engine command with `student` and `adapter` (plain
    file names or paths, shell-quoted here; the adapter defaults to the pack's file name), and
    each `<placeholder>` the user's file where `files` sets it (`gguf-trainer render --file`),
    else the placeholder single-quoted: pasted into bash it is one word, never a `<` redirect.
    Notes: one line for each placeholder left, saying what to put there."""
    adapter = adapter or f"pig_{pack.default_name}-f16.gguf"
    raw = pack.engine_command(student=shlex.quote(student), adapter=shlex.quote(adapter),
                              extras=extras)
    given = {placeholder_name(k): v for k, v in (files or {}).items() if v}
    notes: list[str] = []

    def fill(m: re.Match) -> str:
        name = placeholder_name(m.group(0))
        if given.get(name):
            return shlex.quote(given[name])
        line = (f"{shlex.quote(name)}: put the path of that file there (ggk gives it no name; "
                f"`gguf-trainer render --file \"{name}=PATH\"` sets it once for every command)")
        if line not in notes:
            notes.append(line)
        return shlex.quote(name)

    return PLACEHOLDER_WORD.sub(fill, raw), notes


def ggk_command(project: Project, files: dict[str, str] | None = None
                ) -> tuple[str, list[str]]:
    """The project's ggk command (printed_command) with its real, existing paths and the
    user's placeholder files (`files`: render settings); and notes for what was left out or
    replaced."""
    pack = project.pack
    notes: list[str] = []
    student = project.material_path("student")
    if student is None or not student.is_file():
        student_arg = "pig_clip-f16.gguf"
        notes.append(f"link your pig_clip-f16.gguf (`gguf-trainer link --project {project.dir} "
                     "student PATH`); until then the command names it by its file name")
    else:
        student_arg = str(student)
    cmd, left = printed_command(pack, student_arg, str(project.final_gguf), files)
    notes += left
    notes += list(pack.engine_notes)  # the pack's advice for running it
    if "tiny" in Path(student_arg).name:
        notes.append("this project's student is the demo's tiny stand-in, not the real pig_clip: "
                     "its adapter only fits that stand-in, so this command shows the shape of a "
                     "real one; train against the real pig_clip-f16.gguf for ggk")
    if project.settings.precompute.mock_teacher:
        notes.append("MOCK teacher: this adapter is a smoke test of the machinery, not usable")
    # Companion files the command names (VAE, diffusion model ...) that are not next to the
    # adapter are the user's to fetch; say so instead of printing a broken path.
    # A companion the pack names (LLaDA's SigVQ) that this project did not export is left
    # out of the command by the pack; say so rather than leave the user wondering.
    placeholders = re.findall(r"<([^<>\s]+)>", pack.engine_command())
    left_out = [p for p in placeholders if p not in ("pig_clip.gguf", "adapter.gguf")
                and f"<{p}>" not in cmd and p.rsplit(".", 1)[0].rsplit("-", 1)[0] not in cmd]
    for name in left_out:
        notes.append(f"{name} was not exported by this project, so the command leaves it out "
                     "(text-to-image runs without it; for editing, export it: export.export_sigvq)")
    engine_files = [t for t in shlex.split(cmd) if t.endswith(".gguf") and "/" not in t
                    and not t.startswith("<")
                    and t != Path(student_arg).name and not (project.output_dir / t).exists()]
    if engine_files:
        notes.append(f"{', '.join(engine_files)}: ggk's own model files (not made by "
                     "gguf-trainer); run the command in the folder that holds them")
    return cmd, notes


def describe_results(root: str | os.PathLike, files: dict[str, str] | None = None) -> dict:
    """Where the outputs are; see control.results. `files`: the user's file for each
    placeholder of the ggk command (render settings)."""
    project = load_project(root)
    out: dict = {"gguf": None, "eval_json": None, "eval_line": None, "lead": None, "ggk": None,
                 "notes": [],
                 "mock": bool(project.settings.precompute.mock_teacher),
                 "planned_gguf": str(project.final_gguf)}
    if project.final_gguf.is_file():
        out["gguf"] = str(project.final_gguf)
    else:
        out["notes"].append(f"no adapter exported yet; it will be {project.final_gguf}")
    try:
        ev = atomic.read_json(project.paths.eval_json, inside=project.paths.root)  # not a link out
    except (ValueError, OSError):
        ev = None
    if isinstance(ev, dict):
        out["eval_json"] = str(project.paths.eval_json)
        head, score = ev.get("headline"), ev.get("val_cos")
        base = (ev.get("baseline") or {}).get(f"baseline_{head}") if isinstance(
            ev.get("baseline"), dict) else None
        if isinstance(score, (int, float)):
            # the centred cosine of the rows the DiT reads leads (data/dit_rows.py); an
            # eval.json from before it has none and reads as it did
            lead = lead_line(ev.get("lead")) if isinstance(ev.get("lead"), dict) else None
            out["lead"] = ev.get("lead") if lead else None
            out["eval_line"] = (f"{lead}; " if lead else "") + f"{head} {score:.4f}" + (
                f" vs mean baseline {base:.4f}" if isinstance(base, (int, float)) else "")
            if out["mock"]:
                out["eval_line"] += "; MOCK teacher: a smoke test, not a usable adapter"
            elif isinstance(ev.get("health"), str):
                out["eval_line"] += f"; {ev['health']}"
        taps = ev.get("per_tap")
        if isinstance(taps, dict) and isinstance(taps.get("cos"), list) and out["eval_line"]:
            # layerwise: each tap's cosine (its mean baseline) beside the whole stack's
            cells = [f"L{t} {c:.3f} ({b:.3f})" for t, c, b in
                     zip(taps.get("taps", []), taps["cos"], taps.get("baseline_cos") or [])
                     if isinstance(c, (int, float)) and isinstance(b, (int, float))]
            if cells:
                out["eval_line"] += "; per tap: " + ", ".join(cells)
    if out["gguf"]:
        out["ggk"], notes = ggk_command(project, files)
        out["notes"] += notes
    why = shards_recompute_note(project)
    if why:
        out["notes"].append(why)
    return out


def shards_recompute_note(project) -> str | None:
    """Why the next start recomputes the shards, when they store other rows than the recipe
    says (`train.pad_weight` "one" stores K pad rows a sample; `train.prefix_rows` "out" with
    `train.stats_rows` "loss" no row before the start row: data/recipe.py stored_rows); None
    when they agree or there are none. Reads one shard header."""
    from gguf_trainer.data.recipe import Recipe, describe_stored_rows, stored_rows
    from gguf_trainer.data.shards import read_meta, shard_files

    files = [f for split in ("val", "train") for f in shard_files(project.paths.shard_dir(split))]
    meta = read_meta(files[0]) if files else None
    if not meta:
        return None
    pack, train = project.pack, project.settings.train
    want = stored_rows(Recipe.from_settings(train, pack), pack).label
    have = meta.get("stored_rows", "all")  # shards written before store every row
    if have == want:
        return None
    keys = ", ".join(f"train.{k} {getattr(train, k)}" for k in ("pad_weight", "prefix_rows",
                                                                   "stats_rows"))
    return (f"the shards hold {describe_stored_rows(have)} but the recipe ({keys}) stores "
            f"{describe_stored_rows(want)}: the next start recomputes them (and trains again)")
