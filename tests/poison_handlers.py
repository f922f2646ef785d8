"""Handlers for the poison-pill and time-limit tests, imported by real worker processes
(``tests.poison_handlers:exits``). A payload {"poison": true} triggers the bad behaviour;
any other payload completes at once."""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

from queue_worker.handlers import TaskContext, time_limit


def _poison(payload: Any) -> bool:
    return isinstance(payload, dict) and payload.get("poison") is True


def exits(payload: Any) -> Any:
    """Kills its worker with os._exit(1): no exception, no FAIL, nothing written."""
    if _poison(payload):
        os._exit(1)
    return payload


def segfaults(payload: Any) -> Any:
    """Kills its worker with SIGSEGV (reads address 0)."""
    if _poison(payload):
        ctypes.string_at(0)
    return payload


def hangs(payload: Any, ctx: TaskContext) -> Any:
    """Never returns on a poison payload, and ignores cancellation (the lease keeps being
    renewed, since the worker is alive): only a time limit ends it."""
    if _poison(payload):
        threading.Event().wait()
    return payload


@time_limit(1)
def hangs_limited(payload: Any) -> Any:
    """`hangs`, with its own time limit of 1 s."""
    if _poison(payload):
        threading.Event().wait()
    return payload


def raises_then_exits(payload: Any, ctx: TaskContext) -> Any:
    """Raises on its first attempt, kills its worker on the later ones."""
    if _poison(payload):
        if ctx.attempt == 1:
            raise ValueError(f"attempt {ctx.attempt} failed")
        os._exit(1)
    return payload
