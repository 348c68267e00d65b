"""The one way tests wait: poll a state until it holds, with a deadline that only a hang reaches.

Tests wait on states, never on speed (a busy 2-core machine runs everything several times
slower), so the deadlines are generous bounds, not expectations: a passing test returns as soon
as its state holds. GGUF_TRAINER_TEST_PATIENCE multiplies every deadline for a slower machine.
"""

from __future__ import annotations

import os
import time

PATIENCE = float(os.environ.get("GGUF_TRAINER_TEST_PATIENCE", "1"))


def wait_for(predicate, timeout_s: float = 300.0, what: str = "", every_s: float = 0.05):
    """predicate()'s first truthy value; AssertionError naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s * PATIENCE
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s * PATIENCE:.0f} s waiting for "
                         f"{what or predicate} (last: {last!r})")
