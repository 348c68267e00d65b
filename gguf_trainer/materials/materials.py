"""A project's materials: the files it trains from, where they are, and what identifies them.

Owns: resolving material paths (student GGUF, student tokenizer, the pack's teacher files),
which materials a project wants (`materials_for`), hashing big files with a persistent cache
(`hashes.json` by path, size and mtime), and the teacher's identity for the shard
fingerprint, and the project-level trust of the teacher's own code (teachers/trust.py). Finding
copies is discovery.py's, fetching them runner/downloads.py's. Must not: load models or import
torch.

    gguf, tok = student_paths(project)
    folders = teacher_paths(project)            # {"teacher": Path(...)} for the pack's teacher
    spiece, why = seed_tokenizer(project)       # a T5 pack's spiece.model, or None and why
    ident = teacher_identity(project)           # {"snapshot": "<sha256>", "files": 7}
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from gguf_trainer.base import atomic
from gguf_trainer.base.errors import UserError
from gguf_trainer.base.jsonvals import get_dotted
from gguf_trainer.teachers import trust

log = logging.getLogger(__name__)

# Files whose bytes define a model but are too big to hash at every start: identified by
# name and size (a re-download of the same revision keeps both; a different checkpoint
# changes at least the size or the index json that names it).
WEIGHT_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".gguf",
    ".h5",
    ".msgpack",
    ".onnx",
)
SKIPPED_DIRS = (".cache", ".git", ".huggingface")  # download bookkeeping, not the model


# ---------------------------------------------------------------- hashing


def _read_cache(cache_file: Path | None) -> dict:
    if cache_file is None:
        return {}
    # A cache is only a speed-up: garbage in it (not JSON, wrong types, a folder in its place)
    # is dropped and rebuilt, never fatal.
    try:
        cache = atomic.read_json(cache_file, {})
    except (ValueError, OSError):
        cache = {}
    return {k: v for k, v in cache.items() if isinstance(v, str)} if isinstance(cache, dict) else {}


def file_sha256(path: Path, cache_file: Path | None = None) -> str:
    """sha256 of a (multi-GB) file. With `cache_file`, a JSON map remembers it by path, size and
    mtime, so a restart does not re-read the student GGUF; any rewrite of the file re-hashes."""
    return files_sha256([Path(path)], cache_file)[0]


def files_sha256(paths: list[Path], cache_file: Path | None = None) -> list[str]:
    """sha256 of each file, through one read and at most one write of the cache."""
    cache = _read_cache(cache_file)
    out, changed = [], False
    # a file inside the cache's folder (the project's own materials) is keyed relative to it:
    # a moved project keeps its hashes instead of re-reading every file
    home = cache_file.parent.resolve() if cache_file is not None else None
    for path in paths:
        st = path.stat()
        real = path.resolve()
        name = real.relative_to(home).as_posix() if home and real.is_relative_to(home) else real
        key = f"{name}|{st.st_size}|{st.st_mtime_ns}"
        if key not in cache:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 24), b""):
                    h.update(block)
            cache[key] = h.hexdigest()
            changed = True
        out.append(cache[key])
    if changed and cache_file is not None:
        try:
            atomic.write_json(cache_file, cache)
        except OSError as e:  # a read-only project still trains; it only re-hashes next time
            log.warning("could not update %s (%s); hashes are recomputed next start", cache_file, e)
    return out


# ---------------------------------------------------------------- which materials, where


def materials_for(project) -> tuple:
    """The materials this project wants now: the student's, the teacher's unless the mock
    teacher is on, and each optional one whose `wanted_when` setting is on (the SigVQ folder
    when export.export_sigvq is set, image datasets when the corpus selects them)."""
    from gguf_trainer.materials.spec import STUDENT_MATERIALS

    pack, st = project.pack, project.settings
    teacher = () if st.precompute.mock_teacher else pack.teacher_materials
    plain = st.model_dump()  # the one getter of dotted settings reads plain data
    wanted = []
    for m in STUDENT_MATERIALS + tuple(teacher) + tuple(pack.optional_materials):
        when = getattr(m, "wanted_when", "")
        if m.required or (when and get_dotted(plain, when)):
            wanted.append(m)
    return tuple(wanted)


def _fix_for(material, project_dir=None, instead: str = "") -> str:
    proj = project_dir or "DIR"
    # `instead`: the command's own flag that names the file in place of the project's (check's
    # --student FILE), offered last
    alt = f", or pass {instead}" if instead else ""
    if material.repo:  # runner/downloads.py: resumable, verified, records the path itself
        return (
            f"download {material.repo} (gguf-trainer download --project {proj} --id "
            f"{material.id}, or Download under Setup → Materials) or link a copy you have "
            f"(gguf-trainer link --project {proj} {material.id} PATH){alt}"
        )
    if material.kind == "hf_snapshot":  # no repo holds it: linked only
        from gguf_trainer.materials.spec import link_sentence

        return link_sentence(material, proj) + alt
    # A local file: name the commands that record it, with this project's folder.
    return (
        f"link your file with `gguf-trainer link --project {proj} {material.id} PATH` or "
        f"`gguf-trainer set --project {proj} materials.{material.id}.path=PATH`"
        + (f" ({material.hint})" if material.hint else "") + alt
    )


def student_path(project, material_id: str, instead: str = "") -> Path:
    """The linked student GGUF (`student`) or tokenizer folder (`student_tokenizer`); a
    UserError naming the path tried and the fix (`instead`: the caller's flag that names the
    file directly, e.g. check's `--student FILE`)."""
    from gguf_trainer.materials.spec import STUDENT_MATERIALS

    mat = next(m for m in STUDENT_MATERIALS if m.id == material_id)
    path = project.material_path(material_id)
    if material_id == "student":
        ok, what, absent = path is not None and path.is_file(), "GGUF", "does not exist"
    else:
        ok = path is not None and (path / "tokenizer.json").is_file()
        what, absent = "tokenizer", "has no tokenizer.json"
    if not ok:
        tried = f"{path} {absent}" if path else f"materials.{material_id}.path is not set"
        raise UserError(
            f"the student {what} is missing ({tried}); "
            f"{_fix_for(mat, project.paths.root, instead)}."
        )
    return path


def student_paths(project) -> tuple[Path, Path]:
    """The student GGUF and its tokenizer folder; a UserError naming the path tried and the fix."""
    return student_path(project, "student"), student_path(project, "student_tokenizer")


def teacher_paths(project) -> dict[str, Path]:
    """Every teacher material of the pack that is set and present, by id; a required one that
    is missing is a UserError naming the path tried and the command that fixes it."""
    out = {}
    for m in project.pack.teacher_materials:
        path = project.material_path(m.id)
        present = path is not None and (
            path.is_dir() if m.kind == "hf_snapshot" else path.is_file()
        )
        if present:
            out[m.id] = path
        elif m.required:
            tried = f"{path} does not exist" if path else f"materials.{m.id}.path is not set"
            raise UserError(
                f"the {m.title} for {project.pack.title} is missing ({tried}); "
                f"{_fix_for(m, project.paths.root)}, "
                "or turn on precompute.mock_teacher."
            )
    return out


def seed_tokenizer(project) -> tuple[Path | None, str]:
    """The teacher's tokenizer file the pack's seed ids come from (pack.seed_tokenizer_file of
    the project's teacher material, wherever it resolves), or None and why not in words ("":
    the pack's adapter reads no seed ids). Never raises: `check` works without it."""
    pack = project.pack
    if pack.adapter_kind != "seeded_resampler":
        return None, ""
    found = {}
    for m in pack.teacher_materials:
        path = project.material_path(m.id)
        if path is None:
            return None, f"materials.{m.id}.path is not set"
        if not (path.is_dir() if m.kind == "hf_snapshot" else path.is_file()):
            return None, f"the teacher {path} does not exist"
        found[m.id] = path
    file = pack.seed_tokenizer_file(found) if found else None
    if file is None:
        return None, f"the {pack.title} pack names no teacher tokenizer"
    if not Path(file).is_file():
        return None, f"{file} does not exist"
    return Path(file), ""


# ---------------------------------------------------------------- identity


def folder_identity(root: Path, cache_file: Path | None = None) -> dict:
    """What defines a model folder: every file's relative name, plus its content hash (configs,
    tokenizer models such as spiece.model, remote-code *.py, index json) or, for weight files,
    its size. Content hashes go through the hashes.json cache."""
    files = sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and not any(part in SKIPPED_DIRS for part in p.relative_to(root).parts)
    )
    small = [p for p in files if p.suffix.lower() not in WEIGHT_SUFFIXES]
    hashes = dict(zip(small, files_sha256(small, cache_file)))
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update((hashes[p] if p in hashes else f"size:{p.stat().st_size}").encode() + b"\n")
    return {"snapshot": h.hexdigest(), "files": len(files)}


def teacher_identity(project, recorded: dict | None = None) -> dict:
    """What identifies the teacher's outputs: the mock function, or every file of its folders.
    When the teacher files are gone but `recorded` (the identity a finished precompute wrote
    in its manifest) exists, that is returned: shards already made stay valid, and only a
    stage that needs the teacher again asks for it."""
    pack = project.pack
    if project.settings.precompute.mock_teacher:
        return pack.build_mock_teacher(project).identity
    try:
        folders = teacher_paths(project)
    except UserError:
        if recorded and "mock" not in recorded:  # a real teacher's record, not the mock's
            return recorded
        raise
    if not folders:
        raise UserError(
            f"{pack.title} has no real teacher to load; turn on precompute.mock_teacher."
        )
    ident = {
        mid: folder_identity(p, project.paths.hashes_json)
        if p.is_dir()
        else {"sha256": file_sha256(p, project.paths.hashes_json)}
        for mid, p in sorted(folders.items())
    }
    return ident["teacher"] if list(ident) == ["teacher"] else ident


def _student_gone(project) -> bool:
    gguf = project.material_path("student")
    return gguf is None or not gguf.is_file()


def _tokenizer_gone(project) -> bool:
    tok = project.material_path("student_tokenizer")
    return tok is None or not (tok / "tokenizer.json").is_file()


def recorded_stand_ins(project, recorded: dict | None) -> list[str]:
    """The materials that are gone and stood in for by the identities `recorded` (a
    precompute manifest's inputs) holds, as the identity functions use them; the stage
    loop's side (Stage.make_inputs) says so in the log, the identities stay silent."""
    recorded = recorded or {}
    out = []
    if _student_gone(project) and recorded.get("student_sha256"):
        out.append("the student GGUF")
    if _tokenizer_gone(project) and recorded.get("student_tokenizer"):
        out.append("the student tokenizer")
    teacher = recorded.get("teacher")
    if not project.settings.precompute.mock_teacher and teacher and "mock" not in teacher:
        try:
            teacher_paths(project)
        except UserError:
            out.append("the teacher files")
    return out


def tokenizer_identity(project, recorded: dict | None = None) -> dict:
    """What identifies the student tokenizer (its ids are in every shard): every file of its
    folder by content (folder_identity), or the recorded identity when the folder is gone."""
    if _tokenizer_gone(project) and recorded:
        return recorded
    _gguf, tok = student_paths(project)
    return folder_identity(tok, project.paths.hashes_json)


def student_identity(project, recorded: str | None = None) -> str:
    """sha256 of the student GGUF (cached), or the recorded one when the file is gone."""
    if _student_gone(project) and recorded:
        return recorded
    gguf, _tok = student_paths(project)
    return file_sha256(gguf, project.paths.hashes_json)


# ---------------------------------------------------------------- trusting the teacher's code


def _project_teacher(project):
    """The teacher folder whose code the project would run, or None (no remote code, the mock
    teacher, or no teacher folder yet)."""
    if not project.pack.remote_code or project.settings.precompute.mock_teacher:
        return None
    root = project.material_path("teacher")
    return root if root is not None and Path(root).is_dir() else None


def project_trust_status(project) -> dict | None:
    """trust_status of the project's teacher snapshot, or None when nothing needs trusting."""
    root = _project_teacher(project)
    return None if root is None else trust.trust_status(root)


def confirm_project_trust(project) -> dict | None:
    """The user trusts the project's teacher code as it is now (`--trust-remote-code`, the
    GUI's button); None when nothing needs trusting."""
    root = _project_teacher(project)
    return None if root is None else trust.confirm_trust(root)


def require_project_trust(project) -> None:
    """Before a run starts: UserError with how to confirm when the teacher's code is not
    trusted (the teacher loader checks again before importing anything)."""
    root = _project_teacher(project)
    if root is not None:
        trust.require_trust(root, project.dir)
