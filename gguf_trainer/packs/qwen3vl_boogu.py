"""Boogu Image pack (text-to-image and edits): pig_clip + a token-aligned adapter with the vision
extension replaces the Qwen3-VL text encoder of Boogu Image (engine-families §2 row 10).

Engine (ggk 0.9.7 conditioner.hpp 3236-3294, `sd_version_is_boogu_image`): start 0 (the system
turn reaches the DiT); `<|im_start|>system\\n` + the text-to-image system prompt ("You are a
helpful assistant that generates high-quality images based on user instructions. The
instructions are as follows.") + `<|im_end|>\\n<|im_start|>user\\n`, the prompt range, then
`<|im_end|>\\n` with no assistant turn (3284-3291). A prompt that is empty or only spaces, tabs and
line breaks takes the EDIT system prompt instead (3244, 3285); with reference images the edit
prompt is followed by `<|vision_start|>` + pads + `<|vision_end|>` per image (3247-3283). No pads;
no out_layers: the DiT reads the final norm.

Edits (3246-3286): each reference image is resized to about 384^2 pixels (`boogu_target_size`,
3258-3263), run by the tower's main merger (encode_image as MageFlow's, no deepstack, plain
positions) and spliced at the row the engine's tokenizer counts for everything before its
`<|image_pad|>` run (3269-3271); the export is token_aligned_vision (vision_proj + vis_in).

Teacher: no citable public source names the repo of Boogu Image's text encoder, so the pack
declares "link a local copy": the Qwen3-VL text encoder of the Boogu Image release (transformers
Qwen3-VL, hidden 4096: Qwen3-VL-8B's shape, 36 layers, ~17.5 GB bf16) with its tokenizer files.
"""

from __future__ import annotations

import math

from gguf_trainer.engine.c_round import c_round
from gguf_trainer.engine.qwen_vl_images import FACTOR
from gguf_trainer.engine.template_ids import Piece
from gguf_trainer.materials.spec import Material

from .token_aligned_qwen_vision import QwenVisionTokenAlignedPack, vision_block

T2I_SYSTEM = ("You are a helpful assistant that generates high-quality images based on user "
              "instructions. The instructions are as follows.")
EDIT_SYSTEM = ("Describe the key features of the input image (color, shape, size, texture, "
               "objects, background), then explain how the user's text instruction should alter or "
               "modify the image. Generate a new image that meets the user's requirements while "
               "maintaining consistency with the original input where appropriate.")


AREA = 384 * 384  # 3258: the target area of a reference image


def boogu_target_size(h: int, w: int) -> tuple[int, int]:
    """(h̄, w̄) of an h×w reference image (3258-3263): β = sqrt(384²/(h·w)) and each side
    max(32, round(side·β/32)·32), in double as the engine computes it (about 384² pixels, no
    cap on a long side)."""
    if h < 1 or w < 1:
        raise ValueError(f"an image of {w}×{h} pixels has no content")
    beta = math.sqrt(AREA / (float(h) * float(w)))
    return tuple(max(FACTOR, c_round(s * beta / FACTOR) * FACTOR) for s in (h, w))


EDIT_PREFIX = "<|im_start|>system\n" + EDIT_SYSTEM + "<|im_end|>\n<|im_start|>user\n"


def boogu_prefix(text: str, images: bool = False) -> str:
    """3284-3286: the edit system prompt with reference images or for a blank prompt (spaces,
    tabs, line breaks only), else the text-to-image one."""
    system = EDIT_SYSTEM if images or not text.strip(" \t\r\n") else T2I_SYSTEM
    return "<|im_start|>system\n" + system + "<|im_end|>\n<|im_start|>user\n"


class BooguPack(QwenVisionTokenAlignedPack):
    id = "qwen3vl_boogu"
    title = "Boogu Image (its Qwen3-VL, final norm; text-to-image and edits)"
    description = ("Replaces the Qwen3-VL text encoder of Boogu Image with pig_clip + a "
                   "token-aligned adapter with the vision extension emitting its final-norm state "
                   "of every template row, reference images included.")
    image_size = staticmethod(boogu_target_size)
    edit_prefix = EDIT_PREFIX
    family = "Boogu Image"
    serves = "Boogu Image (text-to-image, edits)"
    teacher_arch = "qwen3_vl"
    teacher_hidden = 4096
    teacher_taps = ()
    suffix = "<|im_end|>\n"
    start = 0
    default_name = "qwen3vl_boogu_adapter"
    shard_contract = "qwen3vl_boogu/2"  # 2: edits, images spliced, raw vision rows stored
    engine_template = {"file": "diffusion/src/conditioning/conditioner.hpp", "lines": (3237, 3294),
                       "version": "VERSION_BOOGU_IMAGE"}
    teacher_materials = (
        Material("teacher", "Teacher: Boogu Image's Qwen3-VL (link a local copy)", "hf_snapshot",
                 size_gb=17.5, hint="the Qwen3-VL folder of the Boogu Image release (transformers "
                 "Qwen3-VL with its vision tower, hidden 4096, ~17.5 GB bf16) with its tokenizer "
                 "files"),
    )
    teacher_memory_gib = 17.5
    # a text prompt (the default corpus); an edit sample adds ~144 rows per ~384² reference
    # image and their raw vision rows (~2.7 MB per image at 4096)
    typical_rows = 40 + 60
    hints = {"train": "Targets: the Qwen3-VL final norm (4096) of every row, system turn included.",
             "eval": "Judge by cos against the mean baseline (no reference run)."}
    engine_command_template = (
        "ggk diffuser engine -- --diffusion-model <boogu-image DiT .gguf> --vae <boogu vae .gguf> "
        "--llm {student} --llm-adapter {adapter} --llm_vision <the Qwen3-VL mmproj .gguf> "
        "--ref-image pig.png -p \"make the pig hold a sign that says GGUF\" -o out.png")
    engine_teacher_args = "--llm <the Boogu Image Qwen3-VL text encoder .gguf>"
    engine_notes = (("Text-to-image: the same adapter without --ref-image and --llm_vision."),)
    export_kv = {"adapter.teacher_tap": "final norm", "adapter.family": "Boogu Image"}

    def student_pieces(self, sample, image_tokens=()):
        """The engine's pieces: the system turn (edit with images), one block per reference
        image (one piece, images included), the prompt range, `<|im_end|>\\n`."""
        prefix = boogu_prefix(sample.text, bool(sample.images)) + "".join(
            vision_block(n) for n in image_tokens)  # 3274-3281
        return (Piece(prefix), Piece(sample.text, prompt=True), Piece(self.suffix))

    def format_prompt(self, text: str) -> str:
        return boogu_prefix(text) + text + self.suffix


PACK = BooguPack()
