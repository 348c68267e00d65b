"""gguf-trainer: train pig_clip adapters for the ggk engine.

The folders are a ladder; each imports only the rungs below it (tests/unit/test_import_graph.py
holds it), bottom up: `base` (errors, atomic writes, locks, paths) -> `engine` (ports of ggk's
tokenizers, templates and image code) and `model` (the student, adapters, GGUF files) -> `data`
(samples, shards, checkpoints, scoring) -> `machine` (devices, placement, disk) -> `teachers` ->
`materials` and `tiny` -> `packs` (kind bases and one file of facts per family) -> `store`
(project.json, results) -> `stages` (corpus, precompute, train, export, evaluate), `check`,
`demo` -> `render` -> `runner` (supervisor, pipeline, control API) -> `ui` -> `cli`.
Importing the package imports nothing heavy.
"""

__version__ = "0.1.0"
