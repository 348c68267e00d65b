"""`gguf-trainer check`: an exported adapter against the engine's own conditioning dump.

Owns: reading a ggk `SD_DUMP_COND` dump folder (headerless little-endian f32 `[rows, dim]`, with
`tokens.txt` / `t5_ids.txt` beside it; engine-contract §4b), running the student + the adapter
GGUF on the same prompt, and the figures: first the centred cosine of the rows the DiT reads,
`tokens` and `pads` apart (each set centred on the dump's own mean of its rows, per tap for a
stack: data/dit_rows.py's lead for one prompt), then the cosine, centred cosine (by the dump's
own per-dimension mean) and rel_mse of all rows, with the pack's verdict in its own metric.
Packs whose engine output has a fixed shape (LLaDA-Image, the T5 families: only the rows the DiT
reads count, by the dump's `t5_ids.txt` — the real slots, EOS included, and for Chroma the first
pad; TrainerPack.check_rows) and the layerwise families (the whole padded template,
`adapter_out.bin` or the full teacher's `llm_hidden.bin` of n * D per row, compared from the
DiT's first row, with each tap's cosine beside the whole stack's) can be checked; a layerwise
adapter with the vision extension (Fibo 2.0 edits) also against an edit dump, whose reference
images it reads from the dump itself (`vis_embeds.bin`, the raw mmproj rows, and `vis_pos.txt`,
the row each image was spliced at): the student gets vision_proj of them spliced there, the
adapter the raw rows. A T5 dump's ids are compared with the prompt's through the teacher's
tokenizer: `--t5-model`, else the project's linked teacher (`--project`, and the render of a
project). With a project, the adapter, student and student tokenizer not given are the project's
(check_inputs). The slot kinds (qwen35_bridge, ming_image: a row per teacher token, Ming's 256
caption rows before them, a FLUX.3 bank) are checked against the engine's run of the file
(slot_dumps.py).
Must not: write anything.

Modules: dump_files (reading a dump), figures (compare, the lead, the verdict), run (the pack,
the forward, the id checks, the text), slot_dumps (the slot kinds).

    gguf-trainer check --adapter pig_llada_adapter-f16.gguf --student pig_clip-f16.gguf \
        --dump dumps/run1 --prompt "a sheep in sunglasses"
    gguf-trainer check --project DIR --dump D --prompt P   # its export, student, T5 tokenizer
"""

from __future__ import annotations

from .dump_files import (
    DUMP_FILES,
    MAX_IDS_BYTES,
    NO_T5_MODEL,
    QWEN_HIDDEN,
    T5_IDS_TXT,
    TOKENS_TXT,
    VIS_EMBEDS,
    VIS_POS,
    read_dump,
    read_ids,
    read_vision_dump,
)
from .figures import compare, lead_figures, lead_rows, lead_text, tap_figures, verdict_line
from .run import (
    FIXED_KINDS,
    _pack_for,
    check_inputs,
    check_main,
    check_seed_ids,
    format_check,
    predict,
    ref_name,
    run_check,
)
from .slot_dumps import SEED_IDS_TXT, SLOT_KINDS, slot_check

__all__ = [
    "DUMP_FILES", "FIXED_KINDS", "MAX_IDS_BYTES", "NO_T5_MODEL", "QWEN_HIDDEN", "SEED_IDS_TXT",
    "SLOT_KINDS", "T5_IDS_TXT", "TOKENS_TXT", "VIS_EMBEDS", "VIS_POS", "_pack_for",
    "check_inputs", "check_main", "check_seed_ids", "compare", "format_check", "lead_figures",
    "lead_rows", "lead_text", "predict", "read_dump", "read_ids", "read_vision_dump", "ref_name",
    "run_check", "slot_check", "tap_figures", "verdict_line",
]
