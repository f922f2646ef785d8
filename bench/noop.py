"""The benchmark handler: does nothing, so a drain measures the queue and not the work.

handler = "bench.noop:noop"
"""

from __future__ import annotations

from typing import Any


def noop(payload: Any) -> None:
    """Accept any payload, do nothing, return nothing (a DONE with a nil result)."""
    return None
