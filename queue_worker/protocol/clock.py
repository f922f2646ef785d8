"""The wall clock the records carry: integer microseconds since the Unix epoch.

Every `at` in a claims record and every `enqueued_at` in a task record is read from here
(or from a clock injected in its place, so tests can step time by hand). It is the
writer's wall clock, not a monotonic one: records from different processes are compared
with each other, and only the wall clock means the same thing in all of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: what a worker or producer is given as its clock: () -> microseconds since the epoch
Clock = Callable[[], int]

MICROS_PER_SECOND = 1_000_000


def now_us() -> int:
    """The wall clock in integer microseconds since the Unix epoch."""
    return time.time_ns() // 1000


def seconds_to_us(seconds: float) -> int:
    return round(seconds * MICROS_PER_SECOND)


def us_to_seconds(micros: int) -> float:
    return micros / MICROS_PER_SECOND


def offset_clock(offset_us: int) -> Clock:
    """The wall clock shifted by `offset_us`."""
    if offset_us == 0:
        return now_us
    return lambda: now_us() + offset_us
