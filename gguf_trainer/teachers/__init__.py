"""Real teachers: the models whose outputs an adapter learns to reproduce.

One module per teacher family (`t5`: the T5-XXL v1.1 encoder of the PixArt pack;
`queryformer`: LLaDA-Image's QueryFormer and TextProjection; `qwen3vl`: Qwen3-VL-4B's vision
tower and text stack as ggk's MageFlow conditioner runs them). A teacher is loaded from
resolved material paths and a placement mode, answers `lengths`/`targets` for precompute
(see `packs.base.Teacher`) and frees its memory on `close()`. Packs build them in their
`build_teacher` hook; nothing here knows projects or settings. Importing this package
imports nothing heavy: torch and transformers load inside the modules that need them.
"""
