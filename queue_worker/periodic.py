"""Periodic tasks: `@queue.periodic(every=60)` or `@queue.periodic(cron="*/5 * * * *")`.

A periodic function is a task by name like any other (it takes no arguments, or only
`ctx`); what makes it periodic is who enqueues it: `qw up --app` runs a `Ticker`, which
enqueues each tick ahead of its time, with `eta=` the tick's time and `key=` naming the
tick ("periodic:NAME:TIME_US"). The key is what makes a tick run once however many
supervisors enqueue it (two `qw up` on one queue, or one per host on Redis): of the tasks
with one key, the first in the tasks log is the task, and a later one resolves to it
(queue_worker.tasks). The times are the wall clock's (UTC for cron).

`cron=` needs the croniter package (`pip install croniter`, or the project's `cron` extra).
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from queue_worker.errors import QwError

if TYPE_CHECKING:
    from queue_worker.producer import Queue


@dataclass(frozen=True)
class Schedule:
    """When a periodic task's ticks are: every `every_s` seconds (from the epoch), or by
    the 5-field `cron` expression."""

    name: str
    every_s: float | None = None
    cron: str | None = None

    def __post_init__(self) -> None:
        if (self.every_s is None) == (self.cron is None):
            raise ValueError(f"periodic task {self.name!r}: expected every= or cron=, one of them")
        if self.every_s is not None and (
            isinstance(self.every_s, bool)
            or not isinstance(self.every_s, int | float)
            or not self.every_s > 0
        ):
            raise ValueError(f"every is {self.every_s!r}; expected a number of seconds > 0")
        if self.cron is not None:
            croniter = _croniter()
            if not isinstance(self.cron, str) or not croniter.is_valid(self.cron):
                raise ValueError(
                    f"cron is {self.cron!r}; expected a cron expression "
                    "(5 fields: minute hour day month weekday, as '*/5 * * * *')"
                )

    def next_after(self, at_us: int) -> int:
        """The first tick strictly after `at_us` (µs since the epoch: integers, so that a
        tick's time, and its key, are the same on every supervisor)."""
        if self.every_s is not None:
            every_us = max(round(self.every_s * 1_000_000), 1)
            return (at_us // every_us + 1) * every_us
        assert self.cron is not None
        start = datetime.fromtimestamp(at_us / 1_000_000, timezone.utc)
        following: float = _croniter()(self.cron, start).get_next(float)
        return max(round(following * 1_000_000), at_us + 1)


def _croniter() -> Any:
    try:
        from croniter import croniter  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        raise QwError(
            "cron= needs the croniter package (pip install croniter); every= does not"
        ) from None
    return croniter


def tick_key(name: str, tick_us: int) -> str:
    """The key of one tick: the same on every supervisor that enqueues it."""
    return f"periodic:{name}:{tick_us}"


class Ticker:
    """Enqueues the ticks of `schedules` into `queue`, each before its time, until
    stopped: the next tick of each is enqueued as soon as the one before it is due."""

    def __init__(self, queue: Queue, schedules: list[Schedule]) -> None:
        self.queue = queue
        self.schedules = schedules
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="qw-periodic", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        now = time.time_ns() // 1000
        upcoming = {s.name: s.next_after(now) for s in self.schedules}
        for schedule in self.schedules:
            self._enqueue(schedule, upcoming[schedule.name])
        while not self._stop.is_set():
            name, tick = min(upcoming.items(), key=lambda item: item[1])
            if self._stop.wait(max(tick - time.time_ns() // 1000, 0) / 1_000_000):
                return
            schedule = next(s for s in self.schedules if s.name == name)
            upcoming[name] = schedule.next_after(tick)
            self._enqueue(schedule, upcoming[name])

    def _enqueue(self, schedule: Schedule, tick_us: int) -> None:
        eta = datetime.fromtimestamp(tick_us / 1_000_000, timezone.utc)
        try:
            self.queue.enqueue_call(schedule.name, eta=eta, key=tick_key(schedule.name, tick_us))
        except Exception as e:  # the queue out of reach: the next tick tries again
            print(f"qw periodic: {schedule.name} at {eta}: not enqueued: {e}", file=sys.stderr)
