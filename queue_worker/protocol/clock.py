"""The wall clock the records carry: integer microseconds since the Unix epoch.

Every `at` in a claims record and every `enqueued_at` in a task record is read from here
(or from a clock injected in its place, so tests can step time by hand). It is the
writer's wall clock, not a monotonic one: records from different processes are compared
with each other, and only the wall clock means the same thing in all of them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Final

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


#: A test and demo hook: a worker process started with this in its environment reads a wall
#: clock that is off by this many seconds (a float, + ahead, - behind), as on a machine
#: whose clock is wrong. `qw up` passes its environment to its workers, so one supervisor's
#: workers can be skewed while another's are not (tests/test_redis_hosts.py).
CLOCK_OFFSET_ENV: Final = "QW_CLOCK_OFFSET_S"


def offset_clock(offset_us: int) -> Clock:
    """The wall clock shifted by `offset_us`."""
    if offset_us == 0:
        return now_us
    return lambda: now_us() + offset_us


def process_clock(environ: Mapping[str, str] = os.environ) -> Clock:
    """The clock a worker process reads: the wall clock, offset by $QW_CLOCK_OFFSET_S when
    it is set. Raises ValueError naming a value that is not a number of seconds."""
    text = environ.get(CLOCK_OFFSET_ENV)
    if text is None or not text.strip():
        return now_us
    try:
        offset = float(text)
    except ValueError:
        raise ValueError(
            f"{CLOCK_OFFSET_ENV}={text!r} is not a number of seconds (e.g. 300 or -90.5)"
        ) from None
    if offset != offset or abs(offset) > 10 * 365 * 86400:  # NaN, or beyond ten years
        raise ValueError(f"{CLOCK_OFFSET_ENV}={text!r} is out of range (at most ten years)")
    return offset_clock(seconds_to_us(offset))
