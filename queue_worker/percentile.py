"""The nearest-rank percentile: the one definition the workers' claim latencies, the report's
margins and the benchmarks' figures all use (queue_worker.worker.stats and bench.common wrap it
with their answer for no values at all)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

N = TypeVar("N", int, float)


def nearest_rank(sorted_values: Sequence[N], q: float) -> N:
    """The value at rank round(q·(n-1)) of an ascending, non-empty sequence (0 <= q <= 1;
    outside, the nearest end). IndexError for an empty one: what none is, the caller says."""
    if not sorted_values:
        raise IndexError("the percentile of no values")
    rank = max(0, min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1))))
    return sorted_values[rank]


__all__ = ["nearest_rank"]
