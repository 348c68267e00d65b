"""The Qwen special token ids ggk 0.9.7 hard-codes (qwen2_tokenizer.cpp 93-97 and the
qwen2_special_tokens() table, in id order from 151643), named once for every module that
needs one: the student, the template pads, the vision splices and the teachers; and the
vision tokens' text, as every family's template spells them.
"""

PAD_ID = 151643  # <|endoftext|>: the pad, and the engine's one id for an empty prompt
VISION_START_ID = 151652  # <|vision_start|>
VISION_END_ID = 151653  # <|vision_end|>
IMAGE_PAD_ID = 151655  # <|image_pad|>: one per vision row, spliced over by vision_proj

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"  # one per vision row in a template (the engine expands each image)
