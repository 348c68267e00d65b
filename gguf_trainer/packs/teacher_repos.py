"""The public teacher snapshots that several packs share: one Material per repo, so projects of
different families that condition on the same encoder download (and the materials library
keeps) one copy with one file list. A pack whose teacher is private says so in its own file.
"""

from __future__ import annotations

from gguf_trainer.materials.spec import Material

QWEN3VL_4B = "Qwen/Qwen3-VL-4B-Instruct"
QWEN3VL_8B = "Qwen/Qwen3-VL-8B-Instruct"
QWEN3_4B = "Qwen/Qwen3-4B"

_TEXT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "model-*.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
)
# The vision packs (MageFlow edits, the Fibo 2.0 and Qwen Image 2.1 edit modes) also read the
# image processor's settings; the text-only packs of the same repo ignore the two small files.
_VL_FILES = _TEXT_FILES + ("preprocessor_config.json", "chat_template.json")

# Sizes are the snapshots' weights in decimal GB (the disk check's unit); 4.44B parameters in
# bf16 are 8.9 GB, the "~8.3 GB" the product README quotes in GiB.
QWEN3VL_4B_TEACHER = Material("teacher", "Teacher: Qwen3-VL-4B-Instruct", "hf_snapshot",
                              repo=QWEN3VL_4B, subdir="Qwen3-VL-4B-Instruct", size_gb=8.9,
                              patterns=_VL_FILES)
QWEN3VL_8B_TEACHER = Material("teacher", "Teacher: Qwen3-VL-8B-Instruct", "hf_snapshot",
                              repo=QWEN3VL_8B, subdir="Qwen3-VL-8B-Instruct", size_gb=17.5,
                              patterns=_VL_FILES)
QWEN3_4B_TEACHER = Material("teacher", "Teacher: Qwen3-4B", "hf_snapshot", repo=QWEN3_4B,
                            subdir="Qwen3-4B", size_gb=8.1, patterns=_TEXT_FILES)

# The T5-XXL v1.1 encoder in bf16 (4.76B parameters): PixArt's and Chroma's teacher (FLUX.1's
# text_encoder_2 is the same encoder; engine-families §2 rows 1-2).
T5_V1_1_XXL = "callgg/t5-v1_1-xxl-encoder-bf16"
T5_V1_1_XXL_TEACHER = Material(
    "teacher",
    "Teacher: T5-XXL v1.1 encoder (bf16)",
    "hf_snapshot",
    repo=T5_V1_1_XXL,
    subdir="t5-v1_1-xxl-encoder-bf16",
    size_gb=9.5,
    patterns=(
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "spiece.model",
        "tokenizer_config.json",
    ),
)
