"""The worker loop, stepped one iteration at a time with an injected clock over MemoryLogs."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import pytest

import queue_worker.worker.loop as worker_module
from logstore import Entry, MemoryLog
from queue_worker.producer import Queue
from queue_worker.protocol.clock import now_us
from queue_worker.protocol.records import (
    Claim,
    ClaimsRecord,
    Done,
    Fail,
    Renew,
    TaskRecord,
    Unknown,
    encode,
)
from queue_worker.protocol.state import ClaimState, Outcome, Verdict
from queue_worker.topics import (
    ClaimsFollower,
    decode_claims_entry,
    on_server_clock,
    open_topics,
)
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.handlers import TaskContext
from queue_worker.worker.loop import StepKind, StepResult, Worker
from queue_worker.worker.pick import (
    SPREAD_GRACE_US,
    pick_first,
    pick_random,
    pick_spread,
    pick_task,
)
from tests.helpers import RacingLog, wait_until

SECOND = 1_000_000
T0 = 1_700_000_000 * SECOND


class FakeClock:
    """A wall clock in µs that moves only when told to."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> int:
        self.now += round(seconds * SECOND)
        return self.now


def echo(payload: Any, ctx: TaskContext) -> Any:
    return {"echo": payload, "task": ctx.task_id}


@dataclass
class Cluster:
    """Two shared in-memory topics, a producer, and workers made on demand."""

    run_dir: Path
    tasks: MemoryLog = field(default_factory=lambda: MemoryLog("tasks"))
    claims: MemoryLog = field(default_factory=lambda: MemoryLog("claims"))

    def __post_init__(self) -> None:
        self.queue = Queue("memory", tasks_log=self.tasks)

    def worker(
        self,
        name: str = "w0",
        *,
        clock: Callable[[], int] | None = None,
        handler: Callable[..., Any] = echo,
        seed: int = 0,
        claim_ahead: bool = True,
        **settings: Any,
    ) -> Worker:
        config = WorkerConfig("memory", str(self.run_dir), name=name, **settings)
        return Worker(
            config,
            clock=clock if clock is not None else FakeClock(),
            tasks_log=self.tasks,
            claims_log=self.claims,
            rng=random.Random(seed),
            handler=handler,
            claim_ahead=claim_ahead,
        )

    def fold(self) -> list[tuple[ClaimsRecord, Outcome]]:
        """Every claims record with its verdict, as any reader of the whole log sees it."""
        follower = ClaimsFollower(self.claims.start)
        folded = [follower.apply(entry) for entry in self.claims.iter_from(self.claims.start)]
        return [(record, outcome) for outcome, record in folded]

    def state(self) -> ClaimState:
        follower = ClaimsFollower(self.claims.start)
        follower.catch_up(self.claims)
        return follower.state


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path / "run")


def verdicts(cluster: Cluster) -> list[tuple[str, Verdict]]:
    return [(type(r).__name__, o.verdict) for r, o in cluster.fold()]


# -- one worker ------------------------------------------------------------------------------


def test_a_worker_claims_wins_runs_and_writes_done(cluster: Cluster) -> None:
    cluster.queue.enqueue("hello")
    worker = cluster.worker()
    result = worker.step()
    assert result.kind is StepKind.DONE
    assert result.task == 0
    assert result.verdict is Verdict.DONE
    assert result.result == {"echo": "hello", "task": 0}
    assert result.latency_us is not None and result.latency_us >= 0
    assert verdicts(cluster) == [("Claim", Verdict.WON), ("Done", Verdict.DONE)]
    done = cluster.fold()[1][0]
    assert isinstance(done, Done)
    assert done.claim == result.claim  # the fencing token: the position of the CLAIM
    assert done.result == {"echo": "hello", "task": 0}
    assert worker.step().kind is StepKind.IDLE


def test_records_carry_the_workers_clock_and_unique_id(cluster: Cluster) -> None:
    cluster.queue.enqueue("x")
    clock = FakeClock(T0 + 42)
    worker = cluster.worker("alpha", clock=clock, lease_s=5)
    worker.step()
    claim = cluster.fold()[0][0]
    assert claim == Claim(0, worker.worker_id, T0 + 42, 5 * SECOND)
    name, pid, suffix = worker.worker_id.split("-")
    assert name == "alpha" and pid.isdigit() and len(suffix) == 4
    assert cluster.worker("alpha").worker_id != worker.worker_id


def test_an_idle_worker_says_whether_the_queue_is_drained(cluster: Cluster) -> None:
    worker = cluster.worker()
    assert worker.step() == StepResult(StepKind.IDLE, drained=True)
    cluster.queue.enqueue("x")
    assert worker.step().kind is StepKind.DONE
    assert worker.step() == StepResult(StepKind.IDLE, drained=True)


def test_a_task_held_by_another_is_not_claimed_until_its_lease_runs_out(
    cluster: Cluster,
) -> None:
    cluster.queue.enqueue("x")
    cluster.claims.append(encode(Claim(0, "dead-1-0000", T0, 10 * SECOND)))
    worker = cluster.worker()
    idle = worker.step(now=T0 + 5 * SECOND)
    assert idle == StepResult(StepKind.IDLE, drained=False, next_change=T0 + 10 * SECOND)
    assert worker.stats.attempts == 0


# -- several workers ---------------------------------------------------------------------------


def test_two_workers_one_task_one_wins_and_the_others_claim_loses(cluster: Cluster) -> None:
    cluster.queue.enqueue("only")
    first, second = cluster.worker("a"), cluster.worker("b")
    first.catch_up()
    second.catch_up()
    assert first.pick(T0) == second.pick(T0) == 0  # both saw it claimable
    assert first.attempt(0, T0).kind is StepKind.DONE
    lost = second.attempt(0, T0)
    assert lost.kind is StepKind.LOST
    assert lost.verdict is Verdict.LOST_DONE
    assert second.stats.lost == {"lost: done": 1}
    assert [v for _, v in verdicts(cluster)] == [Verdict.WON, Verdict.DONE, Verdict.LOST_DONE]


def test_a_claim_while_another_holds_the_task_loses_as_held(cluster: Cluster) -> None:
    cluster.queue.enqueue("only")
    other = cluster.worker("b")
    seen: list[StepResult] = []

    def meanwhile(payload: Any) -> str:
        seen.append(other.attempt(0, T0))  # the other claims while we run the task
        return "ok"

    holder = cluster.worker("a", handler=meanwhile)
    assert holder.step(now=T0).kind is StepKind.DONE
    assert seen[0].kind is StepKind.LOST
    assert seen[0].verdict is Verdict.LOST_HELD


def test_a_lapsed_lease_is_taken_over_by_a_worker_with_a_later_clock(cluster: Cluster) -> None:
    cluster.queue.enqueue("job")
    late = FakeClock(T0 + 31 * SECOND)
    rescuer = cluster.worker("b", clock=late, lease_s=30)
    rescued: list[StepResult] = []

    def stalls(payload: Any) -> str:
        # Our lease (30 s from T0) lapses while we "stall": the rescuer's clock is past it.
        rescued.append(rescuer.step())
        return "late"

    stalled = cluster.worker("a", handler=stalls, lease_s=30)
    result = stalled.step(now=T0)
    assert rescued[0].kind is StepKind.DONE
    assert rescuer.stats.takeovers == 1
    # The stalled worker completed anyway: its DONE is written and refused as stale.
    assert result.kind is StepKind.STALE
    assert result.verdict is Verdict.STALE_DONE
    assert stalled.stats.stale == 1
    assert [v for _, v in verdicts(cluster)] == [
        Verdict.WON,
        Verdict.TAKEOVER,
        Verdict.DONE,
        Verdict.STALE_DONE,
    ]


def test_a_takeover_can_be_forced_with_a_dead_workers_claim(cluster: Cluster) -> None:
    cluster.queue.enqueue("x")
    cluster.claims.append(encode(Claim(0, "dead-1-0000", T0, 10 * SECOND)))
    worker = cluster.worker()
    result = worker.step(now=T0 + 10 * SECOND)
    assert result.kind is StepKind.DONE
    assert [v for _, v in verdicts(cluster)] == [Verdict.WON, Verdict.TAKEOVER, Verdict.DONE]


# -- failure, backoff, retry, dead -------------------------------------------------------------


def test_a_failing_task_is_retried_after_a_backoff_then_dead(cluster: Cluster) -> None:
    cluster.queue.enqueue("doomed")
    attempts: list[int] = []

    def fails(payload: Any, ctx: TaskContext) -> None:
        attempts.append(ctx.attempt)
        raise RuntimeError(f"attempt {ctx.attempt} failed")

    clock = FakeClock()
    worker = cluster.worker(
        handler=fails, clock=clock, max_attempts=3, backoff_s=2.0, backoff_max_s=3.0
    )
    ceilings = [2 * SECOND, 3 * SECOND]  # 2 s * 2**(n-1), capped at 3 s
    for attempt, ceiling in enumerate(ceilings, start=1):
        failed = worker.step()
        assert failed.kind is StepKind.FAILED
        assert failed.error == f"RuntimeError: attempt {attempt} failed"
        assert failed.retry_at is not None
        assert clock.now <= failed.retry_at <= clock.now + ceiling
        if failed.retry_at > clock.now:  # (full jitter may pick no wait at all)
            clock.now = failed.retry_at - 1
            backing_off = worker.step()
            assert backing_off.kind is StepKind.IDLE
            assert backing_off.next_change == failed.retry_at
            assert not backing_off.drained
        clock.now = failed.retry_at
    dead = worker.step()
    assert dead.kind is StepKind.DEAD
    assert dead.retry_at is None
    assert attempts == [1, 2, 3]
    state = cluster.state()
    assert state.is_dead(0)
    assert state.dead_error(0) == "RuntimeError: attempt 3 failed"
    assert worker.step().drained
    assert worker.stats.failed == 3
    assert worker.stats.last_error == "task 0: RuntimeError: attempt 3 failed"


def test_an_unreadable_task_record_is_failed_for_good(cluster: Cluster) -> None:
    cluster.tasks.append(msgpack.packb([1, "T", "payload", "not a time"]))
    worker = cluster.worker(max_attempts=5)
    result = worker.step()
    assert result.kind is StepKind.DEAD
    assert result.error is not None and "RecordDecodeError" in result.error
    assert worker.step().drained


def test_a_task_record_of_an_unknown_type_is_left_for_a_newer_worker(cluster: Cluster) -> None:
    cluster.tasks.append(msgpack.packb([2, "X", "from the future"]))
    cluster.queue.enqueue("ours")
    worker = cluster.worker()
    result = worker.step()
    assert (result.kind, result.task) == (StepKind.DONE, 1)
    idle = worker.step()
    assert idle.kind is StepKind.IDLE and idle.drained
    assert len(cluster.fold()) == 2  # nothing was written about task 0


# -- the claims log as a foreign reader may find it ---------------------------------------------


def test_unknown_and_malformed_claims_records_are_skipped(cluster: Cluster) -> None:
    cluster.claims.append(msgpack.packb([1, "Z", "a record type from the future"]))
    cluster.claims.append(b"\xc1 not msgpack")
    cluster.queue.enqueue("x")
    worker = cluster.worker()
    assert worker.step().kind is StepKind.DONE
    assert worker.claims.state.unknown_count == 2
    assert worker.claims.malformed == 1
    assert worker.stats.last_error is not None
    assert "malformed claims record at position 1" in worker.stats.last_error


# -- the server's clock (Redis) --------------------------------------------------------------------


def test_records_are_judged_on_the_servers_clock_when_the_backend_stamps_them() -> None:
    claim = Claim(3, "w", at=100, lease=50)
    assert on_server_clock(claim, 7_000) == Claim(3, "w", at=7_000, lease=50)
    fail = Fail(3, "w", at=100, claim=0, error="e", retry_at=160)
    assert on_server_clock(fail, 7_000) == Fail(3, "w", 7_000, 0, "e", retry_at=7_060)
    dead = Fail(3, "w", at=100, claim=0, error="e", retry_at=None)
    assert on_server_clock(dead, 7_000) == Fail(3, "w", 7_000, 0, "e", None)
    assert on_server_clock(Unknown("Z"), 7_000) == Unknown("Z")
    entry = Entry(0, 1, encode(Renew(3, "w", 100, 0, 50)), server_time_us=9_000)
    assert decode_claims_entry(entry) == Renew(3, "w", 9_000, 0, 50)
    assert decode_claims_entry(Entry(0, 1, encode(claim))) == claim


@pytest.mark.redis
def test_on_redis_a_fast_clock_cannot_take_over_a_held_task(redis_url: str, tmp_path: Path) -> None:
    # Client verdicts: the worker's own fold judges its CLAIM (server verdicts never offer a
    # held task: tests/test_redis_e2e.py runs the clock-skew cases in both modes)
    url = f"{redis_url}?verdicts=client"
    tasks, claims = open_topics(url)
    other_tasks, other_claims = open_topics(url)
    try:
        Queue(url, tasks_log=tasks).enqueue("x")
        config = WorkerConfig(url, str(tmp_path), lease_s=30)
        # This worker's clock reads an hour ahead: by its own clock every lease ran out.
        fast = Worker(
            config,
            clock=lambda: now_us() + 3600 * SECOND,
            tasks_log=other_tasks,
            claims_log=other_claims,
        )
        seen: list[StepResult] = []

        def meanwhile(payload: Any) -> str:
            seen.append(fast.step())
            seen.append(fast.step())
            return "ok"

        holder = Worker(config, tasks_log=tasks, claims_log=claims, handler=meanwhile)
        assert holder.step().kind is StepKind.DONE
        # The fold judges by the server's clock: the fast worker's claim loses ...
        assert (seen[0].kind, seen[0].verdict) == (StepKind.LOST, Verdict.LOST_HELD)
        # ... and from its own claim it learned its offset, so it does not try again.
        assert fast.clock_offset_us < -3500 * SECOND
        assert seen[1].kind is StepKind.IDLE
    finally:
        for log in (tasks, claims, other_tasks, other_claims):
            log.close()


# -- picking --------------------------------------------------------------------------------------


def state_with(closed: tuple[int, ...] = (), held: tuple[int, ...] = ()) -> ClaimState:
    state = ClaimState()
    position = 0
    for task in closed:
        state.apply(Claim(task, "w", T0, SECOND), position)
        state.apply(Done(task, "w", T0, position), position + 1)
        position += 2
    for task in held:
        state.apply(Claim(task, "w", T0, 100 * SECOND), position)
        position += 1
    return state


def test_pick_first_takes_the_lowest_claimable_id() -> None:
    state = state_with(closed=(0, 1), held=(2,))
    assert pick_first(state, T0, known=6) == 3
    assert pick_first(state, T0, known=6, excluded={3}) == 4
    assert pick_first(state, T0, known=3) is None


def test_pick_random_is_spread_over_the_claimable_set() -> None:
    state = state_with(closed=(0, 1, 5), held=(2,))
    rng = random.Random(7)
    picks = {pick_random(state, T0, 10, rng) for _ in range(200)}
    assert picks == {3, 4, 6, 7, 8, 9}
    assert pick_random(state_with(closed=(0, 1)), T0, 2, rng) is None


def test_pick_random_falls_back_to_a_scan_when_the_claimable_set_is_sparse() -> None:
    state = state_with(held=tuple(range(1, 1000)))  # only task 0 is claimable
    rng = random.Random(3)
    assert {pick_random(state, T0, 1000, rng) for _ in range(20)} == {0}


def test_pick_spread_prefers_the_workers_own_slot_then_falls_back() -> None:
    state = state_with(closed=(0, 1, 2, 3))
    rng = random.Random(1)
    assert pick_spread(state, T0, 20, slot=2, slots=4, rng=rng) == 6
    assert pick_spread(state, T0, 20, slot=3, slots=4, rng=rng) == 7
    own_slot_busy = state_with(closed=(0, 1, 2, 3), held=(6, 10, 14, 18))
    assert pick_spread(own_slot_busy, T0, 20, slot=2, slots=4, rng=rng) not in {6, 10, 14, 18}
    assert pick_spread(own_slot_busy, T0, 20, slot=2, slots=4, rng=rng) is not None


def test_spread_leaves_a_fresh_task_to_its_own_slot_for_the_grace(cluster: Cluster) -> None:
    """With no backlog, an idle worker does not jump on another slot's new task at once
    (so the idle workers do not all collide on it); after the grace it takes it."""
    clock = FakeClock()
    other = cluster.worker("w1", clock=clock, pick="spread", slot=1, slots=2)
    cluster.queue.enqueue("for slot 0")  # task 0: 0 % 2 == 0, not w1's part
    idle = other.step()
    assert idle.kind is StepKind.IDLE
    assert idle.next_change == T0 + SPREAD_GRACE_US  # it looks again when the grace is over
    assert cluster.fold() == []  # no CLAIM was written
    clock.advance(SPREAD_GRACE_US / SECOND)
    taken = other.step()
    assert (taken.kind, taken.task) == (StepKind.DONE, 0)


def test_spread_takes_its_own_fresh_task_at_once(cluster: Cluster) -> None:
    owner = cluster.worker("w0", pick="spread", slot=0, slots=2)
    cluster.queue.enqueue("for slot 0")
    done = owner.step()
    assert (done.kind, done.task) == (StepKind.DONE, 0)


def test_pick_task_refuses_an_unknown_strategy() -> None:
    with pytest.raises(ValueError, match="pick strategy 'best' is unknown"):
        pick_task("best", ClaimState(), T0, 1, rng=random.Random())


def lost_attempts_with(strategy: str, tmp_path: Path, workers: int = 8, tasks: int = 96) -> int:
    """Eight workers working a backlog in lock step: each round, all catch up and pick
    before any of them claims — the worst case for collisions. Returns the lost attempts."""
    cluster = Cluster(tmp_path / strategy)
    cluster.queue.enqueue_many(list(range(tasks)))
    crew = [
        # claim_ahead off: this drives `attempt` one claim at a time
        cluster.worker(f"w{n}", pick=strategy, slot=n, slots=workers, seed=n, claim_ahead=False)
        for n in range(workers)
    ]
    for _ in range(tasks * 2):
        for worker in crew:
            worker.catch_up()
        picks = [(worker, worker.pick(T0)) for worker in crew]
        if all(task is None for _, task in picks):
            break
        for worker, task in picks:
            if task is not None:
                worker.attempt(task, T0)
    state = cluster.state()
    assert state.done_count == tasks
    return sum(worker.stats.lost_total for worker in crew)


def test_spread_collides_less_than_first(tmp_path: Path) -> None:
    first = lost_attempts_with("first", tmp_path)
    spread = lost_attempts_with("spread", tmp_path)
    random_ = lost_attempts_with("random", tmp_path)
    assert spread < first
    assert random_ < first
    assert spread <= random_


# -- running --------------------------------------------------------------------------------------


def test_exit_when_drained_returns_once_everything_is_done(cluster: Cluster) -> None:
    cluster.queue.enqueue_many(list(range(12)))
    worker = cluster.worker(exit_when_drained=True)
    assert worker.run() == "queue drained"
    assert cluster.state().done_count == 12
    assert worker.stats.finished == 12


def test_drain_makes_no_new_claims(cluster: Cluster) -> None:
    cluster.queue.enqueue("x")
    worker = cluster.worker()
    worker.drain()
    assert worker.step().kind is StepKind.DRAINING
    assert worker.run() == "drained"
    assert len(cluster.fold()) == 0


def test_run_finishes_the_task_in_hand_when_stopped(cluster: Cluster) -> None:
    cluster.queue.enqueue_many(["a", "b", "c"])
    stop = threading.Event()

    def stops_the_worker(payload: Any) -> str:
        stop.set()
        return payload  # type: ignore[no-any-return]

    worker = cluster.worker(handler=stops_the_worker)
    assert worker.run(stop) == "stopped"
    assert verdicts(cluster) == [("Claim", Verdict.WON), ("Done", Verdict.DONE)]


# -- the next CLAIM appended with the DONE -------------------------------------------------------


def test_the_next_claim_goes_with_the_done_and_the_next_step_settles_it(cluster: Cluster) -> None:
    cluster.queue.enqueue_many(["a", "b", "c"])
    worker = cluster.worker(pick="first")
    first = worker.step()
    assert (first.kind, first.task) == (StepKind.DONE, 0)
    # CLAIM 0, then one batch: DONE 0 and CLAIM 1, both folded by the worker; the claim is
    # counted and worked by the next step.
    folded = cluster.fold()
    assert verdicts(cluster) == [
        ("Claim", Verdict.WON),
        ("Done", Verdict.DONE),
        ("Claim", Verdict.WON),
    ]
    assert folded[2][0].task == 1  # type: ignore[union-attr]
    assert worker.claims.next_position == cluster.claims.end()
    assert worker.stats.attempts == 1 and worker.stats.current_task is None
    second = worker.step()
    assert (second.kind, second.task, second.claim) == (StepKind.DONE, 1, 2)
    assert second.latency_us is not None and second.latency_us >= 0
    assert worker.step().task == 2
    # The last task's DONE goes alone: there was nothing left to claim.
    assert [kind for kind, _ in verdicts(cluster)] == ["Claim", "Done"] * 3
    idle = worker.step()
    assert idle.kind is StepKind.IDLE and idle.drained
    assert (worker.stats.attempts, worker.stats.won, worker.stats.finished) == (3, 3, 3)


def test_a_claim_made_ahead_is_worked_even_when_draining(cluster: Cluster) -> None:
    cluster.queue.enqueue_many(["a", "b", "c"])
    worker = cluster.worker(pick="first")
    assert worker.step().kind is StepKind.DONE  # and CLAIM 1 went with its DONE
    worker.drain()
    assert worker.run() == "drained"
    state = cluster.state()
    # Task 1 was in hand, so it was finished; task 2 was never claimed; nothing is held.
    assert state.is_done(0) and state.is_done(1) and not state.is_closed(2)
    assert state.held_count == 0
    assert verdicts(cluster)[-1] == ("Done", Verdict.DONE)


def test_a_claim_made_ahead_that_loses_is_a_lost_attempt(tmp_path: Path) -> None:
    claims = RacingLog()
    cluster = Cluster(tmp_path / "run", claims=claims)
    cluster.queue.enqueue_many(["a", "b"])

    def meanwhile(payload: Any) -> Any:
        # While task 0 runs, another worker's CLAIM of task 1 is about to land: our pick of
        # task 1 (made before it lands) goes with our DONE and loses to it.
        claims.race = encode(Claim(1, "other", T0, 60 * SECOND))
        return payload

    worker = cluster.worker(pick="first", handler=meanwhile)
    assert worker.step().kind is StepKind.DONE
    lost = worker.step()
    assert (lost.kind, lost.task, lost.verdict) == (StepKind.LOST, 1, Verdict.LOST_HELD)
    assert worker.stats.lost == {Verdict.LOST_HELD.value: 1}
    assert verdicts(cluster) == [
        ("Claim", Verdict.WON),
        ("Claim", Verdict.WON),  # the other worker's
        ("Done", Verdict.DONE),
        ("Claim", Verdict.LOST_HELD),
    ]


def test_run_wakes_for_a_task_enqueued_while_it_waits(cluster: Cluster) -> None:
    stop = threading.Event()
    done: list[Any] = []

    def record(payload: Any) -> None:
        done.append(payload)
        stop.set()

    worker = cluster.worker(handler=record, idle_poll_s=30.0)  # only a wake-up ends the wait
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        wait_until(lambda: worker.stats.state == "idle", 10, "the worker to go idle")
        cluster.queue.enqueue("late")
        thread.join(20)
        assert not thread.is_alive()
        assert done == ["late"]
    finally:
        stop.set()
        thread.join(40)


# -- stats ---------------------------------------------------------------------------------------


def read_snapshot(worker: Worker) -> dict[str, Any]:
    path = Path(worker.config.run_dir) / f"{worker.worker_id}.json"
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    return data


def test_stats_move_and_are_published(cluster: Cluster) -> None:
    cluster.queue.enqueue_many(["a", "b"])
    # claim_ahead off: after one step, the fold is at the log's end (no CLAIM left to settle)
    worker = cluster.worker(exit_when_drained=True, claim_ahead=False)
    assert worker.stats.known_tasks == 0
    worker.step()
    stats = worker.stats
    assert (stats.attempts, stats.won, stats.finished) == (1, 1, 1)
    assert stats.known_tasks == 2
    assert stats.done_tasks == 1
    assert stats.held_by_anyone == 0
    assert stats.consumed_up_to == cluster.claims.end()
    assert stats.latency_samples == 1
    assert stats.current_task is None
    worker.run()
    snapshot = read_snapshot(worker)
    assert snapshot["state"] == "exited"
    assert snapshot["exit_reason"] == "queue drained"
    assert snapshot["finished"] == 2
    assert snapshot["done_tasks"] == 2
    assert snapshot["claim_latency_micros"]["samples"] == 2
    assert snapshot["worker"] == worker.worker_id


def test_stats_show_the_task_in_hand(cluster: Cluster) -> None:
    cluster.queue.enqueue("x")
    seen: dict[str, Any] = {}
    worker: Worker

    def look(payload: Any) -> None:
        seen.update(
            state=worker.stats.state,
            task=worker.stats.current_task,
            claim=worker.stats.current_claim,
            expiry=worker.stats.lease_expiry,
            held=worker.stats.held_by_anyone,
        )

    worker = cluster.worker(handler=look, clock=FakeClock(T0), lease_s=30)
    worker.step()
    assert seen == {
        "state": "working",
        "task": 0,
        "claim": 0,
        "expiry": (T0 + 30 * SECOND) / SECOND,
        "held": 1,
    }


def test_a_lost_claim_is_counted_by_its_verdict(cluster: Cluster) -> None:
    cluster.queue.enqueue("x")
    cluster.claims.append(encode(Claim(0, "other-1-0000", T0, 100 * SECOND)))
    worker = cluster.worker()
    result = worker.attempt(0, T0)
    assert (result.kind, result.verdict) == (StepKind.LOST, Verdict.LOST_HELD)
    assert worker.stats.lost == {"lost: held": 1}
    assert worker.stats.attempts == 1 and worker.stats.won == 0


def test_a_config_is_checked_when_the_worker_is_made(cluster: Cluster) -> None:
    with pytest.raises(ValueError, match="pick 'best' is unknown"):
        cluster.worker(pick="best")


def test_task_records_are_what_the_producer_wrote(cluster: Cluster) -> None:
    cluster.queue.enqueue({"nested": [1, 2]})
    worker = cluster.worker()
    worker.catch_up()
    assert worker.tasks.load(cluster.tasks, 0).payload == {"nested": [1, 2]}
    assert isinstance(worker.tasks.load(cluster.tasks, 0), TaskRecord)


def test_an_idle_spread_worker_steps_aside_only_for_another_slots_next_task(
    cluster: Cluster,
) -> None:
    worker = cluster.worker("w1", pick="spread", slot=1, slots=4)
    cluster.queue.enqueue_many(["a"] * 4)
    worker.catch_up()
    assert worker.tasks.known == 4
    assert worker._next_task_is_anothers()  # task 4 will be slot 0's
    cluster.queue.enqueue("b")
    worker.catch_up()
    assert not worker._next_task_is_anothers()  # task 5 will be ours
    assert not cluster.worker("r", pick="random", slot=1, slots=4)._next_task_is_anothers()


@pytest.mark.parametrize(("fresh_s", "ahead_task"), [(0.0, 2), (3600.0, 1)])
def test_after_a_long_task_the_claim_ahead_is_picked_on_a_caught_up_fold(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, fresh_s: float, ahead_task: int
) -> None:
    """A task that ran longer than FRESH_FOLD_S: the fold is caught up before the pick, and
    another worker's claim made meanwhile is seen. A short one: the pick uses the fold as
    our claim's settling left it (and may lose, as here, to a claim it could not see)."""
    monkeypatch.setattr(worker_module, "FRESH_FOLD_S", fresh_s)
    cluster.queue.enqueue_many(["a", "b", "c"])

    def meanwhile(payload: Any) -> Any:
        cluster.claims.append(encode(Claim(1, "other", T0, 60 * SECOND)))
        return payload

    worker = cluster.worker(pick="first", handler=meanwhile)
    assert worker.step().kind is StepKind.DONE
    ahead = worker._ahead
    assert ahead is not None and ahead.claim.task == ahead_task
    result = worker.step()
    if ahead_task == 2:
        assert (result.kind, result.task) == (StepKind.DONE, 2)
    else:
        assert (result.kind, result.verdict) == (StepKind.LOST, Verdict.LOST_HELD)
