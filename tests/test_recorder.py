"""The stats recorder: a worker's named events in, the WorkerStats figures (and the published
snapshot) out."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from logstore import AppendError, LogError, MemoryLog
from queue_worker.protocol.records import Claim, Done, TaskRecord, encode
from queue_worker.protocol.state import Lease, Verdict
from queue_worker.topics import ClaimsFollower, TaskIndex
from queue_worker.worker.recorder import StatsRecorder
from queue_worker.worker.stats import WorkerStats, read_snapshot

OFFSET_US = 2_000_000  # the fold's clock runs 2 s ahead of ours in these tests


def recorder(path: Path | None = None) -> tuple[StatsRecorder, threading.Event]:
    stats = WorkerStats(worker="w0-1-abcd", name="w0", pid=1, host="box", started_at=0.0)
    draining = threading.Event()
    rec = StatsRecorder(
        stats, path, draining=draining, wall_seconds=lambda us: (us - OFFSET_US) / 1e6
    )
    return rec, draining


def in_hand(s: WorkerStats) -> tuple[object, ...]:
    return (s.current_task, s.current_claim, s.current_since, s.lease_expiry)


def log_error(s: WorkerStats) -> str | None:
    """(A call, so that the type checker does not keep a value narrowed across events.)"""
    return s.log_error


def test_claims_count_wins_takeovers_losses_and_latencies() -> None:
    rec, _ = recorder()
    rec.claimed(Verdict.WON, 100)
    rec.claimed(Verdict.TAKEOVER, 300)
    rec.claimed(Verdict.LOST_HELD, 200)
    rec.claimed(Verdict.LOST_DONE, 50)
    rec.claimed(Verdict.LOST_HELD, 60)
    s = rec.stats
    assert (s.attempts, s.won, s.takeovers) == (5, 2, 1)
    assert s.lost == {"lost: held": 2, "lost: done": 1}
    assert s.latency() == {"p50": 100, "p90": 300, "p99": 300, "samples": 5}


def test_a_task_in_hand_is_shown_and_cleared() -> None:
    rec, _ = recorder()
    before = time.time()
    rec.working(7, 42, expiry=OFFSET_US + 30_000_000)
    s = rec.stats
    assert (s.current_task, s.current_claim, s.lease_expiry) == (7, 42, 30.0)
    assert s.current_since is not None and s.current_since >= before
    rec.lease_renewed(OFFSET_US + 45_000_000)
    assert (s.renewals, s.lease_expiry) == (1, 45.0)
    rec.off_task()
    assert in_hand(rec.stats) == (None, None, None, None)


def test_how_tasks_end_moves_the_counters() -> None:
    rec, _ = recorder()
    s = rec.stats
    rec.finished()
    rec.failed(3, "ValueError: no")
    assert (s.finished, s.failed, s.last_error) == (1, 1, "task 3: ValueError: no")
    # a stale DONE the keeper had not noticed: the lost lease is counted here
    rec.stale(4, None, done=True, lease_noticed=False)
    assert (s.stale, s.leases_lost, s.timeouts) == (1, 1, 1)
    # a stale FAIL after the keeper counted the loss: nothing counted twice
    rec.stale(5, "boom", done=False, lease_noticed=True)
    assert (s.stale, s.leases_lost, s.timeouts, s.last_error) == (1, 1, 1, "task 5: boom")
    rec.cancelled(6, "the lease lapsed while paused or stalled")
    assert s.cancelled == 1
    assert s.last_error == "task 6: cancelled: the lease lapsed while paused or stalled"


def test_lease_events_from_the_keeper() -> None:
    rec, _ = recorder()
    s = rec.stats
    rec.working(9, 1, expiry=OFFSET_US)
    rec.lease_lost(Lease(5, "w1-2-beef", 0, 10))
    assert (s.leases_lost, s.timeouts, s.lease_expiry) == (1, 1, None)
    assert s.last_error == "task 9: lease lost (taken over by w1-2-beef)"
    rec.lease_lapsed(1_500_000)
    assert (s.leases_lapsed, s.leases_lost, s.timeouts) == (1, 2, 2)
    assert s.last_error is not None and "(1.5 s past its expiry)" in s.last_error
    rec.lease_error("renewal failed")
    assert s.last_error == "renewal failed"


def test_a_failing_log_is_noted_until_a_record_lands() -> None:
    rec, _ = recorder()
    s = rec.stats
    rec.settle_retrying(2, "DONE", AppendError("tasks.log: No space left on device"))
    assert s.log_error == "tasks.log: No space left on device"
    assert s.last_error == "task 2: DONE not settled, retrying: tasks.log: No space left on device"
    # a consequence of the failed append does not hide its cause ...
    rec.log_error(LogError("claims.log: our CLAIM of task 2 is not in the log"))
    assert s.log_error == "tasks.log: No space left on device"
    assert s.last_error == "claims.log: our CLAIM of task 2 is not in the log"
    # ... another failed append does
    rec.settle_retrying(2, "DONE", AppendError("connection lost"))
    assert s.log_error == "connection lost"
    rec.settle_given_up(2, "DONE", AppendError("connection lost"))
    assert s.last_error == (
        "task 2: DONE given up while draining (the lease lapsed): connection lost"
    )
    rec.log_recovered()
    assert log_error(s) is None
    rec.lapsed_out_of_reach(8)
    rec.lost_out_of_reach(9, "nothing recorded", lease_noticed=False)
    assert (s.cancelled, s.leases_lost, s.timeouts) == (2, 2, 2)
    assert s.last_error == "task 9: nothing recorded"


def test_states_read_draining_while_a_drain_is_asked() -> None:
    rec, draining = recorder()
    rec.state("working")
    assert rec.stats.state == "working"
    draining.set()
    rec.lease_tick()  # the keeper's thread shows the drain a signal handler asked for
    assert rec.stats.state == "draining"
    rec.state("claiming")
    assert rec.stats.state == "draining"
    rec.state("idle")
    assert rec.stats.state == "idle"


def test_a_task_taken_and_put_down_moves_the_state() -> None:
    rec, draining = recorder()
    rec.working(7, 42, expiry=OFFSET_US)
    assert rec.stats.state == "working"
    rec.off_task()
    assert rec.stats.state == "idle"
    draining.set()
    rec.working(8, 43, expiry=OFFSET_US)
    assert rec.stats.state == "draining"


def folds() -> tuple[TaskIndex, ClaimsFollower]:
    tasks_log, claims_log = MemoryLog("tasks"), MemoryLog("claims")
    for i in range(3):
        tasks_log.append(encode(TaskRecord(i, 0)))
    first = claims_log.append(encode(Claim(0, "w0-1-abcd", 0, 10**9)))
    claims_log.append(encode(Done(0, "w0-1-abcd", 1, first)))
    claims_log.append(encode(Claim(1, "w1-2-beef", 2, 10**9)))
    claims_log.append(b"\x93not a record")
    tasks, claims = TaskIndex(tasks_log.start), ClaimsFollower(claims_log.start)
    tasks.catch_up(tasks_log)
    claims.catch_up(claims_log)
    return tasks, claims


@pytest.mark.parametrize("event", ["folded", "claimed", "finished"])
def test_the_folds_figures_and_a_malformed_record_reported_once(event: str) -> None:
    tasks, claims = folds()
    rec, _ = recorder()
    if event == "folded":
        rec.folded(tasks, claims)
    elif event == "claimed":  # a claim's settling notes the folds in the same event
        rec.claimed(Verdict.WON, 10, (tasks, claims))
    else:
        rec.finished((tasks, claims))
    s = rec.stats
    assert (s.known_tasks, s.done_tasks, s.held_by_anyone) == (3, 1, 1)
    assert (s.tasks_position, s.consumed_up_to) == (tasks.next_position, claims.next_position)
    assert s.last_error is not None and "malformed claims record at position 3" in s.last_error
    s.last_error = None
    rec.folded(tasks, claims)
    assert s.last_error is None  # reported once


def test_exit_publishes_the_snapshot_at_once(tmp_path: Path) -> None:
    path = tmp_path / "w0.json"
    rec, _ = recorder(path)
    rec.claimed(Verdict.WON, 10)
    rec.finished()
    rec.exited("queue drained")
    snapshot = read_snapshot(path)
    assert snapshot is not None
    assert (snapshot["state"], snapshot["exit_reason"]) == ("exited", "queue drained")
    assert (snapshot["won"], snapshot["finished"]) == (1, 1)
    rec.timed_out(4, "timed out after 1.0 s")
    snapshot = read_snapshot(path)
    assert snapshot is not None
    assert (snapshot["failed"], snapshot["exit_reason"]) == (1, "task 4 timed out after 1.0 s")
