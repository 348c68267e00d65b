"""The tiny adapter geometry shared by the adapter, export and inspect tests, and the seeded
random weights the adapter, slot-kind and check tests fill an adapter with."""

import torch

from gguf_trainer.model.adapters import AdapterConfig, build_adapter
from gguf_trainer.model.export import write_adapter_gguf

IN, WIDTH, DEPTH, OUT, QUERIES, VOCAB, VIS = 32, 128, 2, 48, 8, 50, 24  # width 128 = 2 heads
CFGS = {
    "resampler": AdapterConfig("resampler", IN, OUT, WIDTH, DEPTH, num_queries=QUERIES),
    "seeded_resampler": AdapterConfig(
        "seeded_resampler", IN, OUT, WIDTH, DEPTH, num_queries=QUERIES, seed_vocab=VOCAB
    ),
    "token_aligned": AdapterConfig("token_aligned", IN, OUT, WIDTH, DEPTH),
    "token_aligned_vision": AdapterConfig(
        "token_aligned_vision", IN, OUT, WIDTH, DEPTH, vis_dim=VIS
    ),
    # three taps of 16 (OUT = 48 = 3 x 16), ascending like the engine's stack
    "layerwise": AdapterConfig("layerwise", IN, OUT, WIDTH, DEPTH, taps=(9, 18, 27)),
}
RANK = 16  # a factorized seed table (seeded_resampler with seed_rank)
FACTORIZED = AdapterConfig(
    "seeded_resampler", IN, OUT, WIDTH, DEPTH, num_queries=QUERIES, seed_vocab=VOCAB, seed_rank=RANK
)


def randomize(m, g: int | torch.Generator = 1):
    """Every parameter of `m` drawn from `g` (a seed, or a generator the caller draws on after):
    matrices ~ N(0, 1/fan_in), vectors ~ N(0, 1/25), so no tensor keeps its init (zeros, ones)
    and a wrong read of any one of them shows. Returns m."""
    if not isinstance(g, torch.Generator):
        g = torch.Generator().manual_seed(g)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / (p.shape[-1] ** 0.5 if p.ndim == 2 else 5))
    return m


def export_random(path, cfg: AdapterConfig, pack: str, tokenizer, seeds=(7, 8)):
    """An adapter of `cfg` with randomize's weights (built under torch seed seeds[0], filled
    from seeds[1]) exported to `path` as pack `pack`'s f16 file with `tokenizer`; returns path."""
    torch.manual_seed(seeds[0])
    m = randomize(build_adapter(cfg), seeds[1])
    write_adapter_gguf(path, m.state_dict(), cfg, metadata={"adapter.pack": pack},
                       tokenizer=tokenizer)
    return path
