"""The SigVQ companion of a LLaDA-Image adapter: `<base>_sigvq-f16.gguf` for ggk's `--llm_vision`.

Owns: the file name next to the adapter, the conversion (every tensor of
`sigvq/diffusion_pytorch_model.safetensors` as f16 under its verbatim HF name, no prefix,
`general.name` = the file stem and no other KV; engine-contract §5.3), the read-back check
(count, names, f16) and the "newer source" rebuild rule. Tensors stream one at a time, so a
2.4 GB source never sits in memory twice. Must not: know about projects or packs.

    dest = sigvq_file_for(Path("out/pig_llada_adapter-f16.gguf"))  # out/pig_llada_sigvq-f16.gguf
    info = write_sigvq_gguf(source, dest)       # {"path", "n_tensors", "rebuilt", "bytes"}
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from gguf_trainer.base.atomic import atomic_path
from gguf_trainer.base.errors import UserError

log = logging.getLogger(__name__)
ARCH = "pig"  # as the adapter files; the engine reads no KV of this file
SOURCE = Path("sigvq") / "diffusion_pytorch_model.safetensors"  # inside the teacher snapshot
SUFFIX = "_sigvq-f16.gguf"


def sigvq_file_for(adapter_gguf) -> Path:
    """`<dir>/<base>_sigvq-f16.gguf` for `<dir>/<base>[_adapter]-f16.gguf` (the shipped pair is
    pig_llada_adapter-f16.gguf + pig_llada_sigvq-f16.gguf)."""
    p = Path(adapter_gguf)
    base = p.name.removesuffix(".gguf").removesuffix("-f16").removesuffix("_adapter")
    return p.with_name(base + SUFFIX)


def source_in(root) -> Path | None:
    """The SigVQ safetensors inside a snapshot folder, or None when it is absent."""
    if root is None:
        return None
    path = Path(root) / SOURCE
    return path if path.is_file() else None


def is_current(source: Path, dest: Path) -> bool:
    """The companion exists and is not older than its source."""
    return dest.is_file() and dest.stat().st_mtime >= source.stat().st_mtime


def _readback(path: Path, want: list[str]) -> None:
    """Programmer errors: the file must hold exactly the source's tensors, all f16."""
    import gguf

    reader = gguf.GGUFReader(path)
    names = [t.name for t in reader.tensors]
    if len(names) != len(want) or set(names) != set(want):
        raise RuntimeError(f"SigVQ companion reads back {len(names)} tensors, wrote {len(want)}")
    bad = [t.name for t in reader.tensors if t.tensor_type != gguf.GGMLQuantizationType.F16]
    if bad:
        raise RuntimeError(f"SigVQ companion has non-f16 tensors: {bad[:3]}")


def write_sigvq_gguf(source, dest, force: bool = False) -> dict:
    """Convert `source` (safetensors) to the f16 GGUF `dest`, atomically, unless `dest` is
    already current (`rebuilt` False). UserError for an unreadable source."""
    import gguf
    import torch
    from safetensors import SafetensorError, safe_open

    source, dest = Path(source), Path(dest)
    if not force and is_current(source, dest):
        n = len(gguf.GGUFReader(dest).tensors)
        return {"path": str(dest), "n_tensors": n, "rebuilt": False, "bytes": dest.stat().st_size}
    try:
        st = safe_open(str(source), framework="pt")
        names = list(st.keys())
    except (SafetensorError, OSError) as e:
        raise UserError(
            f"{source} cannot be read as safetensors ({e}); download the SigVQ material "
            "again or turn export.export_sigvq off."
        ) from None
    if not names:
        raise UserError(f"{source} holds no tensors; download the SigVQ material again.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest) as tmp:
        writer = gguf.GGUFWriter(tmp, ARCH)
        writer.add_name(dest.name.removesuffix(".gguf"))
        for name in names:  # shapes from the header only: nothing is loaded yet
            shape = st.get_slice(name).get_shape()
            writer.add_tensor_info(
                name, shape, np.dtype(np.float16), int(np.prod(shape, dtype=np.int64)) * 2
            )
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for name in names:
            writer.write_tensor_data(st.get_tensor(name).to(torch.float16).numpy())
        writer.close()
        _readback(tmp, names)
        n_bytes = tmp.stat().st_size
    log.info("export: wrote %s: %d f16 tensors from %s", dest, len(names), source)
    return {"path": str(dest), "n_tensors": len(names), "rebuilt": True, "bytes": n_bytes}
