"""Handlers for the poison-pill and time-limit tests, imported by real worker processes
(``tests.poison_handlers:exits``). A payload {"poison": true} triggers the bad behaviour;
any other payload completes at once."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Any

from queue_worker.worker.handlers import TaskContext, time_limit


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


# -- results and errors a record cannot carry (each a FAIL, never a worker crash) --------------


def huge_result(payload: Any) -> Any:
    """Returns a result over the record limit: {"poison": true, "size": n} gives a string of
    n bytes, with "keys": n a dict of n keys."""
    if _poison(payload):
        if "keys" in payload:
            return {str(k): k for k in range(payload["keys"])}
        return "x" * payload["size"]
    return payload


class _ItemsRaise(dict[str, Any]):
    """A dict whose items() raises: msgpack packs a dict subclass through items()."""

    def items(self) -> Any:
        raise RuntimeError("items() refused")


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ refused")


def unencodable(payload: Any) -> Any:
    """{"poison": "result"}: returns a dict whose items() raises; {"poison": "error"}:
    raises an exception whose __str__ raises."""
    if isinstance(payload, dict) and payload.get("poison") == "result":
        return _ItemsRaise(a=1)
    if isinstance(payload, dict) and payload.get("poison") == "error":
        raise _Unprintable()
    return payload


# -- what a handler leaves behind -------------------------------------------------------------


def leaves_a_thread(payload: Any) -> Any:
    """Starts a non-daemon thread that never ends (the interpreter's exit would join it)."""
    if _poison(payload):
        threading.Thread(target=threading.Event().wait, name="left-by-handler").start()
    return payload


def jumps_the_clock(payload: Any) -> Any:
    """{"poison": true, "jump_s": s}: from now on this worker process's wall clock reads `s`
    seconds off (time.time_ns, which every `at` of its records is read from)."""
    if _poison(payload):
        real = time.time_ns
        offset_ns = int(payload["jump_s"] * 1e9)
        time.time_ns = lambda: real() + offset_ns
    return payload


def always_fails(payload: Any) -> Any:
    """Raises on every payload: each task uses up its attempts and is dead."""
    raise ValueError(f"always fails: {payload!r}")
