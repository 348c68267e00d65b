"""Real teachers: the models whose outputs an adapter learns to reproduce.

One module per teacher (`t5`: the T5 / UMT5 encoders of the T5 packs, PixArt, Chroma, Wan;
`llada` with `queryformer`: LLaDA-Image's LLaDA2-MoE, QueryFormer and TextProjection;
`qwen3vl`: Qwen3-VL with its vision tower as ggk's MageFlow-style conditioners run it;
`qwen_taps`: the raw decoder layers of a Qwen3 / Qwen3-VL text stack for the layerwise and
token-aligned families), with their shared placement (`offload`, `placement`) and snapshot
checks. A teacher is loaded from resolved material paths and a placement mode, answers
`lengths`/`targets` for precompute (the `Teacher` protocol in `base.py`) and frees its memory
on `close()`. Packs build them in their `load_teacher` hook, passing templates and windows
as arguments; nothing here knows packs, projects or settings. Importing this package
imports nothing heavy: torch and transformers load inside the modules that need them.
"""
