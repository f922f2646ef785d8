"""Time limits: ending a worker whose task runs too long.

A Python thread cannot be stopped from outside, and a handler that ignores its context's
cancellation flag (or blocks in C code) would run, and renew its lease, for ever. So, as
Celery's hard time limit and Dramatiq's TimeLimit do, a watchdog ends the whole worker
process instead: `TimeLimits` keeps one daemon thread per worker that, when the task in hand
has run past its time limit,

1. calls the worker's `on_expiry(error)`, which appends a FAIL for the attempt under the
   worker's claim (it still holds the task, so the fold accepts it): a retry time with
   backoff, or dead when the attempts are used up, like an exception; then
2. ends the process with EXIT_TIME_LIMIT (`os._exit`: no clean-up that a stuck handler could
   block). The supervisor restarts the slot, and does not count that exit as a crash.

A task's limit is its handler's own (`@time_limit(s)` in `queue_worker.worker.handlers`), else the
worker's `--task-timeout`. A drain (SIGTERM) gives the task in hand `drain_timeout_s` more at
most, limit or none: a drain always ends.

Costs: without a limit or a drain timeout nothing runs. With one, arming a task takes a lock
and wakes the thread only when this task's deadline is nearer than the thread's next wake-up
(it looks at least every POLL_S, which is also how it sees a drain begin: `drain()` is
called from a signal handler, so it takes no lock and only stores the time).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Final

from queue_worker.worker.handlers import seconds_text, timed_out_error

#: the exit code of a worker ended by a time limit (as timeout(1) exits on a timeout)
EXIT_TIME_LIMIT: Final = 124

#: the longest the watchdog sleeps while a task runs (how soon it notices a drain begin)
POLL_S: Final = 0.25


def drain_timeout_error(drain_timeout_s: float) -> str:
    """The error of an attempt ended because it outran the drain timeout."""
    return f"timed out: still running {seconds_text(drain_timeout_s)} after the worker was stopped"


class _Running:
    """The task in hand, as the watchdog sees it; a context manager around the handler's run
    (a class, not a generator context manager: this is on every task's path)."""

    __slots__ = ("expired", "limit_s", "limits", "on_expiry", "started")

    def __init__(
        self, limits: TimeLimits, limit_s: float | None, on_expiry: Callable[[str], None]
    ) -> None:
        self.limits = limits
        self.started = time.monotonic()
        self.limit_s = limit_s
        self.on_expiry = on_expiry
        self.expired = False

    def __enter__(self) -> None:
        self.limits._arm(self)

    def __exit__(self, *exc_info: object) -> None:
        if not self.limits._disarm(self):
            # The watchdog is ending the process; `exit` returns only in tests.
            self.limits._ended.wait()


class TimeLimits:
    """Ends the worker process when the task in hand runs past its time limit, or past
    `drain_timeout_s` after `drain()`. `exit` is os._exit in a worker (tests inject another)."""

    def __init__(
        self,
        drain_timeout_s: float | None = None,
        *,
        exit: Callable[[int], object] = os._exit,
    ) -> None:
        self.drain_timeout_s = drain_timeout_s
        self._exit = exit
        # a Lock: cheaper than an RLock; `with self._lock` where no wait is needed (the
        # Condition's own `with` is two Python calls more, and every task arms and disarms)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._running: _Running | None = None
        self._drain_at: float | None = None  # monotonic; written without a lock (see drain)
        self._wake_at = math.inf
        self._daemon: threading.Thread | None = None
        self._closed = False
        self._ended = threading.Event()  # set once `exit` has returned (tests only)

    def drain(self) -> None:
        """The worker was asked to stop: the task in hand gets drain_timeout_s more at most.
        Safe from a signal handler (no lock: the watchdog looks within POLL_S)."""
        if self._drain_at is None:
            self._drain_at = time.monotonic()

    def running(
        self, limit_s: float | None, on_expiry: Callable[[str], None]
    ) -> AbstractContextManager[None]:
        """Watch the task run inside the `with` block. When its time runs out,
        `on_expiry(error)` is called from the watchdog's thread and the process ends; a block
        that ends after that (the handler returned at the last moment) waits for the end
        instead of going on to write the task's result."""
        if limit_s is None and self.drain_timeout_s is None:
            return nullcontext()
        return _Running(self, limit_s, on_expiry)

    def limit_running(self, limit_s: float) -> None:
        """The task in hand's own limit, known once its record is read (a function
        registered with `timeout=`): it replaces the one the task was armed with, from the
        same start. (No task armed: nothing watches, a worker with no limit and no drain
        timeout.)"""
        with self._cond:
            run = self._running
            if run is not None:
                run.limit_s = limit_s
                self._cond.notify_all()

    def _deadline(self, run: _Running) -> tuple[float, bool]:
        """When `run` must end, and whether the drain timeout (not its own limit) ends it."""
        deadline = math.inf if run.limit_s is None else run.started + run.limit_s
        drain_at, drain_timeout = self._drain_at, self.drain_timeout_s
        if (
            drain_at is not None
            and drain_timeout is not None
            and drain_at + drain_timeout < deadline
        ):
            return drain_at + drain_timeout, True
        return deadline, False

    def _error(self, run: _Running, by_drain: bool) -> str:
        """The error `run` fails with (its text built only when it is needed)."""
        if by_drain and self.drain_timeout_s is not None:
            return drain_timeout_error(self.drain_timeout_s)
        assert run.limit_s is not None
        return timed_out_error(run.limit_s)

    def _arm(self, run: _Running) -> None:
        with self._lock:
            self._running = run
            if self._daemon is None:
                self._daemon = threading.Thread(
                    target=self._watch, name="qw-time-limit", daemon=True
                )
                self._daemon.start()
            elif self._deadline(run)[0] < self._wake_at:
                self._cond.notify_all()

    def _disarm(self, run: _Running) -> bool:
        """Stop watching `run`; False if its time ran out first (the process is ending)."""
        with self._lock:
            if run.expired:
                return False
            if self._running is run:
                self._running = None
            return True

    def close(self) -> None:
        """Stop the watchdog (the worker is closing: no task runs)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._daemon
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _watch(self) -> None:
        with self._cond:
            while True:
                if self._closed:
                    return
                run = self._running
                now = time.monotonic()
                wake = now + POLL_S
                if run is not None:
                    deadline, by_drain = self._deadline(run)
                    if now >= deadline:
                        run.expired = True  # from here on `_disarm` says the process ends
                        break
                    wake = min(wake, deadline)
                self._wake_at = wake
                self._cond.wait(wake - now)
                self._wake_at = math.inf
        try:
            run.on_expiry(self._error(run, by_drain))
        except BaseException as e:  # the process ends all the same
            print(f"qw worker: recording the time-out failed: {e!r}", file=sys.stderr)
        self._exit(EXIT_TIME_LIMIT)
        self._ended.set()
