"""Orphans first, and not by the heir: the pick rules for a task whose holder's lease lapsed
(queue_worker.worker.pick.Orphans), on a plain fold and on workers driven step by step."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from queue_worker.protocol.records import Claim, Done, encode
from queue_worker.protocol.state import ClaimState, Verdict
from queue_worker.worker.loop import StepKind
from queue_worker.worker.pick import Orphans, lineage, pick_task
from tests.test_worker import SECOND, T0, Cluster, FakeClock

DEAD = "w3-100-dead"  # the worker that died holding task 7
LEASE = 5 * SECOND


def backlog_with_orphan() -> ClaimState:
    """Tasks 0..1 done, task 7 held by DEAD until T0 + LEASE, the rest never claimed."""
    state = ClaimState()
    state.apply(Claim(0, "w0-1-aaaa", T0, LEASE), 0)
    state.apply(Done(0, "w0-1-aaaa", T0, 0), 1)
    state.apply(Claim(1, "w1-2-bbbb", T0, LEASE), 2)
    state.apply(Done(1, "w1-2-bbbb", T0, 2), 3)
    state.apply(Claim(7, DEAD, T0, LEASE), 4)
    return state


def test_lineage_is_the_slot_name_and_host() -> None:
    assert lineage("w6-6975-4ede") == "w6"
    assert lineage("w0@box-11704-d3af") == "w0@box"
    assert lineage("w0@box-11704-d3af") != lineage("w0@other-11704-d3af")


@pytest.mark.parametrize("strategy", ["first", "random", "spread"])
def test_a_lapsed_lease_is_tried_before_fresh_backlog(strategy: str) -> None:
    state = backlog_with_orphan()
    survivor = Orphans("w1-2-bbbb", LEASE)
    rng = random.Random(4)

    def pick(now: int) -> int | None:
        return pick_task(strategy, state, now, 20, rng=rng, slot=1, slots=4, orphans=survivor)

    assert pick(T0 + LEASE - 1) != 7  # still held: the backlog as usual
    assert pick(T0 + LEASE) == 7  # lapsed, judged as claimable judges it: the orphan first


def test_without_orphans_spread_goes_its_own_way() -> None:
    """What the rule changes: a survivor in another slot would leave the orphan alone."""
    state = backlog_with_orphan()
    got = pick_task("spread", state, T0 + LEASE, 20, rng=random.Random(1), slot=1, slots=4)
    assert got == 5


def test_the_heir_leaves_its_predecessors_orphan_to_the_others_for_one_lease() -> None:
    state = backlog_with_orphan()
    heir = Orphans("w3-200-cafe", LEASE)  # slot w3's next process: task 7 is in its part
    rng = random.Random(2)

    def pick(now: int) -> int | None:
        return pick_task("spread", state, now, 20, rng=rng, slot=3, slots=4, orphans=heir)

    assert pick(T0 + LEASE) == 3  # its own part of the backlog, but not the orphan
    assert heir.recheck_at == T0 + 2 * LEASE
    assert pick(T0 + 2 * LEASE - 1) == 3
    assert pick(T0 + 2 * LEASE) == 7  # nobody took it within a lease: the heir does


def test_the_heir_rule_is_off_when_there_is_nobody_to_leave_it_to() -> None:
    state = backlog_with_orphan()
    alone = Orphans("w3-200-cafe", LEASE, heir_rule=False)
    assert pick_task("first", state, T0 + LEASE, 20, rng=random.Random(), orphans=alone) == 7


def test_an_orphan_taken_over_is_not_tried_again() -> None:
    state = backlog_with_orphan()
    survivor = Orphans("w1-2-bbbb", LEASE)
    rng = random.Random(3)
    assert pick_task("first", state, T0 + LEASE, 20, rng=rng, orphans=survivor) == 7
    taken = state.apply(Claim(7, "w0-1-aaaa", T0 + LEASE, LEASE), 5)
    assert taken.verdict is Verdict.TAKEOVER
    assert pick_task("first", state, T0 + LEASE + 1, 20, rng=rng, orphans=survivor) == 2


def test_workers_take_over_a_dead_holders_task_before_the_backlog_and_not_its_heir(
    tmp_path: Path,
) -> None:
    """Driven step by step: the dead w1 held task 1 (its CLAIM is in the log, nothing more).
    After the lease, w1's replacement works its own part of the backlog, skipping task 1;
    w0 takes task 1 over before its own next task."""
    cluster = Cluster(tmp_path / "run")
    cluster.queue.enqueue_many(list(range(8)))
    cluster.claims.append(encode(Claim(1, "w1-100-dead", T0, LEASE)))
    clock = FakeClock(T0 + LEASE)
    heir = cluster.worker("w1", clock=clock, pick="spread", slot=1, slots=2, lease_s=5)
    survivor = cluster.worker("w0", clock=clock, pick="spread", slot=0, slots=2, lease_s=5)
    first = heir.step()
    assert (first.kind, first.task) == (StepKind.DONE, 3)
    taken = survivor.step()
    assert (taken.kind, taken.task) == (StepKind.DONE, 1)
    takeover = [o for r, o in cluster.fold() if o.verdict is Verdict.TAKEOVER]
    assert [(o.task, o.worker) for o in takeover] == [(1, survivor.worker_id)]
