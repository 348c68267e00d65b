"""The tiny adapter geometry shared by the adapter, export and inspect tests."""

from gguf_trainer.model.adapters import AdapterConfig

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
