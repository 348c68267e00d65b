"""C++ rounding as the engine's size rules use it, once: `std::round` / `std::llround` of a
double, halves away from zero. Python's round() rounds halves to even and would give another
image size for shapes whose side lands on a half.
"""

from __future__ import annotations

import math


def c_round(x: float) -> int:
    """std::round / std::llround for x >= 0 (halves away from zero), exact in double."""
    f = math.floor(x)
    return f + 1 if x - f >= 0.5 else f
