"""Ming-Image's own vision path for edits: the Qwen2.5-VL tower of the released snapshot (mllm/
`vision.*`) + `linear_proj` (Linear, GELU, Linear) + L2 normalise, the rows an input image puts
over its <imagePatch> run in the Ling thinker (modeling_bailingmm2 extract_image_feature) and the
rows the Ming adapter takes as vis_in keys / vis_q slot seeds (never the student's input).

The tower is transformers' Qwen2_5_VisionTransformerPretrainedModel on the snapshot's
`vision_config` (the names are the release's, loaded strictly); ggk 0.9.7 runs the same weights
from the pig_ming_vision companion (teachers/ming_vision_export.py) as MingImageVisionRunner, which
hard-codes 16 heads, 112 px windows and full attention at blocks 7/15/23/31
(ming_image_te.hpp 86-130): a config that differs is refused in one sentence.

Pixels: the engine's preprocess_vision_image (ming_image_te.hpp 137-157) resizes to
vision_input_size (two smart_resize passes: 4..1024 28-px patches, then the fixed 451,584-px
area) and CLIP-normalises; `patchify` turns such a (3, H, W) tensor into the tower's input rows
(Qwen2VLImageProcessor's flattening: the frame twice for the temporal patch, 2x2 merge windows).

    vision = load_ming_vision(root)                      # from a released snapshot
    rows = vision.encode(image_chw_normalised)           # (H/28 * W/28, hidden) unit rows
    rows = encode_paths(vision, paths)                   # per picture, .grid = (gh, gw)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gguf_trainer.base.errors import UserError

PATCH, MERGE, TEMPORAL = 14, 2, 2
FACTOR = PATCH * MERGE
# what MingImageVisionRunner hard-codes (ming_image_te.hpp 112-123)
ENGINE_VISION = {"num_heads": 16, "window_size": 112, "patch_size": PATCH,
                 "spatial_merge_size": MERGE, "temporal_patch_size": TEMPORAL}
ENGINE_FULL_ATTENTION = (7, 15, 23, 31)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def vision_config(raw: dict):
    """Qwen2_5_VLVisionConfig of the snapshot's vision_config; one sentence where ggk would
    run the tower otherwise."""
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig

    keys = ("depth", "hidden_size", "intermediate_size", "out_hidden_size", "num_heads",
            "window_size", "patch_size", "spatial_merge_size", "temporal_patch_size",
            "fullatt_block_indexes", "in_channels", "hidden_act")
    cfg = Qwen2_5_VLVisionConfig(**{k: raw[k] for k in keys if k in raw})
    for k, v in ENGINE_VISION.items():
        if getattr(cfg, k) != v:
            raise UserError(f"the snapshot's vision_config has {k} {getattr(cfg, k)}; ggk "
                            f"0.9.7 runs the Ming tower with {v}.")
    full = tuple(i for i in ENGINE_FULL_ATTENTION if i < cfg.depth)
    if tuple(cfg.fullatt_block_indexes) != full:
        raise UserError(f"the snapshot's vision tower attends fully at blocks "
                        f"{list(cfg.fullatt_block_indexes)}; ggk 0.9.7 at {list(full)}.")
    return cfg


class MingVision(nn.Module):
    """`vision` (the tower) + `linear_proj` under the release's names."""

    def __init__(self, cfg, hidden: int):
        super().__init__()
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
            Qwen2_5_VisionTransformerPretrainedModel,
        )

        cfg._attn_implementation = "sdpa"
        self.vision = Qwen2_5_VisionTransformerPretrainedModel(cfg)
        self.linear_proj = nn.Sequential(nn.Linear(cfg.out_hidden_size, hidden), nn.GELU(),
                                         nn.Linear(hidden, hidden))

    @torch.no_grad()
    def encode(self, image: torch.Tensor) -> torch.Tensor:
        """image (3, H, W), CLIP-normalised, H and W multiples of 28 -> (H/28 * W/28, hidden)
        rows, L2-normalised, in raster order of the merged grid."""
        pixels, grid = patchify(image)
        dtype = self.linear_proj[0].weight.dtype
        feats = self.vision(pixels.to(dtype), grid_thw=grid).pooler_output
        return F.normalize(self.linear_proj(feats), dim=-1)


def patchify(image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(3, H, W) -> the tower's (grid_h * grid_w, 3 * 2 * 14 * 14) rows and grid_thw [[1, gh, gw]]
    (Qwen2VLImageProcessor: one image is two identical frames; rows ordered by 2x2 merge
    window)."""
    c, h, w = image.shape
    if h % FACTOR or w % FACTOR:
        raise ValueError(f"image sides must be multiples of {FACTOR}, got {h}x{w}")
    gh, gw = h // PATCH, w // PATCH
    x = image.float().unsqueeze(0).expand(TEMPORAL, c, h, w)
    x = x.reshape(1, TEMPORAL, c, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return (x.reshape(gh * gw, c * TEMPORAL * PATCH * PATCH),
            torch.tensor([[1, gh, gw]], dtype=torch.long))


def smart_resize(height: int, width: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """bailingmm_utils.smart_resize as the engine ports it (ming_image_te.hpp 55-73)."""
    import math

    h_bar = max(FACTOR, round(height / FACTOR) * FACTOR)
    w_bar = max(FACTOR, round(width / FACTOR) * FACTOR)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = math.floor(height / beta / FACTOR) * FACTOR
        w_bar = math.floor(width / beta / FACTOR) * FACTOR
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / FACTOR) * FACTOR
        w_bar = math.ceil(width * beta / FACTOR) * FACTOR
    return max(FACTOR, h_bar), max(FACTOR, w_bar)


def vision_input_size(height: int, width: int) -> tuple[int, int]:
    """The tower's input size for an image (ming_image_te.hpp 78-81): 576 rows at 672x672."""
    first = smart_resize(height, width, 4 * FACTOR * FACTOR, 1024 * FACTOR * FACTOR)
    return smart_resize(*first, 451584, 451584)


def preprocess(rgb: torch.Tensor) -> torch.Tensor:
    """(3, H, W) in 0..1 -> (3, h, w) at vision_input_size, bicubic with antialias, clamped,
    CLIP-normalised (the engine's preprocess_vision_image; resamplers differ in the last bits,
    so the engine tier compares the tower on already-sized pixels)."""
    h, w = vision_input_size(rgb.shape[1], rgb.shape[2])
    x = F.interpolate(rgb[None].float(), size=(h, w), mode="bicubic", antialias=True,
                      align_corners=False)[0].clamp(0, 1)
    mean = torch.tensor(CLIP_MEAN)[:, None, None]
    std = torch.tensor(CLIP_STD)[:, None, None]
    return (x - mean) / std


def load_ming_vision(root, dtype=None) -> MingVision:
    """The tower + linear_proj of a released snapshot (mllm/config.json vision_config, the
    vision.* / linear_proj.* tensors of its shards), strict."""
    from pathlib import Path

    from gguf_trainer.teachers.ming_release import MLLM, _json, _read, weight_map

    folder = Path(root) / MLLM
    raw = _json(folder / "config.json")
    if not isinstance(raw.get("vision_config"), dict):
        raise UserError(f"{folder / 'config.json'} has no vision_config: this snapshot cannot "
                        "encode reference images.")
    hidden = int(raw.get("llm_config", {}).get("hidden_size", 2048))
    model = MingVision(vision_config(raw["vision_config"]), hidden)
    wmap = weight_map(folder)
    wanted = model.state_dict()
    missing = sorted(set(wanted) - set(wmap))
    if missing:
        raise UserError(f"{folder} lacks {missing[0]} (and {len(missing) - 1} more) of the "
                        "vision tower; download the teacher again.")
    state = _read(folder, {k: wmap[k] for k in wanted})
    wrong = [k for k, v in wanted.items() if tuple(state[k].shape) != tuple(v.shape)]
    if wrong:
        raise UserError(f"{folder}: {wrong[0]} is {tuple(state[wrong[0]].shape)}, not the "
                        f"vision_config's {tuple(wanted[wrong[0]].shape)}.")
    model.load_state_dict(state)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval().requires_grad_(False)


def encode_paths(model: MingVision, paths, device="cpu") -> list[torch.Tensor]:
    """Each picture (a path) through `preprocess` and the tower: (gh * gw, hidden) float32 rows
    on the CPU, the merged grid (gh, gw) riding on them as `.grid` (the thinker's M-RoPE block,
    ming_image_te.hpp's ImageBlock grid_h / grid_w; conditioner.hpp 4069-4071)."""
    import numpy as np
    from PIL import Image, ImageOps

    out = []
    for path in paths:
        try:
            with Image.open(path) as im:
                rgb = np.asarray(ImageOps.exif_transpose(im).convert("RGB"), dtype=np.float32)
        except OSError as e:
            raise UserError(f"{path} is not a readable image ({e}); rebuild the corpus.") from None
        x = preprocess(torch.from_numpy(rgb / 255.0).permute(2, 0, 1))
        rows = model.encode(x.to(device)).float().cpu()
        rows.grid = (x.shape[1] // FACTOR, x.shape[2] // FACTOR)
        out.append(rows)
    return out
