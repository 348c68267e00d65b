"""teachers/ming.py video_positions: the video-rope t/h/w positions of a Ming sequence as
ming_image_te.hpp 842-875 lays them (the engine tier compares the whole thinker; this pins the
layout on the fast tier)."""

from __future__ import annotations

import torch

from gguf_trainer.teachers.ming import video_positions


def test_text_then_the_query_bank():
    pos, img = video_positions(3, 4)
    # prompt 0,1,2; <image> 3; the bank a 1x4 frame at t=4, w centred (offset (4-1)//2 = 1)
    assert pos[0].tolist() == [0, 1, 2, 3, 4, 4, 4, 4, 5]
    assert pos[1].tolist() == [0, 1, 2, 3, 4, 4, 4, 4, 5]
    assert pos[2].tolist() == [0, 1, 2, 3, 3, 4, 5, 6, 5]
    assert img.tolist() == [False] * 4 + [True] * 4 + [False]


def test_a_reference_image_block_inside_the_prompt():
    # prompt of 9: 2 text, a 2x3 image run from 2, 1 text; then <image>, a 1x2 bank, </image>
    pos, img = video_positions(9, 2, (2, 2, 3))
    t, h, w = pos.tolist()
    assert t[:2] == [0, 1] and t[2:8] == [2] * 6
    assert h[2:8] == [2, 2, 2, 3, 3, 3]          # row - (2-1)//2 = row
    assert w[2:8] == [1, 2, 3, 1, 2, 3]          # col - (3-1)//2 = col - 1
    assert t[8] == 3 and t[9] == 4               # text after the image at t + 1; <image>
    assert t[10:12] == [5, 5] and w[10:12] == [5, 6] and t[12] == 6
    assert img.tolist() == [False] * 2 + [True] * 6 + [False] * 2 + [True] * 2 + [False]
    assert pos.dtype == torch.long
