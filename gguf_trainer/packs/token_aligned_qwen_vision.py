"""What the token-aligned Qwen packs that take reference images share (Boogu Image edits,
LingBot Video I2V): the export is token_aligned_vision (the project's ridge-fitted
`vision_proj` + a trained `vis_in`), and the teacher is the Qwen3-VL teacher with its tower
(teachers/qwen3vl.py), given the family's declarations instead of MageFlow's:

  * `edit_prefix`: the text before the first image (the splice rows count from its tokens, as
    the engine's tokenizer counts everything before each image's `<|image_pad|>` run);
  * one `<|vision_start|>` + pads + `<|vision_end|>` block per image (`vision_block`), no
    `Image i:` header;
  * `image_size`: the family's resize rule, (h, w) -> (h̄, w̄), used by the tower, the corpus
    refusals and the engine tier;
  * `start`: the first row the DiT reads, with or without images.

The tower's main merger rows only (no deepstack) at plain positions: the engine calls
`encode_image(..., false, true, true)` for these families and passes no image extras
(conditioner.hpp 3029, 3266). A pack still writes its own `student_pieces` (where the blocks
go is the family's template). A family whose TEACHER runs the full Qwen3-VL (Qwen Image 2.1:
deepstack + M-RoPE image positions, at its tap, while the adapter still gets the main merger
rows alone) sets `teacher_full_vision`: its teacher is the tap teacher (teachers/qwen_taps.py)
with the tower, shown the family's pixels; one whose pictures are not sized from the path alone
(Qwen Image 2.1: by the render) hands its own `vision_inputs(sample)` and `image_pixels(item)`.
"""

from __future__ import annotations

from gguf_trainer.engine.qwen_ids import IMAGE_PAD, IMAGE_PAD_ID, VISION_END, VISION_START

from .token_aligned_qwen import QwenTokenAlignedPack


def vision_block(n: int) -> str:
    """One reference image of n vision tokens as these families write it."""
    return VISION_START + IMAGE_PAD * n + VISION_END


class QwenVisionTokenAlignedPack(QwenTokenAlignedPack):
    """Base of the token-aligned Qwen packs with reference images (not registered itself)."""

    adapter_kind = "token_aligned_vision"
    image_pad_id = IMAGE_PAD_ID
    edit_prefix = ""  # the template's text before the first image
    teacher_full_vision = False  # the teacher sees deepstack + M-RoPE positions (Qwen Image 2.1)

    @property
    def vis_dim(self) -> int:  # type: ignore[override]
        return self.teacher_hidden  # Qwen3-VL's merger writes the text stack's width

    def teacher_template(self):
        """The family's declarations as the Qwen3-VL teacher takes them (teachers import no
        pack): the engine counts the rows before each image with its tokenizer."""
        from ..teachers.qwen3vl import Template

        return Template(self.edit_prefix, self.start, self.format_prompt(""), self.start, 1,
                        image_header=VISION_START, counts_hard_coded=False,
                        image_size=self.image_size, family=self.family, prepare=self.image_pixels)

    def image_pixels(self, item):
        """(3, h̄, w̄) float32 pixels of one vision input, as the engine preprocesses it."""
        from gguf_trainer.engine.qwen_vl_images import preprocess_image

        return preprocess_image(item, self.image_size)

    def tap_layout(self, num_layers: int = 0):
        """A full-vision family's layout shows the tap teacher its pictures as the engine does."""
        from dataclasses import replace

        layout = super().tap_layout(num_layers)
        if not self.teacher_full_vision:
            return layout
        return replace(layout, image_preprocess=self.image_pixels,
                       vision_inputs=self.vision_inputs)

    def load_teacher(self, materials, plan, device):
        """Qwen3-VL with its tower (the final norm is its last_hidden_state), placed as
        planned; the template's image header checked against its tokenizer first. A
        full-vision family: the tap teacher at its tap, with the tower (qwen_taps)."""
        from ..teachers.qwen3vl import load_qwen3vl_teacher

        if self.teacher_full_vision:
            return super().load_teacher(materials, plan, device)
        return load_qwen3vl_teacher(materials["teacher"], device, plan.mode,
                                    student_pieces=self.student_pieces,
                                    template=self.teacher_template(), ram_limit_gib=plan.cpu_gib)

    def check_teacher(self, materials) -> str:
        from ..teachers.qwen3vl import check_snapshot

        return (check_snapshot(materials["teacher"]).summary()
                + f"; the DiT reads {self.teacher_tap_text()}")

    def teacher_gib(self, materials, device) -> float:
        """The tower and the text stack as they load (bf16 on a card, fp32 on a CPU), from the
        snapshot's headers; the family's figure while the folder holds no weights."""
        from pathlib import Path

        import torch

        from ..teachers.qwen3vl import check_snapshot

        if not any(Path(materials["teacher"]).glob("*.safetensors")):
            return self.teacher_memory_gib
        mode = "gpu" if torch.device(device).type == "cuda" else "cpu"
        return check_snapshot(materials["teacher"]).gib(mode)

    def demo_corpus(self, folder, prompts):
        """The MageFlow demo's synthetic pictures (64-160 px) in one- and two-image samples,
        plus the text-only prompts; each family sizes them by its own rule."""
        from gguf_trainer.tiny.mageflow_demo import write_demo_corpus

        return write_demo_corpus(folder, prompts)

    def demo_materials(self, folder):
        """A tiny real Qwen3-VL with its vision tower (tiny/qwen3vl.py)."""
        from ..tiny.qwen3vl import copy_tiny_qwen3vl

        return {"teacher": copy_tiny_qwen3vl(folder / f"{self.id}-teacher-tiny")}

    def build_mock_teacher(self, project):
        from .mock import MockVisionTokenTeacher

        return MockVisionTokenTeacher(self.id, self.out_dim, self.vis_dim, self.image_pixels,
                                      sup_start_text=self.start, sup_start_image=self.start)
