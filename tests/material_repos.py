"""Hub repos with the real layout of the packs' materials, for tests/hub_server.py.

    hub_server.add_repo(T5_REPO, tiny_t5_files())      # passes the T5 pack's check_teacher
    hub_server.add_repo(TOK_REPO, tokenizer_files())
    hub_server.add_repo(VIDPROM_REPO, vidprom_files(n_rows), repo_type="dataset")
"""

from __future__ import annotations

from gguf_trainer.packs import get_pack
from gguf_trainer.tiny.t5_tiny import DEMO_DIR

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


def pig_clip_header_gguf(path, hidden: int = 1024, layers: int = 28, vocab: int = 151936,
                         tiny_key: bool = False):
    """A GGUF whose header has pig_clip's layout (embedding table and `layers` blocks) and
    whose data region is a sparse hole: what discovery reads, without 300 MB on disk."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter

    from gguf_trainer.base.paths import TINY_GGUF_KEY

    writer = GGUFWriter(str(path), "qwen3")
    if tiny_key:
        writer.add_string(TINY_GGUF_KEY, "stand-in")
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    shapes.update({f"model.layers.{i}.input_layernorm.weight": (hidden,) for i in range(layers)})
    total = 0
    for name, shape in shapes.items():
        nbytes = int(np.prod(shape)) * 2
        writer.add_tensor_info(name, shape, np.dtype(np.float16), nbytes,
                               raw_dtype=GGMLQuantizationType.F16)
        total += -(-nbytes // 32) * 32  # each tensor's data is aligned to 32 bytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    with open(path, "r+b") as f:  # the data region: a hole the size the header promises
        end = f.seek(0, 2)
        f.truncate(-(-end // 32) * 32 + total)
    return path


def pig_clip_tokenizer_files(hidden: int = 1024, vocab: int = 151936) -> dict[str, bytes]:
    """tokenizer_files() whose config.json declares a student's hidden size and vocabulary."""
    import json

    config = json.dumps({"hidden_size": hidden, "vocab_size": vocab}).encode()
    return {**tokenizer_files(), "config.json": config}
