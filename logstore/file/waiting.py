"""Waiting for a file to change: Linux inotify when it is there, a short adaptive poll if not.

An idle reader blocked in `InotifyWaiter.wait` sleeps in poll(2) on an inotify descriptor
watching the log for IN_MODIFY, which every write and truncate raises: it uses no CPU and
wakes within tens of µs of an append. inotify is reached through ctypes (no dependency).

The lost-wake-up race is closed by ordering: the watch exists before the first check, and
events are consumed *before* the condition is checked, then the waiter blocks. An append
that lands after the check raises an event that ends the block; one that lands before the
check is seen by the check.

A waiter holds a descriptor: close it with `close()`. A forked child must not use its
parent's waiter (the file log makes a new one after a fork).
"""

from __future__ import annotations

import math
import os
import select
import sys
import time
from collections.abc import Callable
from typing import Protocol

IN_MODIFY = 0x0000_0002
IN_NONBLOCK = 0o0004000
IN_CLOEXEC = 0o2000000

_EVENTS_BUFFER = 64 * 1024
#: the fallback poll's first and longest sleep, seconds
POLL_MIN = 0.0005
POLL_MAX = 0.02


class Waiter(Protocol):
    def wait(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Return True as soon as `ready()` is true, False if `timeout` seconds pass first."""

    def close(self) -> None: ...


class _Inotify:
    """The three libc calls, bound once per process."""

    def __init__(self) -> None:
        import ctypes  # only a process that waits pays for it (~3 ms of a command's start)

        libc = ctypes.CDLL(None, use_errno=True)
        self.init1 = libc.inotify_init1
        self.init1.argtypes = [ctypes.c_int]
        self.init1.restype = ctypes.c_int
        self.add_watch = libc.inotify_add_watch
        self.add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.add_watch.restype = ctypes.c_int


_inotify: _Inotify | None = None


def _libc_inotify() -> _Inotify:
    global _inotify
    if _inotify is None:
        _inotify = _Inotify()
    return _inotify


class InotifyWaiter:
    """Blocks on an inotify descriptor that watches one file for IN_MODIFY."""

    def __init__(self, path: str) -> None:
        api = _libc_inotify()
        fd = api.init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            import ctypes

            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        if api.add_watch(fd, os.fsencode(path), IN_MODIFY) < 0:
            import ctypes

            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"inotify_add_watch {path}: {os.strerror(err)}")
        self.fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def _drain(self) -> None:
        # poll(0) rather than reading until EAGAIN: no exception per call.
        while self._poll.poll(0):
            os.read(self.fd, _EVENTS_BUFFER)

    def wait(self, ready: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        self._drain()  # old events; from here on, an event means a change after the check
        while True:
            if ready():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            # EINTR is retried (PEP 475). One read takes every queued event (16 bytes each)
            # unless more than a buffer's worth piled up; those only cause an early re-check.
            if self._poll.poll(math.ceil(remaining * 1000)):
                os.read(self.fd, _EVENTS_BUFFER)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class PollWaiter:
    """Checks `ready()` with sleeps that grow from 0.5 ms to 20 ms (no inotify here)."""

    def wait(self, ready: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        delay = POLL_MIN
        while True:
            if ready():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, POLL_MAX)

    def close(self) -> None:
        pass


def make_waiter(path: str) -> Waiter:
    """An inotify waiter on `path` where the kernel offers one, else a polling waiter.

    inotify can also be refused at run time (the per-user limits of instances, 128 by
    default, or of watches are reached): the caller then polls instead of failing.
    """
    if sys.platform.startswith("linux"):
        try:
            return InotifyWaiter(path)
        except (OSError, AttributeError):  # limits reached, or a libc without inotify
            pass
    return PollWaiter()
