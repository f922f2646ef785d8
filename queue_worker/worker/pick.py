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
        (Only a task never claimed is fresh: a lapsed or released one is not held back.)

Before any of these, every rule tries the orphans (`Orphans`):

orphans first  a task whose holder's lease has lapsed (the holder was killed, froze, or
        lost the log) is tried before fresh backlog, oldest expiry first, by whichever
        worker picks first after the lapse: recovery does not wait behind the backlog.
not by the heir  a worker leaves the lapsed tasks of its own slot's predecessor (a holder
        id with its name and host but another process: the worker it replaced) to the
        other workers for one lease after they lapse, and takes them itself only if none
        did (off with one slot: there is nobody to leave it to). Without this, a restarted
        worker under `spread` went straight back to its own slot's lowest id (the task its
        predecessor died holding), so "redistribution" was nearly always the dead worker's
        own slot taking the task back. Measured with both rules (`qw up`, 4 workers, a
        backlog, the default lease and work, tests/test_takeover_processes.py): 90 of 90
        kill -9s taken over by a survivor, 1-399 ms after the lease lapsed (median ~120 ms).

Delays and priorities (a task by name enqueued with `delay=`/`eta=` or `priority=`: its
record's `not_before` and `priority`, which the task index keeps, `TaskIndex.scheduled`):

not yet due   a task whose `not_before` is after the fold's clock is not tried; an idle
        worker wakes at the earliest such time (`recheck_at`).
priority      the due, claimable tasks of a priority above 0 are tried before all others,
        the highest first, a lapsed lease's first within a priority, then the lowest id;
        those below 0 only when no other task is claimable.

Dependencies (a task enqueued with `after=`: `TaskIndex.after`): a task one of whose
dependencies is still open, and none dead, is not tried (`queue_worker.worker.dependencies`).

A worker keeps what these need from one pick to the next in one `Picker`.

On a Redis queue with server verdicts the server picks instead (queue_worker.redis.server_claim:
by priority, orphans first within one, then the tasks in order, none before its delay's end;
no CLAIM is lost to another worker there, so what
these strategies are for does not arise): a worker there asks for no strategy, and one asked
for is refused (`Picker`), as `qw up --pick` is, rather than ignored.

These choose only what a worker *tries*: the fold alone decides who wins, and a lapse is
judged exactly as `claimable` judges it. The reader's clock enters only through
`ClaimState.is_claimable(task, now)`.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Container, Mapping
from typing import Final

from queue_worker.protocol.state import ClaimState
from queue_worker.topics import TaskIndex
from queue_worker.worker.config import PICK_STRATEGIES
from queue_worker.worker.dependencies import Waiting
from queue_worker.worker.settings import DEFAULT_PICK

#: random: samples tried before scanning the whole claimable set
RANDOM_SAMPLES: Final = 8

#: spread: own-slot ids probed before falling back to random
SPREAD_PROBES: Final = 256

#: spread: how long another slot's new task is left to its own worker (µs of the worker's
#: clock). An idle owner claims within a wake-up (~0.1-0.4 ms); a busy one leaves it to
#: the others after this.
SPREAD_GRACE_US: Final = 10_000

#: spread: an idle worker woken when the next task id is another slot's steps aside this
#: long first, so that the task's own worker (woken by the same append) gets one of the
#: few cores before the others (with 8 workers on 2 cores: p50 wake-up ~0.9 → ~0.55 ms;
#: the others may not take that task for SPREAD_GRACE_US anyway).
STEP_ASIDE_S: Final = 0.0003

#: orphans: a worker looks for lapsed leases at each expiry it knows of, and at least this
#: often (µs, fold clock) to see leases it learnt of since ...
ORPHAN_SCAN_US: Final = 50_000

#: ... but a scan longer than ORPHAN_SCAN_CHEAP_US (a scan walks the open tasks: the held
#: ones and those waiting out a backoff, thousands of them after a burst of failures) is
#: spaced out so that at most 1/ORPHAN_SCAN_SHARE of the worker's time goes on scanning
ORPHAN_SCAN_CHEAP_US: Final = 500
ORPHAN_SCAN_SHARE: Final = 20

_NOTHING: Final[frozenset[int]] = frozenset()


def lineage(worker_id: str) -> str:
    """The slot a worker id belongs to: its name (and host), without the pid and suffix
    (``w6-6975-4ede`` → ``w6``; ``w0@box-11704-d3af`` → ``w0@box``). Two ids of one lineage
    are one slot's successive processes."""
    return worker_id.rsplit("-", 2)[0]


class Orphans:
    """Tasks whose holder's lease has lapsed, tried before fresh backlog ("orphans first"),
    and the lapsed tasks of this worker's predecessor in its slot, left to the others for
    `grace_us` after their lapse ("not by the heir"). All times are on the fold's clock.

    A scan walks the held tasks (`ClaimState.held_tasks`), at the earliest expiry it saw and
    at least every ORPHAN_SCAN_US; between scans a pick costs a look at the few tasks found.
    """

    def __init__(self, worker_id: str, grace_us: int, *, heir_rule: bool = True) -> None:
        self.worker_id = worker_id
        self.lineage = lineage(worker_id)
        self.grace_us = grace_us
        self.heir_rule = heir_rule  # off with no other worker to leave a task to
        self._lapsed: list[int] = []  # lapsed at the last scan, oldest expiry first
        self._withheld: dict[int, int] = {}  # the predecessor's task -> when we may try it
        self._next_scan = 0
        self.recheck_at: int | None = None  # when a withheld task may be tried (fold µs)

    def scan(self, state: ClaimState, now: int) -> None:
        """Look for lapsed leases, if a scan is due."""
        if now < self._next_scan:
            return
        started = time.perf_counter_ns()
        lapsed: list[tuple[int, int]] = []
        withheld: dict[int, int] = {}
        soonest: int | None = None
        for task, lease in state.held_tasks():
            if (
                self.heir_rule
                and lease.worker != self.worker_id
                and lineage(lease.worker) == self.lineage
            ):
                withheld[task] = lease.expiry + self.grace_us
            if state.is_claimable(task, now):  # the lapse, judged as `claimable` judges it
                lapsed.append((lease.expiry, task))
            elif soonest is None or lease.expiry < soonest:
                soonest = lease.expiry
        lapsed.sort()
        self._lapsed = [task for _, task in lapsed]
        self._withheld = withheld
        took_us = (time.perf_counter_ns() - started) // 1000
        due = now + ORPHAN_SCAN_US if soonest is None else min(now + ORPHAN_SCAN_US, soonest)
        if took_us > ORPHAN_SCAN_CHEAP_US:
            due = max(due, now + ORPHAN_SCAN_SHARE * took_us)
        self._next_scan = due

    def withholds(self, task: int, now: int) -> bool:
        """Is `task` the predecessor's, lapsed less than the grace ago? (Notes when to look
        again.)"""
        until = self._withheld.get(task)
        if until is None or now >= until:
            return False
        if self.recheck_at is None or until < self.recheck_at:
            self.recheck_at = until
        return True

    def excluding(self, excluded: Container[int], now: int) -> Container[int]:
        """`excluded` plus the predecessor's tasks still withheld (as it is, when none)."""
        self.recheck_at = None
        if not self._withheld:
            return excluded
        return _Withheld(self, now, excluded)

    def pick(self, state: ClaimState, now: int, excluded: Container[int]) -> int | None:
        """The orphan with the oldest expiry that may be tried now, or None."""
        if not self._lapsed:
            return None
        found: int | None = None
        still: list[int] = []
        for task in self._lapsed:
            if not state.is_claimable(task, now):
                continue  # taken over or closed since the scan: the next scan sees a new lapse
            still.append(task)
            if found is None and task not in excluded:
                found = task
        self._lapsed = still
        return found


class _Withheld:
    """The tasks a pick skips: the excluded ones, and the predecessor's withheld ones."""

    def __init__(self, orphans: Orphans, now: int, excluded: Container[int]) -> None:
        self.orphans, self.now, self.excluded = orphans, now, excluded

    def __contains__(self, task: object) -> bool:
        if task in self.excluded:
            return True
        return isinstance(task, int) and self.orphans.withholds(task, self.now)


class FreshTasks:
    """When this worker first saw each task, as runs: (first task id, worker clock µs).

    One entry per catch-up that found new tasks (a backlog is one run); runs below the
    watermark, and runs seen more than the grace ago, are dropped, so it stays small however
    long the log grows (a spread pick only; no other pick reads it).
    """

    def __init__(self) -> None:
        self._runs: deque[tuple[int, int]] = deque()
        self.recheck_at: int | None = None  # when a held-back task may be taken (worker µs)

    def __len__(self) -> int:
        """How many runs it keeps (its memory)."""
        return len(self._runs)

    def saw(self, first_task: int, now: int) -> None:
        self._runs.append((first_task, now))

    def forget_below(self, watermark: int) -> None:
        runs = self._runs
        while len(runs) > 1 and runs[1][0] <= watermark:
            runs.popleft()

    def forget_older_than(self, cutoff: int) -> None:
        """Drop the runs whose every task was seen before `cutoff`: no pick holds those back
        any more (`hold` reads them as "seen long ago", and so reads a task of no run).
        With a task held open for long the watermark stays behind: this bounds the runs by
        the grace, not by the history since that task."""
        runs = self._runs
        while len(runs) > 1 and runs[0][1] < cutoff:
            runs.popleft()

    def seen_at(self, task: int) -> int | None:
        for first, at in reversed(self._runs):
            if first <= task:
                return at
        return None

    def held_back(
        self, state: ClaimState, now: int, slot: int, slots: int, excluded: Container[int]
    ) -> Container[int]:
        """`excluded` plus the never-claimed tasks of other slots first seen less than the
        grace ago."""
        self.recheck_at = None
        return _HeldBack(self, state, now, slot, slots, excluded)

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
        self,
        fresh: FreshTasks,
        state: ClaimState,
        now: int,
        slot: int,
        slots: int,
        excluded: Container[int],
    ) -> None:
        self.fresh, self.state, self.now, self.slot, self.slots = fresh, state, now, slot, slots
        self.excluded = excluded

    def __contains__(self, task: object) -> bool:
        if task in self.excluded:
            return True
        return (
            isinstance(task, int)
            and self.fresh.hold(task, self.now, self.slot, self.slots)
            and self.state.task_state(task) is None  # claimed before: not a fresh task
        )


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
    orphans: Orphans | None = None,
) -> int | None:
    """A claimable task among ids 0..known-1 by `strategy` (first|random|spread), or None.
    With `orphans`, a lapsed lease's task first (and never the predecessor's too early).
    `own_from`: see `pick_spread`."""
    if strategy not in PICK_STRATEGIES:
        raise ValueError(f"pick strategy {strategy!r} is unknown; expected first, random or spread")
    if orphans is not None:
        orphans.scan(state, now)
        excluded = orphans.excluding(excluded, now)
        orphan = orphans.pick(state, now, excluded)
        if orphan is not None:
            return orphan
    if strategy == "first":
        return pick_first(state, now, known, excluded)
    if strategy == "random":
        return pick_random(state, now, known, rng, excluded)
    return pick_spread(state, now, known, slot, slots, rng, excluded, own_from)


class Unscheduled:
    """`excluded`, the tasks not yet due, and those of a priority other than 0
    (`pick_scheduled` orders those): what the strategies leave alone."""

    __slots__ = ("excluded", "now", "scheduled")

    def __init__(
        self, excluded: Container[int], scheduled: Mapping[int, tuple[int, int]], now: int
    ) -> None:
        self.excluded = excluded
        self.scheduled = scheduled
        self.now = now

    def __contains__(self, task: object) -> bool:
        found = self.scheduled.get(task) if isinstance(task, int) else None
        if found is not None and (found[0] > self.now or found[1] != 0):
            return True
        return task in self.excluded


def pick_scheduled(
    state: ClaimState,
    scheduled: Mapping[int, tuple[int, int]],
    now: int,
    excluded: Container[int],
) -> tuple[int | None, list[int], int | None]:
    """Among the tasks with a delay or a priority: the one to try before any other (a due,
    claimable task of priority > 0: the highest, a lapsed lease's first, the lowest id), the
    due claimable ones of priority < 0 in the order to try them when nothing else is
    claimable, and the earliest `not_before` still ahead of `now` (None: none). (A due task
    of priority 0 is the strategies' to pick, as any other.)"""
    best: tuple[int, int, int] | None = None
    later: list[tuple[int, int]] = []
    due_at: int | None = None
    for task, (not_before, priority) in scheduled.items():
        if not_before > now:
            if not state.is_closed(task):
                due_at = not_before if due_at is None else min(due_at, not_before)
            continue
        if task in excluded or not state.is_claimable(task, now):
            continue
        if priority > 0:
            lapsed = 0 if state.holder(task) is not None else 1  # (a lapsed lease first)
            key = (-priority, lapsed, task)
            if best is None or key < best:
                best = key
        elif priority < 0:
            later.append((-priority, task))
    later.sort()
    return (None if best is None else best[2]), [t for _, t in later], due_at


class Picker:
    """One worker's pick: its strategy, with what it keeps from one pick to the next.

    The orphans (every strategy) and, under `spread` with more than one slot, the fresh
    tasks of other slots held back, the cursor over this slot's closed ids (`own_from`),
    and whether an idle worker steps aside for the next task's own worker (STEP_ASIDE_S).
    Times: `now` is the worker's clock, `fold_now` the fold's (see `Worker.fold_time`).
    """

    def __init__(
        self,
        strategy: str | None,
        worker_id: str,
        lease_us: int,
        *,
        slot: int,
        slots: int,
        rng: random.Random,
    ) -> None:
        """`strategy` None: DEFAULT_PICK."""
        strategy = DEFAULT_PICK if strategy is None else strategy
        self.strategy = strategy
        self.slot = slot
        self.slots = slots
        self.spread = strategy == "spread" and slots > 1
        self._rng = rng
        self._fresh = FreshTasks()
        self.own_from = 0  # spread: every id of our slot below this is closed
        # orphans first; a predecessor's lapsed tasks are left to the others for one lease
        self._orphans = Orphans(worker_id, lease_us, heir_rule=slots > 1)
        self._due_at: int | None = None  # the earliest not_before still ahead (fold clock)

    @property
    def fresh_runs(self) -> int:
        """How many runs of fresh tasks it keeps (see FreshTasks)."""
        return len(self._fresh)

    def saw(self, first_task: int, now: int) -> None:
        """A catch-up found new tasks, from `first_task` on, at `now` (worker clock)."""
        if self.spread:  # only a spread pick holds fresh tasks back: nothing else reads them
            self._fresh.saw(first_task, now)

    def pick(self, state: ClaimState, tasks: TaskIndex, now: int, fold_now: int) -> int | None:
        """A claimable task by the strategy (as of the last catch-up), or None."""
        excluded: Container[int] = tasks.foreign
        if self.spread:
            self._fresh.forget_below(state.watermark)
            self._fresh.forget_older_than(now - SPREAD_GRACE_US)
            excluded = self._fresh.held_back(state, now, self.slot, self.slots, tasks.foreign)
            # Closed is for good: step the cursor over this slot's closed ids once, instead
            # of probing them from the watermark at every pick.
            own = max(self.own_from, self.slot)
            while own < tasks.known and state.is_closed(own):
                own += self.slots
            self.own_from = own
        tasks.forget_kept_below(max(state.watermark, self.own_from))
        if tasks.after:  # a task whose dependencies are not all done (or one dead) waits
            excluded = Waiting(excluded, tasks.after, state)
        scheduled = tasks.scheduled
        self._due_at = None
        later: list[int] = []
        if scheduled:
            first, later, self._due_at = pick_scheduled(state, scheduled, fold_now, excluded)
            if first is not None:
                return first
            excluded = Unscheduled(excluded, scheduled, fold_now)
        picked = pick_task(
            self.strategy,
            state,
            fold_now,
            tasks.known,
            rng=self._rng,
            slot=self.slot,
            slots=self.slots,
            excluded=excluded,
            own_from=self.own_from,
            orphans=self._orphans,
        )
        return picked if picked is not None or not later else later[0]

    def recheck_at(self, fold_time: Callable[[int], int]) -> int | None:
        """When (fold clock) a task the last pick held back becomes ours to take: a fresh
        task of another slot (`fold_time` turns the worker's clock into the fold's), or a
        predecessor's lapsed task; None if none was held back."""
        recheck = self._fresh.recheck_at
        if recheck is not None:
            recheck = fold_time(recheck)
        heir = self._orphans.recheck_at
        if heir is not None:
            recheck = heir if recheck is None else min(recheck, heir)
        due = self._due_at
        if due is not None:
            recheck = due if recheck is None else min(recheck, due)
        return recheck

    def next_is_anothers(self, known: int) -> bool:
        """Spread: will the next task enqueued (id = `known`, the tasks known) be another
        slot's?"""
        return self.spread and known % self.slots != self.slot

    def step_aside(self, known: int) -> None:
        """Idle and woken: when the next task is another slot's, leave the first wake-up to
        its own worker (see STEP_ASIDE_S)."""
        if self.next_is_anothers(known):
            time.sleep(STEP_ASIDE_S)
