"""The model card (`README.md`) `gguf-trainer publish` puts beside an adapter on the Hub.

Written from what the project knows, and only that: the family and the models it serves (the
pack), the ggk command (results.printed_command, with file names), the teacher and the
student with the repo and commit their snapshots were downloaded at (the listing each
download saves, materials/hub.py), the corpus (its Hub datasets by repo and commit, its local
files by count), the steps (the GGUF's own `adapter.*` keys), the evaluation against the mean
baseline (eval.json, when it is of the file published), the engine version the packs are
checked against, and the license fields of teacher and student. YAML front matter carries
library_name, tags, base_model and license.

A card names repos, revisions and file names, never a local path or the machine's user name:
nothing from the project's folders is copied into it but file names the export chose.

    card = model_card(project, adapters, companions, licenses)   # str, the README.md
"""

from __future__ import annotations

import json
from pathlib import Path

from gguf_trainer import __version__
from gguf_trainer.base import atomic
from gguf_trainer.materials.folder_check import LISTING_JSON, MANIFEST_DIR
from gguf_trainer.materials.spec import STUDENT_MATERIALS
from gguf_trainer.store.results import printed_command

# The engine release every pack's contract is read from (../shared/reference) and the engine
# tier builds from its source package (tests/engine/engine_build.py) to compare against.
ENGINE_CHECKED = "ggk 0.9.7"
HUB = "https://huggingface.co"
STUDENT_TOKENIZER = STUDENT_MATERIALS[1]


def snapshot_record(folder: Path | None) -> dict:
    """{repo, revision, commit, license} of a downloaded snapshot, from the listing its
    download saved; {} for a folder with none (linked by hand, or not there)."""
    if folder is None:
        return {}
    try:
        saved = atomic.read_json(Path(folder) / MANIFEST_DIR / LISTING_JSON, {})
    except (ValueError, OSError):
        return {}
    if not isinstance(saved, dict):
        return {}
    return {k: saved[k] for k in ("repo", "revision", "commit", "license")
            if isinstance(saved.get(k), str) and saved[k]}


def sources(project) -> dict[str, list[dict]]:
    """Where the teacher, the student's tokenizer and the corpus's Hub datasets came from:
    {"teacher": [...], "student": [...], "datasets": [...]}, each {id, title, repo, revision,
    commit, license} as far as known (the material's repo when no listing was saved)."""
    from gguf_trainer.materials.image_sources import IMAGE_PRESETS
    from gguf_trainer.materials.prompt_presets import PRESETS

    st = project.settings

    def entry(m) -> dict:
        rec = snapshot_record(project.material_path(m.id))
        return {"id": m.id, "title": m.title, "repo": rec.get("repo") or m.repo,
                "revision": rec.get("revision") or getattr(m, "revision", "") or "",
                "commit": rec.get("commit", ""), "license": rec.get("license", "")}

    presets = [PRESETS[p] for p in st.corpus.presets if p in PRESETS]
    presets += [IMAGE_PRESETS[p] for p in st.corpus.image_presets if p in IMAGE_PRESETS]
    return {"teacher": [entry(m) for m in project.pack.teacher_materials],
            "student": [entry(STUDENT_TOKENIZER)],
            "datasets": [entry(m) for m in presets]}


def student_sha256(project) -> str | None:
    """sha256 of the linked student GGUF (cached in hashes.json by the precompute), or None
    when it is not there."""
    from gguf_trainer.base.errors import UserError
    from gguf_trainer.materials.materials import student_identity

    try:
        return student_identity(project)
    except (UserError, OSError):
        return None


def _link(repo: str, kind: str = "model") -> str:
    return f"[{repo}]({HUB}/{'datasets/' if kind == 'dataset' else ''}{repo})"


def _source_line(s: dict, licenses: dict, kind: str = "model") -> str:
    if not s.get("repo"):
        return f"{s['title']}: a local copy no public repo holds (its revision is not recorded)"
    where = _link(s["repo"], kind)
    if s.get("commit"):
        where += f" at commit `{s['commit']}`"
        if s.get("revision") and s["revision"] != s["commit"]:
            where += f" (revision `{s['revision']}`)"
    elif s.get("revision"):
        where += f" at revision `{s['revision']}` (commit not recorded)"
    lic = s.get("license") or licenses.get(s["repo"])
    return f"{where}; license: {f'`{lic}`' if lic else 'not stated on its card'}"


def _fmt(v) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def _eval_lines(ev: dict | None) -> list[str]:
    if not ev:
        return ["Not evaluated: eval.json holds no evaluation of this file."]
    head, score = ev.get("headline"), ev.get("val_cos")
    base = (ev.get("baseline") or {}).get(f"baseline_{head}")
    verdict = {True: "beats", False: "does **not** beat"}.get(ev.get("beats_baseline"), "vs")
    lines = [(f"On the project's held-out validation prompts, the exported file scores "
             f"**{head} = {_fmt(score)}**; it {verdict} the mean baseline "
             f"({_fmt(base)}: predicting the training targets' mean for every row).")]
    metrics, baseline = ev.get("metrics") or {}, ev.get("baseline") or {}
    rows = [f"| {k} | {_fmt(v)} | {_fmt(baseline.get(f'baseline_{k}', '—'))} |"
            for k, v in metrics.items() if isinstance(v, (int, float))]
    if rows:
        lines += ["", "| metric | adapter | mean baseline |", "| --- | --- | --- |", *rows]
    if isinstance(ev.get("health"), str) and ev["health"]:
        lines += ["", f"Health: {ev['health']}"]
    return lines


def _dtype(f: dict) -> str:
    dtype = (f.get("metadata") or {}).get("adapter.dtype")
    return f" ({dtype})" if isinstance(dtype, str) and dtype else ""


def _yaml(key: str, value) -> str:
    """One front-matter entry; strings as JSON strings, which YAML reads as they are."""
    if isinstance(value, list):
        return f"{key}:\n" + "".join(f"- {json.dumps(v)}\n" for v in value)
    return f"{key}: {json.dumps(value)}\n"


def model_card(project, adapters: list[dict], companions: list[dict], licenses: dict,
               evaluation: dict | None, license_id: str | None = None) -> str:
    """The README.md. `adapters`/`companions`: {name, size, sha256, metadata} of each file
    published (metadata: the GGUF's `adapter.*` keys; companions {}); `licenses`: repo ->
    license id the Hub states (for repos whose listing saved none); `evaluation`: eval.json
    when it is of the first adapter, else None; `license_id`: the card's license field
    (default the teacher's, else "other")."""
    pack, st = project.pack, project.settings
    src = sources(project)
    meta = adapters[0]["metadata"] if adapters else {}
    teacher_repos = [s["repo"] for s in src["teacher"] if s.get("repo")]
    teacher_lic = next((s.get("license") or licenses.get(s["repo"]) for s in src["teacher"]
                        if s.get("repo") and (s.get("license") or licenses.get(s["repo"]))), None)
    family = meta.get("adapter.family") or pack.title
    front = "---\n" + _yaml("library_name", "gguf") + _yaml("license", license_id or teacher_lic
                                                             or "other")
    if teacher_repos:
        front += _yaml("base_model", teacher_repos)
    front += _yaml("tags", ["gguf", "ggk", "pig_clip", "llm-adapter", "gguf-trainer", pack.id])
    datasets = [s["repo"] for s in src["datasets"] if s.get("repo")]
    if datasets:
        front += _yaml("datasets", datasets)
    front += "---\n"

    name = st.name
    cmd, notes = printed_command(pack, "pig_clip-f16.gguf", adapters[0]["name"],
                                 extras={"sigvq": companions[0]["name"]} if companions and
                                 pack.id == "llada_image" else None)
    rows = [f"| `{f['name']}` | {role}{_dtype(f)} | {f['size']:,} | `{f.get('sha256') or '—'}` |"
            for role, group in (("adapter", adapters), ("companion", companions))
            for f in group]
    steps = meta.get("adapter.trained_steps")
    planned = meta.get("adapter.planned_steps")
    corpus = [f"{st.corpus.n_train:,} training and {st.corpus.n_val:,} validation prompts"]
    corpus += [_source_line(s, licenses, "dataset") for s in src["datasets"]]
    local = len(st.corpus.files) + (1 if st.corpus.train_file else 0)
    if local:
        corpus.append(f"{local} local prompt file{'s' if local > 1 else ''} (not published)")
    if st.corpus.image_folders:
        corpus.append(f"{len(st.corpus.image_folders)} local image folder(s) (not published)")
    teacher = [_source_line(s, licenses) for s in src["teacher"]] or [
        str(meta.get("adapter.teacher") or "not recorded")]
    if meta.get("adapter.teacher") and not teacher_repos:
        teacher.append(f"recorded in the GGUF as `{meta['adapter.teacher']}`")
    in_dim = meta.get("adapter.in_dim")
    student_sha = student_sha256(project)
    lines = [
        f"# {name}",
        "",
        f"A pig_clip adapter for **{family}**: the ggk engine runs the small pig_clip LLM "
        "(`--llm`) with this adapter (`--llm-adapter`) in place of the family's own text "
        f"encoder. Trainer pack `{pack.id}` ({pack.title}). {pack.description}".rstrip(),
        "",
        "## Files",
        "",
        "| file | role | bytes | sha256 |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
        "## Use it in ggk",
        "",
        "```bash",
        cmd,
        "```",
        "",
        *[f"* {n}" for n in [*notes, *pack.engine_notes]],
        "",
        "## How it was trained",
        "",
        *[f"* Teacher: {t}" for t in teacher],
        "* Student: pig_clip, the f16 GGUF (Qwen3-0.6B layout"
        + (f", hidden {in_dim}" if in_dim else "") + ")"
        + (f", sha256 `{student_sha}`" if student_sha else "") + "; its tokenizer "
        + _source_line(src["student"][0], licenses),
        *[f"* Corpus: {c}" for c in corpus],
        f"* Steps: {steps if steps is not None else 'not recorded'} trained"
        + (f" of {planned} planned" if planned else "")
        + (f", exported from {meta['adapter.checkpoint']}.pt"
           if meta.get("adapter.checkpoint") else ""),
        (f"* Trainer: {meta.get('adapter.trainer') or 'gguf-trainer'} "
        f"(published with gguf-trainer {__version__})"),
        "",
        "## Evaluation",
        "",
        *_eval_lines(evaluation),
        "",
        "## Engine",
        "",
        f"Checked against {ENGINE_CHECKED}: the engine release this trainer's {pack.id} pack "
        "reads its tensor names, template and conditioning from, and builds to compare with"
        + (f"; needs ggk {pack.min_ggk} or newer" if pack.min_ggk else "") + ".",
        "",
        "## License",
        "",
        f"This card's license field: `{license_id or teacher_lic or 'other'}`"
        + (" (the teacher's)" if not license_id and teacher_lic else "")
        + ". The adapter is trained on the teacher's outputs and runs on pig_clip; their "
        "terms apply:",
        "",
        *[f"* Teacher {_source_line(s, licenses)}" for s in src["teacher"] if s.get("repo")],
        f"* Student tokenizer {_source_line(src['student'][0], licenses)}",
        "",
    ]
    return front + "\n".join(lines)
