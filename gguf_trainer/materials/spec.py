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
