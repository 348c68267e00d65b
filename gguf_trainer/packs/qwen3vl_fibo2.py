"""Fibo 2.0 pack (text-to-image and edits): pig_clip + a 15-tap layerwise adapter with the vision
extension replaces the Qwen3-VL-4B-Instruct text encoder of Fibo 2.0 (engine-families §2 row 18).

Engine (ggk 0.9.7 conditioning/fibo2.hpp): the prompt `<|im_start|>user\\n{caption}<|im_end|>\\n
<|im_start|>assistant\\n` (227) tokenized as one piece (`{0, 0}`, 322-332), start 0, max 4096; the
caption is plain text as typed, a JSON object cleaned and dumped, and the empty prompt the null
caption (`format_prompt`, 88-151, ported in engine/fibo2.py); taps {5, 7, 9, 11,
13, 16, 18, 20, 22, 24, 27, 29, 31, 33, 35} (39-42); the stack must be 15 x 2560 = 38400 wide
(336-340).

Normalisation. `get_learned_condition` hands `make_bundles` whatever `encode_prompt` returned
(342): the full teacher's taps and an adapter's output alike. make_bundles RMS-normalises every
tap (eps 1e-6, no weight), rounds to bf16 and gathers the bundles (167-195). So the adapter emits
the RAW tap stack and the engine normalises it once; the targets here are the raw taps
(tests/unit/packs/test_layerwise_packs.py pins it against fibo2.hpp's arithmetic).

Teacher: Qwen3-VL-4B (hidden 2560, 36 layers; fibo2.hpp 49-53, the `qwen3vl-4b-it` GGUF of the
ggk README).

Edits (fibo2.hpp 127-142, 213-320). With N reference images the caption becomes the compact JSON
{"image": M} (N = 1) or {"image_1": M, "image_2": M, ...}, then "structured_caption" (a JSON
prompt's caption, when not empty) and "edit_instruction" (its edit_instruction, or the whole
prompt when it has none), M = `<|vision_start|><|image_pad|><|vision_end|>`; image i's marker
(the first `<|image_pad|>` after image i - 1's run) is expanded to its n_i vision rows and the
whole template is still one piece. Each reference (loaded with 3 channels) is scaled to 768 px on
its long side when longer (llround, antialiased bicubic rounded to 8 bit), then to the
processor's 32-px grid (engine/fibo2.py), and shown as 2·v − 1. With --llm-adapter the engine
runs the tower's main merger only (no deepstack, 282), splices vision_proj of those rows over the
pads for the student and hands the raw rows to vis_in (conditioner.hpp 2676-2695): the adapter
needs both (217-221), so the export is layerwise + vision_proj + vis_in. The teacher runs the
full Qwen3-VL path instead (deepstack after the first decoder layers, M-RoPE image positions:
teachers/qwen_taps.py), which is what the DiT was trained on. Start 0: the DiT reads every row,
image rows included. What ggk does BEFORE the conditioner (model.hpp 46-58, gk-diffuser.cpp
6017-6072): a single reference is scaled to cover the render size (-W/-H, else its own size
rounded to 16 px) and centre-cropped (Lanczos), several each to a ~1 MP bucket; the conditioner
then sees that crop. Training feeds each corpus picture to the conditioner's steps as it is.
"""

from __future__ import annotations

from dataclasses import replace

from gguf_trainer.engine.fibo2 import (
    expand_markers,
    fibo2_caption,
    fibo2_target_size,
    preprocess_fibo2,
)
from gguf_trainer.engine.qwen_ids import IMAGE_PAD_ID
from gguf_trainer.engine.template_ids import Piece
from gguf_trainer.engine.template_padding import Padding

from .layerwise import LayerwisePack
from .teacher_repos import QWEN3VL_4B, QWEN3VL_4B_TEACHER

FIBO2_WIDTH = 2560  # kTextWidth


class Fibo2Pack(LayerwisePack):
    id = "qwen3vl_fibo2"
    title = "Fibo 2.0 text-to-image and edits (Qwen3-VL-4B, 15 taps)"
    description = (
        "Replaces the Qwen3-VL-4B-Instruct text encoder of Fibo 2.0 (text-to-image and edits with "
        "reference images) with pig_clip + a layerwise adapter with the vision extension emitting "
        "the raw 15-layer stack (38400 wide); the engine normalises and bundles it."
    )
    family = "Fibo 2.0"
    serves = "Fibo 2.0 Dev (text-to-image, edits)"
    vis_dim = FIBO2_WIDTH  # the merger writes the text stack's width (vision_proj, vis_in)
    image_pad_id = IMAGE_PAD_ID
    image_size = staticmethod(fibo2_target_size)
    taps = (5, 7, 9, 11, 13, 16, 18, 20, 22, 24, 27, 29, 31, 33, 35)
    one_piece = True
    padding = Padding(max_length=4096)  # kMaxLength: encode_prompt cuts longer templates, pads none
    max_len_student = max_len_teacher = 4096
    default_name = "qwen3vl_fibo2_adapter"
    shard_contract = "qwen3vl_fibo2/2"  # 2: edits, images spliced, raw vision rows stored
    # Fibo2Conditioner builds the template itself: format_prompt and its helpers, resize_8bit
    # (members), get_learned_condition from its image count through the prompt and the
    # reference-image loop (lines) and the encode_prompt call with its range, start and max
    # length (call)
    engine_template = {
        "file": "diffusion/src/conditioning/fibo2.hpp",
        "lines": (212, 321),
        "members": ((30, 43), (57, 151), (198, 208)),
        "call": (322, 332),
        "version": "VERSION_FIBO2",
    }
    teacher_materials = (QWEN3VL_4B_TEACHER,)
    teacher_memory_gib = 9.0
    # a text prompt; an edit sample adds up to 576 rows per reference (768² px) and its raw
    # vision rows (~2.9 MB per image at 2560)
    typical_rows = 200
    hints = {
        "train": "Targets: the 15 RAW Qwen3-VL-4B layers (the engine RMS-normalises them itself).",
        "eval": "Judge by cos and the per-tap cosines against their mean baselines.",
    }
    engine_command_template = (
        "ggk --diffusion-model <fibo2 dev DiT .gguf> --vae pig_flux2_vae_fp32-f16.gguf --llm "
        "{student} "
        '--llm-adapter {adapter} -p "a sheep in sunglasses" --cfg-scale 5 --steps 20 '
        "--sampling-method euler --diffusion-fa -o out.png"
    )
    engine_notes = (
        (
            "Edits: add --llm_vision <mmproj-qwen3vl-4b .gguf> --ref-image pig.png and write the "
            "instruction as the prompt (or a JSON caption with \"edit_instruction\"); the tower "
            "sees each reference at most 768 px a side."
        ),
    )
    export_kv = {
        "adapter.teacher": QWEN3VL_4B,
        "adapter.teacher_tap": "layers 5,7,...,35 (raw)",
        "adapter.family": "Fibo 2.0",
    }

    def format_prompt(self, text: str) -> str:
        return self.prefix + fibo2_caption(text) + self.suffix

    def student_pieces(self, sample, image_tokens=()):
        """One piece (the engine parses no prompt range): the template with the edit JSON when
        the sample has images, each marker expanded to its image's vision rows."""
        if not sample.images:
            return (Piece(self.format_prompt(sample.text)),)
        prompt = self.prefix + fibo2_caption(sample.text, len(sample.images)) + self.suffix
        return (Piece(expand_markers(prompt, image_tokens)),)

    def tap_layout(self):
        """The text taps, and the pictures as fibo2.hpp prepares them for the tower."""
        return replace(super().tap_layout(), image_preprocess=preprocess_fibo2)

    def teacher_gib(self, materials, device) -> float:
        """The text stack AND the vision tower (edits run it) as they load: bf16 on a card, fp32
        on a CPU, from the snapshot's headers."""
        import torch

        from ..teachers.qwen3vl import check_snapshot

        mode = "gpu" if torch.device(device).type == "cuda" else "cpu"
        return check_snapshot(materials["teacher"]).gib(mode)

    def demo_corpus(self, folder, prompts):
        """The MageFlow demo's synthetic pictures (64-160 px) in one- and two-image edit
        samples, plus the text-only prompts."""
        from gguf_trainer.tiny.mageflow_demo import write_demo_corpus

        return write_demo_corpus(folder, prompts)

    def build_mock_teacher(self, project):
        from .mock import MockVisionTokenTeacher

        return MockVisionTokenTeacher(self.id, self.out_dim, self.vis_dim, preprocess_fibo2,
                                      sup_start_text=self.start, sup_start_image=self.start)


PACK = Fibo2Pack()
