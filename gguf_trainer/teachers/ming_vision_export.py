"""The Ming-Image vision companion: `<base>_vision-f16.gguf` (pig_ming_vision-f16.gguf beside
pig_ming_adapter-f16.gguf) for ggk's `--llm_vision`, written from the same released snapshot the
teacher reads.

What ggk 0.9.7 reads (gk-diffuser.cpp 1154-1172: a Ming-Image --llm_vision that is not a llama.cpp
mmproj loads under "text_encoders.llm."; ming_image_te.hpp 86-130 detect_vision,
MingImageVisionRunner 1097-1237): `vision.*` (the Qwen2.5-VL tower: patch_embed.proj, blocks.N.
{norm1, norm2, attn.qkv, attn.proj, mlp.gate_proj/up_proj/down_proj}, merger.{ln_q, mlp.0,
mlp.2}) and `linear_proj.{0,2}.*`, the release's own names. Types: ≥2-D tensors f16, 1-D f32;
the 5-D Conv3d patch kernel [out, 3, 2, 14, 14] as the 4-D [out*3, 2, 14, 14] (ggml ne
[14, 14, 2, 3*out]: Conv3d's parameter, llm.hpp / ggml_extend.hpp Conv3d). No key/value is read;
`general.name` and `ming_vision.source` say what it is. Tensors stream one at a time.

    dest = vision_file_for(Path("out/pig_ming_adapter-f16.gguf"))   # out/pig_ming_vision-f16.gguf
    info = write_ming_vision_gguf(snapshot_root, dest)  # {"path", "n_tensors", "rebuilt", "bytes"}
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from gguf_trainer.base.atomic import atomic_path
from gguf_trainer.base.errors import UserError

log = logging.getLogger(__name__)
ARCH = "pig"
SUFFIX = "_vision-f16.gguf"
SOURCE = "inclusionAI/Ming-Image-0.1-Design mllm (vision + linear_proj)"
PREFIXES = ("vision.", "linear_proj.")


def vision_file_for(adapter_gguf) -> Path:
    """`<dir>/<base>_vision-f16.gguf` for `<dir>/<base>[_adapter]-f16.gguf`."""
    p = Path(adapter_gguf)
    base = p.name.removesuffix(".gguf").removesuffix("-f16").removesuffix("_adapter")
    return p.with_name(base + SUFFIX)


def _sources(root: Path) -> dict[str, str]:
    from gguf_trainer.teachers.ming_release import MLLM, weight_map

    names = {n: f for n, f in weight_map(Path(root) / MLLM).items() if n.startswith(PREFIXES)}
    if not any(n.startswith("vision.") for n in names) or not any(
            n.startswith("linear_proj.") for n in names):
        raise UserError(f"{Path(root) / MLLM} holds no vision tower (vision.* and "
                        "linear_proj.*); download the teacher again or turn the vision "
                        "export off.")
    return names


def gguf_shape(name: str, shape: tuple) -> tuple:
    """The torch shape the file stores: Conv3d kernels flattened to 4-D."""
    if len(shape) == 5:
        return (shape[0] * shape[1], *shape[2:])
    return tuple(shape)


def is_current(root: Path, dest: Path) -> bool:
    if not dest.is_file():
        return False
    folder = Path(root) / "mllm"
    newest = max(p.stat().st_mtime for p in folder.glob("*.safetensors"))
    return dest.stat().st_mtime >= newest


def write_ming_vision_gguf(root, dest, force: bool = False) -> dict:
    """The companion from snapshot `root` into `dest`, atomically, unless it is already current
    (`rebuilt` False)."""
    import gguf
    import torch
    from safetensors import safe_open

    root, dest = Path(root), Path(dest)
    if not force and is_current(root, dest):
        n = len(gguf.GGUFReader(dest).tensors)
        return {"path": str(dest), "n_tensors": n, "rebuilt": False, "bytes": dest.stat().st_size}
    names = _sources(root)
    folder = root / "mllm"
    order = sorted(names)
    shapes, dtypes = {}, {}
    for file in sorted(set(names.values())):
        with safe_open(str(folder / file), "pt") as f:
            for n in order:
                if names[n] == file:
                    shapes[n] = gguf_shape(n, tuple(f.get_slice(n).get_shape()))
                    dtypes[n] = np.dtype(np.float32 if len(shapes[n]) == 1 else np.float16)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest) as tmp:
        writer = gguf.GGUFWriter(tmp, ARCH)
        writer.add_name(dest.name.removesuffix(".gguf"))
        writer.add_string("ming_vision.source", SOURCE)
        for n in order:
            writer.add_tensor_info(n, shapes[n], dtypes[n],
                                   int(np.prod(shapes[n], dtype=np.int64)) * dtypes[n].itemsize)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        handles = {}
        try:
            for n in order:
                f = handles.get(names[n]) or handles.setdefault(
                    names[n], safe_open(str(folder / names[n]), "pt"))
                t = f.get_tensor(n).reshape(shapes[n])
                torch_dtype = torch.float32 if dtypes[n] == np.float32 else torch.float16
                writer.write_tensor_data(t.to(torch_dtype).numpy())
        finally:
            handles.clear()
        writer.close()
        n_bytes = tmp.stat().st_size
    log.info("export: wrote %s: %d vision tensors from %s", dest, len(order), folder)
    return {"path": str(dest), "n_tensors": len(order), "rebuilt": True, "bytes": n_bytes}
