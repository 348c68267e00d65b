"""Hub repos with the real layout of the packs' materials, for tests/hub_server.py.

    hub_server.add_repo(T5_REPO, tiny_t5_files())      # passes the T5 pack's check_teacher
    hub_server.add_repo(TOK_REPO, tokenizer_files())
    hub_server.add_repo(VIDPROM_REPO, vidprom_files(n_rows), repo_type="dataset")
"""

from __future__ import annotations

from gguf_trainer.packs import get_pack
from gguf_trainer.teachers.t5_tiny import DEMO_DIR

T5_REPO = "callgg/t5-v1_1-xxl-encoder-bf16"
TOK_REPO = "callgg/pig-clip-tokenizer"
VIDPROM_REPO = "WenhaoWang/VidProM"
VIDPROM_CSV = "VidProM_unique.csv"


def tiny_t5_files() -> dict[str, bytes]:
    """The shipped tiny real T5 snapshot under the names the T5 pack downloads, plus a file
    the pack does not want (it must not be fetched)."""
    (teacher,) = get_pack("t5xxl_pixart").teacher_materials
    files = {name: (DEMO_DIR / name).read_bytes() for name in teacher.patterns}  # real bytes only
    files["README.md"] = b"not wanted"
    return files


def tokenizer_files() -> dict[str, bytes]:
    return {name: b"{}" for name in ("config.json", "generation_config.json", "tokenizer.json",
                                     "tokenizer_config.json", "vocab.json", "merges.txt")}


def vidprom_prompt(i: int) -> str:
    return f"a slow pan over a misty valley at dawn, shot {i}, cinematic"


def vidprom_files(n_rows: int) -> dict[str, bytes]:
    """VidProM_unique.csv with the real columns (uuid, prompt, time, 6 NSFW scores)."""
    head = "uuid,prompt,time,toxicity,obscene,identity_attack,insult,threat,sexual_explicit\n"
    rows = "".join(f'{i:08d},"{vidprom_prompt(i)}",2024-03-01,0.01,0,0,0,0,0\n'
                   for i in range(n_rows))
    return {VIDPROM_CSV: (head + rows).encode(), "VidProM_embed.hdf5": b"not wanted"}
