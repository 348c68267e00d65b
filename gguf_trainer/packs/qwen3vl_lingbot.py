"""LingBot Video pack (text-to-video; reference images kept behind a setting): pig_clip + a
token-aligned adapter with the vision extension replaces the Qwen3-VL text encoder of LingBot
Video (engine-families §2 row 11).

Engine (ggk 0.9.7 conditioner.hpp 2971-3049, `sd_version_is_lingbot_video`): the "Enhanced
prompt" system turn + `<|im_start|>user\\n` (2973-2983) is dropped: start = its token count
without 151643 (2985-2991; 140 with the Qwen vocabulary); the prompt follows it with NO prompt
range ({0, 0}, 3047: one unparsed piece, weight syntax is text), then
`<|im_end|>\\n<|im_start|>assistant\\n`; no pads; no out_layers: the DiT reads the final norm.
For I2V the reference images come between the user marker and the prompt as
`<|vision_start|>` + pads + `<|vision_end|>` (2994-3044).

Images (2994-3044): each is resized by `lingbot_target_size` (3001-3022: each side rounded to a
multiple of 32, the area kept within 4·32² .. 16384·32² pixels), run by the tower's main merger
(encode_image as MageFlow's, no deepstack, plain positions) and spliced at the row the engine's
tokenizer counts for everything before its `<|image_pad|>` run (3028-3030), after the dropped
prefix: start stays 140. The export is token_aligned_vision (vision_proj + vis_in).
ggk 0.9.7 never reaches this branch. The image path hands the conditioner references only
when the reference preset's `pass_to_vlm` is on (gk-diffuser.cpp 6193); LingBot Video has no
preset (get_default_ref_image_preset, 3935-3963: "default", RefImageParams.pass_to_vlm false,
model.hpp 20), and generate_image resolves the preset with no user override
(resolve_ref_image_params(nullptr), 6637), so `--ref-image` with `--llm_vision` is not enough;
the video path passes none (prepare_video_generation_embeds, gk-diffuser.cpp 7197-7225; its
sd_vid_gen_params_t has no ref_images), so `-M vid_gen` with an init image conditions on the
text alone. So the corpus trains text samples by default: `corpus.reference_images` (off in a
new project; `takes_images`) keeps the image samples, the tower and the splice for a later ggk
whose LingBot path passes references to the text encoder. The demo turns it on, so the kept
path stays exercised end to end. The export is token_aligned_vision either way (vision_proj is
fitted from the embedding tables; vis_in is untrained without image samples), and the adapter
serves text-to-video.

Teacher: no citable public source names the repo of LingBot Video's text encoder, so the pack
declares "link a local copy": the Qwen3-VL text encoder of the LingBot Video release
(transformers Qwen3-VL, hidden 2560: Qwen3-VL-4B's shape, 36 layers, ~8.9 GB bf16) with its
tokenizer files.
"""

from __future__ import annotations

import math

from gguf_trainer.engine.c_round import c_round
from gguf_trainer.engine.qwen_vl_images import FACTOR
from gguf_trainer.engine.template_ids import Piece
from gguf_trainer.materials.spec import Material

from .token_aligned_qwen_vision import QwenVisionTokenAlignedPack, vision_block

LINGBOT_PREFIX = (
    "<|im_start|>system\nGiven a user input that may include a text prompt alone, "
    "a text prompt with an image reference, or a text prompt with a video reference "
    "or a video reference alone, generate an \"Enhanced prompt\" that provides detailed "
    "visual descriptions suitable for video generation. Evaluate the level of detail "
    "in the user's input: if it is simple, enrich it by adding specifics about colors, "
    "shapes, sizes, textures, lighting, motion dynamics, camera movement, temporal "
    "progression, and spatial relationships to create vivid, concrete, and temporally "
    "coherent scenes to create vivid and concrete scenes. Please generate only the "
    "enhanced description for the prompt below and avoid including any additional "
    "commentary or evaluations:<|im_end|>\n<|im_start|>user\n")

MIN_PIXELS = 4 * FACTOR * FACTOR  # 3004
MAX_PIXELS = 16384 * FACTOR * FACTOR  # 3005


def lingbot_target_size(h: int, w: int) -> tuple[int, int]:
    """(h̄, w̄) of an h×w reference image (3007-3022, in double as the engine): each side
    max(32, round(side/32)·32); an area over 16384·32² scales both by β = sqrt(h·w/max) with
    max(32, ⌊side/β/32⌋·32); an area under 4·32² by β = sqrt(min/(h·w)) with ⌈side·β/32⌉·32."""
    if h < 1 or w < 1:
        raise ValueError(f"an image of {w}×{h} pixels has no content")
    hb, wb = (max(FACTOR, c_round(s / FACTOR) * FACTOR) for s in (h, w))
    area = float(hb) * wb
    if area > MAX_PIXELS:
        beta = math.sqrt(float(h) * w / MAX_PIXELS)
        return tuple(max(FACTOR, math.floor(s / beta / FACTOR) * FACTOR) for s in (h, w))
    if area < MIN_PIXELS:
        beta = math.sqrt(MIN_PIXELS / (float(h) * w))
        return tuple(math.ceil(s * beta / FACTOR) * FACTOR for s in (h, w))
    return hb, wb


class LingBotPack(QwenVisionTokenAlignedPack):
    id = "qwen3vl_lingbot"
    title = "LingBot Video (its Qwen3-VL, final norm; text-to-video)"
    description = ("Replaces the Qwen3-VL text encoder of LingBot Video with pig_clip + a "
                   "token-aligned adapter with the vision extension emitting its final-norm state "
                   "of every row (reference-image samples only with corpus.reference_images: "
                   "no ggk up to 0.9.7 passes them to the text encoder).")
    family = "LingBot Video"
    serves = "LingBot Video (text-to-video)"
    image_size = staticmethod(lingbot_target_size)
    edit_prefix = LINGBOT_PREFIX
    teacher_arch = "qwen3_vl"
    teacher_hidden = 2560
    teacher_taps = ()
    prefix = LINGBOT_PREFIX
    suffix = "<|im_end|>\n<|im_start|>assistant\n"
    one_piece = True  # prompt range {0, 0} (3047): the whole template is one piece
    start = 140
    start_prefix = LINGBOT_PREFIX
    default_name = "qwen3vl_lingbot_adapter"
    shard_contract = "qwen3vl_lingbot/2"  # 2: images spliced, raw vision rows stored
    engine_template = {"file": "diffusion/src/conditioning/conditioner.hpp", "lines": (2972, 3049),
                       "version": "VERSION_LINGBOT_VIDEO"}
    teacher_materials = (
        Material("teacher", "Teacher: LingBot Video's Qwen3-VL (link a local copy)", "hf_snapshot",
                 size_gb=8.9, hint="the Qwen3-VL folder of the LingBot Video release (transformers "
                 "Qwen3-VL with its vision tower, hidden 2560, ~8.9 GB bf16) with its tokenizer "
                 "files"),
    )
    teacher_memory_gib = 9.0
    # Image samples off in a new project: they serve no ggk up to 0.9.7 (the docstring); the demo
    # keeps them on so the kept path is still trained and exported end to end.
    defaults = {**QwenVisionTokenAlignedPack.defaults, "corpus.reference_images": False}
    demo_settings = {"corpus.reference_images": True}
    typical_rows = 140 + 70
    hints = {"train": "Targets: the Qwen3-VL final norm (2560) of every row; rows from 140 reach "
                      "the DiT.",
             "eval": "Judge by cos_slice against the mean baseline (no reference run)."}
    engine_command_template = (
        "ggk diffuser engine -- -M vid_gen --diffusion-model <lingbot-video DiT .gguf> "
        "--vae <lingbot vae .gguf> "
        "--llm {student} --llm-adapter {adapter} -p \"a red fox running through fresh snow\" "
        "--video-frames 33 -o out.avi")
    engine_teacher_args = "--llm <the LingBot Video Qwen3-VL text encoder .gguf>"
    engine_notes = (("Reference images: ggk 0.9.7 hands LingBot Video's text encoder none: "
                     "--ref-image with --llm_vision is not enough (LingBot has no reference "
                     "preset, so pass_to_vlm stays off), and -M vid_gen passes none; the "
                     "adapter reads the text alone."),)
    export_kv = {"adapter.teacher_tap": "final norm", "adapter.family": "LingBot Video"}

    def takes_images(self, settings) -> bool:
        """Reference-image samples only with corpus.reference_images (off in a new project)."""
        return bool(settings.corpus.reference_images)

    def student_pieces(self, sample, image_tokens=()):
        """One unparsed piece (prompt range {0, 0}, 3047): the prefix, one block per reference
        image (2994-3044), the prompt, the assistant turn."""
        blocks = "".join(vision_block(n) for n in image_tokens)
        return (Piece(self.prefix + blocks + sample.text + self.suffix),)


PACK = LingBotPack()
