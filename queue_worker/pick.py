"""Which claimable task a worker tries for: the choice that decides how often workers collide.

Two workers that try for the same task at about the same time both append a CLAIM; the log
order makes one win and the other's attempt is wasted (a lost claim round trip). The
strategies differ only in how likely that is with many idle workers and a backlog:

first   the lowest claimable id. Every worker picks the same task: with N workers, up to
        N-1 of every N attempts are lost. Useful to see the protocol arbitrate.
random  uniform over the claimable set. Collisions become rare (the original measured ~0%
        with a backlog). Expected O(1): sample ids in [watermark, known) and keep the first
        claimable one; only when a few samples miss (a sparse claimable set) scan and choose.
spread  each worker is given a slot of `slots` by the supervisor and prefers ids with
        id % slots == slot, lowest first: with a backlog, N workers in N slots never pick
        the same task, and the queue is still worked roughly in order. It scans its own ids
        from the watermark with step `slots` (a bounded number of probes), and when it finds
        none claimable it falls back to `random` over the rest — but leaves another slot's
        task alone for SPREAD_GRACE_US after it first saw it (`FreshTasks`): with no backlog,
        a new task's own worker takes it, and the idle others do not all collide on it.

The reader's clock enters only through `ClaimState.is_claimable(task, now)`.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Container
from typing import Final

from queue_worker.state import ClaimState

#: random: samples tried before scanning the whole claimable set
RANDOM_SAMPLES: Final = 8

#: spread: own-slot ids probed before falling back to random
SPREAD_PROBES: Final = 256

#: spread: how long another slot's new task is left to its own worker (µs of the worker's
#: clock). An idle owner claims within a wake-up (~0.1-0.4 ms); a busy one leaves it to
#: the others after this.
SPREAD_GRACE_US: Final = 10_000

_NOTHING: Final[frozenset[int]] = frozenset()


class FreshTasks:
    """When this worker first saw each task, as runs: (first task id, worker clock µs).

    One entry per catch-up that found new tasks (a backlog is one run), and runs below the
    watermark are dropped, so it stays small however long the log grows.
    """

    def __init__(self) -> None:
        self._runs: deque[tuple[int, int]] = deque()
        self.recheck_at: int | None = None  # when a held-back task may be taken (worker µs)

    def saw(self, first_task: int, now: int) -> None:
        self._runs.append((first_task, now))

    def forget_below(self, watermark: int) -> None:
        runs = self._runs
        while len(runs) > 1 and runs[1][0] <= watermark:
            runs.popleft()

    def seen_at(self, task: int) -> int | None:
        for first, at in reversed(self._runs):
            if first <= task:
                return at
        return None

    def held_back(
        self, now: int, slot: int, slots: int, excluded: Container[int]
    ) -> Container[int]:
        """`excluded` plus the tasks of other slots first seen less than the grace ago."""
        self.recheck_at = None
        return _HeldBack(self, now, slot, slots, excluded)

    def hold(self, task: int, now: int, slot: int, slots: int) -> bool:
        """Leave `task` to its own slot's worker for now? (Notes when to look again.)"""
        if task % slots == slot:
            return False
        seen = self.seen_at(task)
        if seen is None or now - seen >= SPREAD_GRACE_US:
            return False
        due = seen + SPREAD_GRACE_US
        if self.recheck_at is None or due < self.recheck_at:
            self.recheck_at = due
        return True


class _HeldBack:
    """The tasks a spread pick skips: the excluded ones, and fresh tasks of other slots."""

    def __init__(
        self, fresh: FreshTasks, now: int, slot: int, slots: int, excluded: Container[int]
    ) -> None:
        self.fresh, self.now, self.slot, self.slots = fresh, now, slot, slots
        self.excluded = excluded

    def __contains__(self, task: object) -> bool:
        if task in self.excluded:
            return True
        return isinstance(task, int) and self.fresh.hold(task, self.now, self.slot, self.slots)


def pick_first(
    state: ClaimState, now: int, known: int, excluded: Container[int] = _NOTHING
) -> int | None:
    for task in state.claimable(now, known):
        if task not in excluded:
            return task
    return None


def pick_random(
    state: ClaimState,
    now: int,
    known: int,
    rng: random.Random,
    excluded: Container[int] = _NOTHING,
) -> int | None:
    low = state.watermark
    if low >= known:
        return None
    # Rejection sampling is uniform over the claimable set: every claimable id is equally
    # likely to be the first sample that hits; the scan below is uniform too.
    for _ in range(RANDOM_SAMPLES):
        task = rng.randrange(low, known)
        if task not in excluded and state.is_claimable(task, now):
            return task
    candidates = [t for t in state.claimable(now, known) if t not in excluded]
    return rng.choice(candidates) if candidates else None


def pick_spread(
    state: ClaimState,
    now: int,
    known: int,
    slot: int,
    slots: int,
    rng: random.Random,
    excluded: Container[int] = _NOTHING,
    own_from: int = 0,
) -> int | None:
    """`own_from`: an id of this slot below which every id of the slot is closed (the
    caller's cursor, so that a worker does not probe its own finished tasks every pick)."""
    low = max(state.watermark, own_from)
    first_own = low + (slot - low) % slots  # the lowest id >= low in this slot
    stop = min(known, first_own + SPREAD_PROBES * slots)
    for task in range(first_own, stop, slots):
        if task not in excluded and state.is_claimable(task, now):
            return task
    return pick_random(state, now, known, rng, excluded)


def pick_task(
    strategy: str,
    state: ClaimState,
    now: int,
    known: int,
    *,
    rng: random.Random,
    slot: int = 0,
    slots: int = 1,
    excluded: Container[int] = _NOTHING,
    own_from: int = 0,
) -> int | None:
    """A claimable task among ids 0..known-1 by `strategy` (first|random|spread), or None.
    `own_from`: see `pick_spread`."""
    if strategy == "first":
        return pick_first(state, now, known, excluded)
    if strategy == "random":
        return pick_random(state, now, known, rng, excluded)
    if strategy == "spread":
        return pick_spread(state, now, known, slot, slots, rng, excluded, own_from)
    raise ValueError(f"pick strategy {strategy!r} is unknown; expected first, random or spread")
