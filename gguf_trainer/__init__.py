"""gguf-trainer: train pig_clip adapters for the ggk engine.

The package is layered (see style.md §1): `cli`/`ui` -> `runner` -> stage modules
(`corpus precompute train export evaluate`) -> libraries (`student adapters shards
adapter_file`) -> torch / gguf / transformers. Importing the package imports nothing heavy.
"""

__version__ = "0.1.0"
