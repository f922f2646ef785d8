"""Lease renewal: RENEW keeps a task, a lost lease cancels the handler, and a handler that
ignores the cancellation gets its DONE written and refused as stale."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from logstore import MemoryLog
from queue_worker.producer import Queue
from queue_worker.protocol.clock import now_us
from queue_worker.protocol.records import Claim, ClaimsRecord, Done, Fail, Renew, encode
from queue_worker.protocol.state import ClaimState, Verdict
from queue_worker.topics import ClaimsFollower
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.handlers import TaskContext
from queue_worker.worker.lease import LeaseKeeper, SingleTaskFold
from queue_worker.worker.loop import StepKind, StepResult, Worker
from tests.helpers import RacingLog, wait_until

SECOND = 1_000_000
T0 = 1_700_000_000 * SECOND


def full_fold(log: MemoryLog) -> list[tuple[ClaimsRecord, Verdict]]:
    follower = ClaimsFollower(log.start)
    folded = [follower.apply(entry) for entry in log.iter_from(log.start)]
    return [(record, outcome.verdict) for outcome, record in folded]


def keeper_for(log: MemoryLog, claim: Claim, clock_at: int, **kwargs: Any) -> LeaseKeeper:
    position = log.append(encode(claim))
    return LeaseKeeper(
        log,
        claim=claim,
        claim_position=position,
        read_from=position + 1,  # MemoryLog positions are indexes
        lease_us=claim.lease,
        clock=lambda: clock_at,
        **kwargs,
    )


# -- the keeper on its own -----------------------------------------------------------------------


def test_a_renewal_extends_the_lease() -> None:
    log = MemoryLog("claims")
    keeper = keeper_for(log, Claim(0, "w", T0, 10 * SECOND), clock_at=T0 + 4 * SECOND)
    assert keeper.expiry == T0 + 10 * SECOND
    assert keeper.renew_once() is Verdict.RENEWED
    assert keeper.expiry == T0 + 14 * SECOND
    assert not keeper.cancelled.is_set()
    (_, won), (renew, renewed) = full_fold(log)
    assert (won, renewed) == (Verdict.WON, Verdict.RENEWED)
    assert renew == Renew(0, "w", T0 + 4 * SECOND, claim=0, lease=10 * SECOND)


def test_the_thread_renews_until_stopped() -> None:
    log = MemoryLog("claims")
    keeper = keeper_for(log, Claim(0, "w", T0, 10 * SECOND), T0, renew_every_s=0.001)
    with keeper:
        wait_until(lambda: keeper.renewals >= 3, 20, "three renewals")
    written = log.end()
    assert not [t for t in threading.enumerate() if t.name == "lease-task-0"]
    assert log.end() == written  # stopped: nothing more is appended
    assert {v for _, v in full_fold(log)} == {Verdict.WON, Verdict.RENEWED}


def test_a_takeover_seen_in_the_log_cancels_without_writing_a_renew() -> None:
    log = MemoryLog("claims")
    keeper = keeper_for(log, Claim(0, "w", T0, 10 * SECOND), T0 + 11 * SECOND)
    log.append(encode(Claim(0, "rescuer", T0 + 10 * SECOND, 10 * SECOND)))
    assert keeper.renew_once() is Verdict.LEASE_LOST
    assert keeper.cancelled.is_set()
    assert keeper.lost_to is not None and keeper.lost_to.worker == "rescuer"
    assert [v for _, v in full_fold(log)] == [Verdict.WON, Verdict.TAKEOVER]


def test_a_refused_renewal_cancels() -> None:
    # The rescuer's clock runs a second ahead of ours: by our clock the lease still holds
    # (so a RENEW is written), by its own it had run out (so its CLAIM wins first).
    log = RacingLog()
    keeper = keeper_for(log, Claim(0, "w", T0, 10 * SECOND), T0 + 9 * SECOND)
    log.race = encode(Claim(0, "rescuer", T0 + 10 * SECOND, 10 * SECOND))
    assert keeper.renew_once() is Verdict.LEASE_LOST
    assert keeper.cancelled.is_set()
    assert [v for _, v in full_fold(log)] == [Verdict.WON, Verdict.TAKEOVER, Verdict.LEASE_LOST]


def test_a_lease_lapsed_by_our_own_clock_is_lost_and_not_renewed() -> None:
    """Frozen past the expiry it last secured, the keeper writes no RENEW (nobody took the
    task yet, but it cannot vouch for the lease): it cancels, and says it lapsed."""
    log = MemoryLog("claims")
    keeper = keeper_for(log, Claim(0, "w", T0, 10 * SECOND), T0 + 10 * SECOND)
    assert keeper.renew_once() is Verdict.LEASE_LOST
    assert keeper.cancelled.is_set() and keeper.lapsed and keeper.lost_to is None
    assert [v for _, v in full_fold(log)] == [Verdict.WON]  # no RENEW written


def test_a_renewal_moves_the_expiry_a_lapse_is_judged_by() -> None:
    log = MemoryLog("claims")
    clock = [T0 + 6 * SECOND]
    keeper = keeper_for(log, Claim(0, "w", T0, 10 * SECOND), T0)
    keeper.clock = keeper.fold_clock = lambda: clock[0]
    assert keeper.renew_once() is Verdict.RENEWED  # secured until T0 + 16 s
    clock[0] = T0 + 12 * SECOND
    assert not keeper.check_lapse()
    clock[0] = T0 + 16 * SECOND
    assert keeper.check_lapse() and keeper.lapsed and keeper.cancelled.is_set()


@pytest.mark.parametrize("seed", range(20))
def test_the_one_task_fold_gives_the_full_folds_verdicts(seed: int) -> None:
    """From any winning claim on, folding only that task's records agrees with the full
    fold on every record of that task (the reason the keeper may ignore other tasks)."""
    rng = random.Random(seed)
    records: list[ClaimsRecord] = []
    claims: list[int] = []  # positions of CLAIM records
    for position in range(120):
        task, worker, at = rng.randrange(4), rng.choice("abc"), T0 + position * SECOND
        kind = rng.random()
        if kind < 0.4 or not claims:
            records.append(Claim(task, worker, at, rng.choice([3, 10, 40]) * SECOND))
            claims.append(position)
            continue
        claim = rng.choice(claims[-6:])
        target = records[claim]
        assert isinstance(target, Claim)
        task, worker = (target.task, target.worker) if rng.random() < 0.8 else (task, worker)
        if kind < 0.75:
            records.append(Renew(task, worker, at, claim, 10 * SECOND))
        elif kind < 0.9:
            records.append(Done(task, worker, at, claim))
        else:
            retry = None if rng.random() < 0.3 else at + rng.randrange(5) * SECOND
            records.append(Fail(task, worker, at, claim, "boom", retry))
    full = ClaimState()
    verdicts = [full.apply(record, position).verdict for position, record in enumerate(records)]
    log = MemoryLog("claims")
    log.append_many([encode(r) for r in records])
    checked = 0
    for position, record in enumerate(records):
        if not (isinstance(record, Claim) and verdicts[position].won):
            continue
        fold = SingleTaskFold(record, position, position + 1)
        for entry in log.iter_from(position + 1):
            outcome = fold.feed(entry)
            if getattr(records[entry.position], "task", None) == record.task:
                assert outcome is not None
                assert outcome.verdict is verdicts[entry.position], (seed, entry.position)
                checked += 1
            else:
                assert outcome is None
    assert checked > 0


# -- the keeper under a worker -----------------------------------------------------------------


@pytest.fixture
def topics() -> tuple[MemoryLog, MemoryLog]:
    tasks = MemoryLog("tasks")
    Queue("memory", tasks_log=tasks).enqueue("the task")
    return tasks, MemoryLog("claims")


def make_worker(
    topics: tuple[MemoryLog, MemoryLog],
    run_dir: Path,
    name: str,
    handler: Any,
    clock: Callable[[], int] = lambda: T0,  # time stands still unless a test says otherwise
    **settings: Any,
) -> Worker:
    tasks, claims = topics
    config = WorkerConfig("memory", str(run_dir), name=name, **settings)
    return Worker(config, clock=clock, tasks_log=tasks, claims_log=claims, handler=handler)


def test_renewals_keep_a_task_past_its_first_lease(
    topics: tuple[MemoryLog, MemoryLog], tmp_path: Path
) -> None:
    seen: list[StepResult] = []
    rescuer = make_worker(topics, tmp_path, "rescuer", lambda p: "rescued")
    holder: Worker

    def long_task(payload: Any) -> str:
        wait_until(lambda: holder.stats.renewals >= 1, 30, "a renewal")
        # 2.5 s after our claim: past its first lease (2 s), inside the renewed one, since
        # the renewal was written at least 1 s (half the lease) after the claim.
        claim = full_fold(topics[1])[0][0]
        assert isinstance(claim, Claim)
        rescuer.catch_up()
        seen.append(rescuer.attempt(0, claim.at + 2_500_000))
        return "mine"

    holder = make_worker(topics, tmp_path, "holder", long_task, clock=now_us, lease_s=2.0)
    result = holder.step(now=now_us())
    assert result.kind is StepKind.DONE
    assert (seen[0].kind, seen[0].verdict) == (StepKind.LOST, Verdict.LOST_HELD)
    assert holder.stats.renewals >= 1


def rescuer_id(topics: tuple[MemoryLog, MemoryLog]) -> str:
    takeover = [r for r, v in full_fold(topics[1]) if v is Verdict.TAKEOVER]
    assert len(takeover) == 1 and isinstance(takeover[0], Claim)
    return takeover[0].worker


def run_in_thread(worker: Worker) -> tuple[threading.Thread, list[StepResult]]:
    results: list[StepResult] = []
    thread = threading.Thread(target=lambda: results.append(worker.step(now=T0)))
    thread.start()
    return thread, results


def take_over(topics: tuple[MemoryLog, MemoryLog], tmp_path: Path, holder: Worker) -> None:
    """Once `holder` runs task 0, another worker whose clock is past the lease takes it."""
    wait_until(lambda: holder.stats.current_task == 0, 20, "the holder to start the task")
    rescuer = make_worker(topics, tmp_path, "rescuer", lambda p: "rescued", lease_s=0.2)
    taken = rescuer.step(now=T0 + 10 * SECOND)
    assert (taken.kind, taken.verdict) == (StepKind.DONE, Verdict.DONE)
    assert rescuer.stats.takeovers == 1


def test_a_takeover_cancels_the_handler_and_no_done_is_written(
    topics: tuple[MemoryLog, MemoryLog], tmp_path: Path
) -> None:
    def honours_cancellation(payload: Any, ctx: TaskContext) -> str:
        ctx.sleep(120)  # raises TaskCancelled as soon as the lease is lost
        return "never"

    # a short lease: the keeper renews (and so looks at the log) every 0.1 s of real time
    holder = make_worker(topics, tmp_path, "holder", honours_cancellation, lease_s=0.2)
    thread, results = run_in_thread(holder)
    try:
        take_over(topics, tmp_path, holder)
    finally:
        thread.join(60)
    assert results[0].kind is StepKind.CANCELLED
    assert results[0].error is not None and "TaskCancelled" in results[0].error
    completions = [r for r, _ in full_fold(topics[1]) if isinstance(r, Done | Fail)]
    assert [r.worker for r in completions] == [rescuer_id(topics)]  # only the rescuer's DONE
    assert holder.stats.cancelled == 1
    assert holder.stats.leases_lost == 1
    assert not [t for t in threading.enumerate() if t.name.startswith("lease-task-")]


def test_a_handler_that_ignores_cancellation_gets_a_stale_done(
    topics: tuple[MemoryLog, MemoryLog], tmp_path: Path
) -> None:
    def ignores_cancellation(payload: Any, ctx: TaskContext) -> str:
        ctx.cancelled.wait(120)
        return "finished anyway"

    holder = make_worker(topics, tmp_path, "holder", ignores_cancellation, lease_s=0.2)
    thread, results = run_in_thread(holder)
    try:
        take_over(topics, tmp_path, holder)
    finally:
        thread.join(60)
    assert (results[0].kind, results[0].verdict) == (StepKind.STALE, Verdict.STALE_DONE)
    last, verdict = full_fold(topics[1])[-1]
    assert isinstance(last, Done) and last.worker == holder.worker_id
    assert last.result == "finished anyway"  # the evidence stays in the log
    assert verdict is Verdict.STALE_DONE
    assert holder.stats.stale == 1
    assert holder.stats.cancelled == 0
