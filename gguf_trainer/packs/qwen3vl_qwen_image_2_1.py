"""Qwen Image 2.1 pack (text-to-image and edits): pig_clip + a token-aligned adapter with the vision
extension replaces the Qwen3-VL-8B text encoder of Qwen Image 2.1 (engine-families §2 row 9).

Engine (ggk 0.9.7 conditioner.hpp 3050-3153, VERSION_QWEN_IMAGE_2_1): the system turn
`<|im_start|>system\\nComprehend and analyze the provided prompt.<|im_end|>\\n` is dropped ("The
DiT never sees the system turn; drop exactly its tokens", 3080-3081: start = its token count, 14);
then `<|im_start|>user\\n`, the prompt range (an empty prompt becomes " ": "Qwen has no bos
token, so an empty prompt leaves nothing to read", 3150-3151), then
`<|im_end|>\\n<|im_start|>assistant\\n`;
no pads; out_layers {num_layers}: the last decoder layer before the final RMSNorm (3082-3083),
resolved from the linked snapshot (36 for Qwen3-VL-8B).

Edits (3085-3145): after the user marker, reference image i as `<image{i+1}><|vision_start|>`
+ pads + `<|vision_end|>`, a space before every image but the first, then the prompt range; start
stays 14. The pipeline has already resized each reference by the render area
(qwen_image_refs.py: gk-diffuser.cpp 6017-6072, nearest, sides multiples of 32); the conditioner
composites the alpha over white and scales to 2x − 1 (conditioner.hpp 3100-3107). The engine with an
adapter needs vision_proj + vis_in (3068-3071) and hands it the tower's MAIN merger rows only
(`encode_image(..., nullptr)` at 3123, no image extras: every rope axis the token index), while the
reference it was distilled from, the full Qwen3-VL-8B, sees the tower WITH its deepstack features
and M-RoPE image positions (conditioner.hpp 3052-3060, llm.hpp 2336-2365, 2442-2469): so the teacher
here runs that full path (the tap teacher, teachers/qwen_taps.py, at the last layer with the tower:
`teacher_full_vision`) and the student stores the main rows.
The DiT never reads the adapter's rows at the image slots: the conditioner tags each context
row with its slot (conditioner.hpp 3782-3797: 0 = text, i + 1 = the pad run of reference i,
from image_embeds[i].first for the image's row count, so `<|vision_start|>`/`<|vision_end|>`
stay text), the DiT's layout makes an image segment of each tagged run (qwen_image_2_1.hpp
74-122) and fills it with img_in(patchify(reference latent)) instead of the context rows
(279-288). So `dit_reads_vision_rows = False`: those rows stay in the adapter's input and
attention (its self-attention sees them, and the teacher's text rows after an image attend to
it), but the shards mark them `target_keep` 0 and the loss, every eval figure (cos_slice, the
headline) and the target moments leave them out; there is no cos_vis for this pack.

Teacher: the engine names the full "Qwen3-VL-8B" (conditioner.hpp 3064-3075) but no citable public
source names the repo of Qwen Image 2.1's text encoder, so the pack declares "link a local copy":
the Qwen3-VL-8B text encoder of the Qwen Image 2.1 release (transformers Qwen3-VL, hidden 4096, 36
layers, ~8.8 B parameters with the tower, ~17.5 GB bf16) with its tokenizer files.
"""

from __future__ import annotations

from gguf_trainer.engine.qwen_ids import IMAGE_PAD
from gguf_trainer.engine.qwen_image_refs import RefImage, default_ref_size, render_area
from gguf_trainer.engine.template_ids import Piece
from gguf_trainer.materials.spec import Material

from .token_aligned_qwen_vision import QwenVisionTokenAlignedPack

SYSTEM_TURN = "<|im_start|>system\nComprehend and analyze the provided prompt.<|im_end|>\n"


class QwenImage21Pack(QwenVisionTokenAlignedPack):
    id = "qwen3vl_qwen_image_2_1"
    title = "Qwen Image 2.1 (Qwen3-VL-8B, last layer; text-to-image and edits)"
    description = ("Replaces the Qwen3-VL-8B text encoder of Qwen Image 2.1 with pig_clip + a "
                   "token-aligned adapter with the vision extension emitting its last decoder "
                   "layer before the norm (4096 wide); text-to-image and edits.")
    family = "Qwen Image 2.1"
    serves = "Qwen Image 2.1 (text-to-image, edits)"
    image_size = staticmethod(default_ref_size)  # at the default 1024×1024 render
    edit_prefix = SYSTEM_TURN + "<|im_start|>user\n"
    teacher_full_vision = True  # deepstack + M-RoPE, at the last layer: the tap teacher
    teacher_arch = "qwen3_vl"
    teacher_hidden = 4096
    tap_last_layer = True
    tiny_layers = 3
    prefix = SYSTEM_TURN + "<|im_start|>user\n"
    suffix = "<|im_end|>\n<|im_start|>assistant\n"
    start = 14
    start_prefix = SYSTEM_TURN
    default_name = "qwen3vl_qwen_image_2_1_adapter"
    # 2: edits, deepstack teacher, raw vision rows; 3: target_keep drops the image slots
    shard_contract = "qwen3vl_qwen_image_2_1/3"
    dit_reads_vision_rows = False  # the DiT puts img_in(reference latent) there (docstring)
    engine_template = {"file": "diffusion/src/conditioning/conditioner.hpp", "lines": (3051, 3153),
                       "version": "VERSION_QWEN_IMAGE_2_1"}
    # Where ggk turns a reference file into the tower's pixels (tests/engine cuts and runs these
    # lines against qwen_image_refs.py): 8-bit to float, the pipeline's size and nearest resize
    # at the render area (preset "qwen"), the conditioner's alpha over white and 2x − 1.
    engine_references = {
        "to_float": ("diffusion/src/core/ggml_extend.hpp", 188, 194),
        "to_tensor": ("diffusion/src/core/util.cpp", 741, 765),
        "resize": ("diffusion/src/gk-diffuser.cpp", 6019, 6057),
        "composite": ("diffusion/src/conditioning/conditioner.hpp", 3101, 3107),
    }
    teacher_materials = (
        Material("teacher", "Teacher: Qwen Image 2.1's Qwen3-VL-8B (link a local copy)",
                 "hf_snapshot", size_gb=17.5,
                 hint="the Qwen3-VL-8B text encoder folder of the Qwen Image 2.1 release "
                 "(transformers Qwen3-VL, hidden 4096, 36 layers, ~17.5 GB bf16) with its "
                 "tokenizer files"),
    )
    teacher_memory_gib = 17.5
    # a text prompt (the default corpus); an edit sample adds ~1024 rows per reference at the
    # 1024×1024 render and their raw vision rows (~8 MB per image at 4096)
    typical_rows = 14 + 70
    max_len_student = max_len_teacher = 2304  # two references at 1024² (2 × 1024) + the text
    hints = {"train": "Targets: the last Qwen3-VL-8B layer before the norm (4096) of every row, "
                      "the teacher seeing its references with deepstack and M-RoPE; rows from "
                      "14 reach the DiT, except the image slots (the reference latents go "
                      "there): inputs only, never in the loss.",
             "eval": "Judge by cos_slice against the mean baseline (no reference run)."}
    engine_command_template = (
        "ggk diffuser engine -- --diffusion-model <qwen-image-2.1 DiT .gguf> "
        "--vae <qwen-image vae .gguf> "
        "--llm {student} --llm-adapter {adapter} --llm_vision <the Qwen3-VL-8B mmproj .gguf> "
        "--ref-image pig.png -W 1024 -H 1024 "
        "-p \"make the pig hold a sign that says GGUF\" -o out.png")
    engine_teacher_args = "--llm <qwen3vl-8b .gguf>"
    engine_notes = (
        "Text-to-image: the same adapter without --ref-image and --llm_vision.",
        ("References are sized by the render (-W x -H; without them, the first reference's "
         "size): the corpus assumes 1024x1024 unless a sample record names its own "
         "\"render\": [W, H]."),
    )
    export_kv = {"adapter.teacher_tap": "last layer (raw)", "adapter.family": "Qwen Image 2.1",
                 "adapter.teacher_vision": "deepstack + M-RoPE (the adapter reads main rows)"}

    def student_pieces(self, sample, image_tokens=()):
        """3079-3152: system turn + user marker, one `<imageN>` block per reference (a space
        before every one but the first, 3128-3143, one piece with the text before the range),
        the range (" " for an empty prompt), the assistant tail."""
        blocks = "".join((" " if i else "") + f"<image{i + 1}><|vision_start|>"
                         + IMAGE_PAD * n + "<|vision_end|>" for i, n in enumerate(image_tokens))
        return (Piece(self.prefix + blocks), Piece(sample.text or " ", prompt=True),
                Piece(self.suffix))

    def format_prompt(self, text: str) -> str:
        return self.prefix + (text or " ") + self.suffix

    def vision_inputs(self, sample):
        """Each reference with the sample's render area (its "render": [W, H], else 1024²)."""
        area = render_area(sample.extra)
        return [RefImage(p, area) for p in sample.images]

    def image_pixels(self, item):
        """A RefImage's pixels; a bare path at the default render (image_size)."""
        return (item if isinstance(item, RefImage) else RefImage(item, render_area({}))).pixels()

    def demo_corpus(self, folder, prompts):
        """The shared demo pictures, each image sample rendered small ("render": [192, 192]:
        6×6 cells, 36 vision rows per reference) so the tiny demo stays quick on a CPU."""
        import json

        from gguf_trainer.base.atomic import write_text

        path = super().demo_corpus(folder, prompts)
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        for r in records:
            if r.get("images"):
                r["render"] = [192, 192]
        write_text(path, "".join(json.dumps(r) + "\n" for r in records))
        return path


PACK = QwenImage21Pack()
