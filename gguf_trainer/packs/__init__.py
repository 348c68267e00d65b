"""The pack registry. Packs register here; everything else asks `get_pack(id)`."""

from __future__ import annotations

from gguf_trainer.base.errors import UserError

from .base import ADAPTER_KINDS, TrainerPack

_PACKS: dict[str, TrainerPack] = {}


def register(pack: TrainerPack) -> TrainerPack:
    """Add a pack (also from outside the package, e.g. a plugin or a test module)."""
    if pack.adapter_kind not in ADAPTER_KINDS:
        raise ValueError(f"pack {pack.id!r}: adapter_kind must be one of {ADAPTER_KINDS}")
    _PACKS[pack.id] = pack
    return pack


def pack_ids() -> list[str]:
    return list(_PACKS)


def get_pack(pack_id: str) -> TrainerPack:
    try:
        return _PACKS[pack_id]
    except KeyError:
        raise UserError(f"unknown pack {pack_id!r}; choose one of {', '.join(_PACKS)}.") from None


def _register_builtin() -> None:
    from . import llada_image, qwen3vl_mageflow, t5xxl_chroma, t5xxl_pixart, umt5xxl_wan

    for module in (t5xxl_pixart, qwen3vl_mageflow, llada_image, t5xxl_chroma, umt5xxl_wan):
        register(module.PACK)
    from . import (
        qwen3_flux2_klein,
        qwen3vl_fibo2,
        qwen3vl_flux3,
        qwen3vl_ideogram4,
        qwen3vl_krea2,
        qwen3vl_sefi,
    )

    # the layerwise families (engine-families §2 rows 6, 13-18)
    for module in (qwen3vl_krea2, qwen3vl_flux3, qwen3vl_fibo2, qwen3vl_ideogram4, qwen3vl_sefi,
                   qwen3_flux2_klein):
        register(module.PACK)
    from . import (
        qwen3_ovis,
        qwen3_zimage,
        qwen3vl_boogu,
        qwen3vl_lingbot,
        qwen3vl_minimax_h3,
        qwen3vl_qwen_image_2_1,
    )

    # the token-aligned Qwen families (engine-families §2 rows 4, 5, 9-12)
    for module in (qwen3_zimage, qwen3_ovis, qwen3vl_minimax_h3, qwen3vl_qwen_image_2_1,
                   qwen3vl_boogu, qwen3vl_lingbot):
        register(module.PACK)
    from . import ming_image, qwen35_bridge

    # the slot-resampler families (engine-families §2 rows 20-21)
    register(qwen35_bridge.PACK)
    register(ming_image.PACK)


_register_builtin()
