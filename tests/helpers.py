"""Helpers for tests: waiting on a condition with a deadline, free ports."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest


def wait_until(
    condition: Callable[[], object], timeout: float = 30.0, what: str = "condition"
) -> object:
    """Poll `condition` until it returns something truthy; fail the test after `timeout`.

    This is the suite's only way to wait for something: a condition with a deadline.
    """
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)  # a poll interval, not a wait for an event
        delay = min(delay * 2, 0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
