"""What a material is: something a pack needs on disk (a Hugging Face snapshot or a local
file), and the two every pack shares (the student GGUF and its tokenizer snapshot).

Packs declare their materials with `Material`; `materials.materials` resolves them in a
project, `materials.hub` downloads them. Must not: import packs or read a project.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Material:
    """Something a pack needs on disk: a Hugging Face snapshot or a local file."""

    id: str
    title: str
    kind: str  # "hf_snapshot" | "local_file"
    repo: str = ""
    patterns: tuple[str, ...] = ()
    subdir: str = ""
    required: bool = True
    size_gb: float = 0.0
    repo_type: str = "model"
    suffixes: tuple[str, ...] = ()
    hint: str = ""
    wanted_when: str = ""  # optional materials: a dotted setting that, when on, makes it wanted

    @property
    def is_downloadable(self) -> bool:
        """A Hub snapshot with a repo to fetch it from. A snapshot no citable repo holds (a
        pack's "link a local copy" teacher) is only ever linked, never downloaded."""
        return self.kind == "hf_snapshot" and bool(self.repo)


def link_sentence(material: Material, project_dir: object) -> str:
    """The one sentence for a snapshot no repo holds: where to get it and the command that
    links it (the GUI's words turn the command into Setup → Materials: Replace). The status
    row, `new`, `download` and Download all say this one."""
    what = material.hint or "a complete copy"
    return (f"no public repo holds it, so it is never downloaded: get {what}, then link it "
            f"(`gguf-trainer link --project {project_dir} {material.id} PATH`)")


# Shared by every pack: the student GGUF and its tokenizer/config snapshot.
STUDENT_MATERIALS = (
    Material("student", "Student: pig_clip GGUF", "local_file", suffixes=(".gguf",),
             hint="pig_clip-f16.gguf: every recipe trains against the f16 file"),
    Material("student_tokenizer", "Student tokenizer + config", "hf_snapshot",
             repo="callgg/pig-clip-tokenizer", subdir="pig-clip-tokenizer", size_gb=0.011,
             # What load_student reads (the config and the BPE files); the material is
             # "ready" when these are whole, so no file the tool never opens is required.
             patterns=("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
                       "merges.txt")),
)
