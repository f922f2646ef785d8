"""What `qw report` proves of periodic tasks: each tick enqueued once, completed at most once.

A periodic tick is a TASK keyed "periodic:NAME:TIME_US" (queue_worker.periodic); every
supervisor enqueues it, and of the tasks with one key the first in the tasks topic is the
tick's task, a later one resolving to it (its DONE's result `{"qw:resolved_to": first}`,
written without running it). So, from the logs alone:

enqueued once          no later task of a key was completed as a task of its own: each
                       later one's accepted DONE, if any, resolves to the first;
completed at most once the handler of a tick ran to completion once at most: the first's
                       accepted DONE, plus every DONE of a claim that won one of the key's
                       tasks and ran it (a stale DONE of a winning claim other than the
                       accepted one: a takeover's loser that finished anyway), plus any
                       later task completed on its own, count 1 or 0.

`check_ticks` is pure: the keyed tasks (id, key) from the tasks topic, and from the claims
replay each task's accepted DONE and the runs refused after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from queue_worker.names import printable
from queue_worker.times import clock_text

#: how a periodic tick's key begins (queue_worker.periodic.tick_key)
TICK_PREFIX: Final = "periodic:"


@dataclass(frozen=True, slots=True)
class Completion:
    """A DONE that ran a task's handler: its position, and the task it resolved to (a later
    task of a key: it did not run), if any."""

    position: int
    resolved_to: int | None = None


@dataclass(frozen=True, slots=True)
class PeriodicProof:
    """One periodic task's ticks in the logs, and what breaks the rule (each a line)."""

    name: str
    ticks: int
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def line(self) -> str:
        """``periodic: cleanup — 12 ticks, each enqueued once and completed at most once``"""
        head = f"periodic: {printable(self.name)} — {self.ticks} tick{'s' * (self.ticks != 1)}"
        if self.ok:
            return f"{head}, each enqueued once and completed at most once"
        return f"{head}, {len(self.problems)} against the rule"


def split_key(key: str) -> tuple[str, int] | None:
    """("cleanup", 1764…) of "periodic:cleanup:1764…"; None for a key of no tick."""
    if not key.startswith(TICK_PREFIX):
        return None
    name, _, time_us = key[len(TICK_PREFIX) :].rpartition(":")
    return (name, int(time_us)) if name and time_us.isdigit() else None


def check_ticks(
    keyed: Iterable[tuple[int, str]],
    accepted: Mapping[int, Completion],
    reruns: Mapping[int, Sequence[int]],
) -> tuple[PeriodicProof, ...]:
    """The proof of each periodic task. `keyed`: (task id, key) of the tasks with a tick's
    key, in tasks-topic order; `accepted`: each task's accepted DONE; `reruns`: for a task,
    the positions of the stale DONEs of winning claims other than the accepted one."""
    by_key: dict[str, list[int]] = {}
    for task, key in keyed:
        if split_key(key) is not None:
            by_key.setdefault(key, []).append(task)
    ticks: dict[str, int] = {}
    problems: dict[str, list[str]] = {}
    for key, tasks in by_key.items():
        split = split_key(key)
        assert split is not None
        name, time_us = split
        ticks[name] = ticks.get(name, 0) + 1
        where = f"tick {printable(name)} at {clock_text(time_us)} (key {printable(key)})"
        first, runs = tasks[0], []
        for task in tasks:
            done = accepted.get(task)
            if done is not None and done.resolved_to is None:
                runs.append(done.position)
                if task != first:
                    problems.setdefault(name, []).append(
                        f"{where}: tasks {first} and {task} hold its key as distinct tasks "
                        f"(task {task} ran: DONE @{done.position})"
                    )
            elif done is not None and done.resolved_to != first:
                problems.setdefault(name, []).append(
                    f"{where}: task {task} resolved to task {done.resolved_to}, "
                    f"not to the key's first, task {first} (DONE @{done.position})"
                )
            runs += reruns.get(task, ())
        if len(runs) > 1:
            shown = ", ".join(f"@{p}" for p in sorted(runs))
            problems.setdefault(name, []).append(
                f"{where}: completed {len(runs)} times (DONE {shown})"
            )
    return tuple(
        PeriodicProof(name, count, tuple(problems.get(name, ())))
        for name, count in sorted(ticks.items())
    )
