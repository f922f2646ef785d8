"""Waiting on a condition with a deadline: the one poll loop of the tests, the demos and the
benchmarks (tests/helpers.py, supervisor/demos/fleet.py and bench/common.py wrap it).

"Ready" means one thing everywhere: the condition returned something truthy, which is then
returned (a value found, True). None, False, 0 and an empty collection all mean "not yet".
Each caller words the timeout its own way (a failed test, a demo that could not show what
it claims, a benchmark run that cannot be trusted) from `WaitTimeout`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """The condition was not met within `timeout` seconds."""

    def __init__(self, what: str, timeout: float) -> None:
        super().__init__(f"timed out after {timeout:g} s waiting for {what}")
        self.what = what
        self.timeout = timeout


def wait_until(
    condition: Callable[[], T | None],
    timeout: float,
    what: str,
    *,
    first_poll: float = 0.001,
    max_poll: float = 0.05,
) -> T:
    """Poll `condition` until it returns something truthy and return that; raise
    WaitTimeout after `timeout` seconds. The poll interval starts at `first_poll` and
    doubles up to `max_poll` (a quick answer is seen quickly, a slow one costs little)."""
    deadline = time.monotonic() + timeout
    delay = first_poll
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise WaitTimeout(what, timeout)
        time.sleep(delay)  # a poll interval: the condition itself is what is waited for
        delay = min(delay * 2, max_poll)


__all__ = ["WaitTimeout", "wait_until"]
