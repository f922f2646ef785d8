"""What a worker's pick keeps between picks does not grow with history (issue 14, item 4).

`FreshTasks` (when each task was first seen, as runs) is read only by a spread pick: other
picks keep none, and a spread pick drops the runs seen more than the grace ago, with the
same answer for every task as when it kept them all.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from logstore import MemoryLog
from queue_worker.protocol.records import TaskRecord, encode
from queue_worker.protocol.state import ClaimState
from queue_worker.topics import TaskIndex
from queue_worker.worker.pick import SPREAD_GRACE_US, FreshTasks, Picker
from tests.examples import examples


def picker(strategy: str, slots: int) -> Picker:
    return Picker(strategy, "w0-1-aaaa", 1_000_000, slot=0, slots=slots, rng=random.Random(1))


def test_only_a_spread_pick_keeps_fresh_tasks() -> None:
    for strategy, slots in (("random", 4), ("first", 4), ("spread", 1)):
        p = picker(strategy, slots)
        for n in range(10_000):  # a trickle: one new task per catch-up
            p.saw(n, n * 1_000)
        assert p.fresh_runs == 0, strategy
    spread = picker("spread", 4)
    spread.saw(0, 0)
    assert spread.fresh_runs == 1


def test_a_spread_pick_keeps_the_runs_of_the_grace_only() -> None:
    """Nothing closes (the watermark stays at 0, as behind a task held for hours): the runs
    are bounded by the grace, not by the history."""
    p = picker("spread", 4)
    state, log = ClaimState(), MemoryLog("tasks")
    tasks = TaskIndex(log.start)
    step = SPREAD_GRACE_US // 10  # ten catch-ups with new tasks per grace
    most = 0
    for n in range(1, 5_000):
        log.append(encode(TaskRecord(payload=n, enqueued_at=0)))
        tasks.catch_up(log)
        p.saw(n - 1, n * step)
        p.pick(state, tasks, n * step, n * step)
        most = max(most, p.fresh_runs)
    assert most <= 12  # unbounded: one run per catch-up, 4,999


@settings(max_examples=examples(200), deadline=None)
@given(
    gaps=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 2 * SPREAD_GRACE_US)), max_size=40),
    later=st.integers(0, 2 * SPREAD_GRACE_US),
)
def test_dropping_old_runs_changes_no_answer(gaps: list[tuple[int, int]], later: int) -> None:
    kept, pruned = FreshTasks(), FreshTasks()
    task, now = 0, 0
    for new_tasks, elapsed in gaps:
        now += elapsed
        kept.saw(task, now)
        pruned.saw(task, now)
        pruned.forget_older_than(now - SPREAD_GRACE_US)
        task += new_tasks
        for asked_at in (now, now + later):
            for t in range(task):
                assert pruned.hold(t, asked_at, 0, 3) == kept.hold(t, asked_at, 0, 3)
