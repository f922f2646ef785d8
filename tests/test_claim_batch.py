"""A worker's batch on a queue with server verdicts (queue_worker.redis.claim_batch), on a real
redis-server: several tasks claimed in one call while tasks are short, their DONEs sent
with the next call or before any other append, a task claimed ahead renewed before it runs
once its claim is old, and left when another worker took it over; each run exactly once
by the report's fold."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from logstore import LogError
from logstore.redis.log import RedisLog
from queue_worker.opening import open_worker
from queue_worker.producer import Queue
from queue_worker.proof.report import load_report
from queue_worker.proof.verdict_check import check_log
from queue_worker.protocol.records import Done, Renew, TaskRecord, encode
from queue_worker.protocol.state import Verdict
from queue_worker.redis.claim_batch import BATCH_MAX, ClaimBatch
from queue_worker.redis.server_claim import ServerClaims
from queue_worker.topics import decode_claims_entry, open_topics
from queue_worker.worker.config import WorkerConfig

pytestmark = pytest.mark.redis

NEVER = 10**9


@pytest.fixture
def logs(redis_url: str) -> Iterator[tuple[RedisLog, RedisLog]]:
    tasks, claims = open_topics(f"{redis_url}?prefix=b{uuid.uuid4().hex[:10]}")
    with tasks, claims:
        assert isinstance(tasks, RedisLog) and isinstance(claims, RedisLog)
        yield tasks, claims


def _enqueue(tasks: RedisLog, count: int) -> None:
    tasks.append_many([encode(TaskRecord({"n": n}, 1)) for n in range(count)])


def test_a_run_of_short_tasks_claims_several_a_call_and_each_is_done_once(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = 100
    with Queue(redis_url) as queue:
        queue.enqueue_many(list(range(tasks)))
    calls: list[tuple[int, int]] = []  # (tasks wanted, DONEs sent before the call's own)
    real_next = ServerClaims.next

    def counted(self: ServerClaims, *args: Any, **kwargs: Any) -> Any:
        calls.append((kwargs.get("want", 1), len(kwargs.get("earlier", ()))))
        return real_next(self, *args, **kwargs)

    monkeypatch.setattr(ServerClaims, "next", counted)
    ran: list[int] = []
    config = WorkerConfig(redis_url, str(tmp_path / "run"), name="w0", exit_when_drained=True)
    with open_worker(config, handler=ran.append) as worker:
        assert worker.run() == "queue drained"
        assert worker.stats.finished == tasks
    assert sorted(ran) == list(range(tasks))
    assert len(calls) < tasks // 2  # most calls claimed several tasks
    assert max(want for want, _ in calls) == BATCH_MAX
    assert max(earlier for _, earlier in calls) == BATCH_MAX - 1
    report = load_report(redis_url)
    assert report.ok and report.tasks_done == tasks and report.completions == tasks


def test_step_alone_sends_each_done_as_it_returns(redis_url: str, tmp_path: Path) -> None:
    with Queue(redis_url) as queue:
        queue.enqueue_many(list(range(10)))
    config = WorkerConfig(redis_url, str(tmp_path / "run"), name="w0")
    with open_worker(config, handler=lambda payload: payload) as worker:
        for _ in range(5):
            worker.step()
    # nothing held back: the five DONEs are in the stream
    report = load_report(redis_url)
    assert report.tasks_done == 5 and report.completions == 5


def _claim_three(logs: tuple[RedisLog, RedisLog], lease: int) -> tuple[ServerClaims, Any]:
    tasks, claims = logs
    _enqueue(tasks, 10)
    server = ServerClaims(claims, tasks)
    got = server.next("a-1-aa", lease, 1, want=3)
    assert got.claimed is not None and len(got.more) == 2
    return server, got


def test_a_done_held_is_sent_before_any_other_append(logs: tuple[RedisLog, RedisLog]) -> None:
    _, claims = logs
    server, got = _claim_three(logs, NEVER)
    assert got.claim is not None and got.claimed is not None
    done = Done(got.claim.task, "a-1-aa", 2, got.claimed.position, "ok")
    server.batch.hold(done, encode(done))
    nxt = got.more[0]
    renew = Renew(nxt.claim.task, "a-1-aa", 3, nxt.claimed.position, NEVER)
    renewed_at = server.verdict_log.append(encode(renew))  # the lease keeper's path
    records = [decode_claims_entry(e) for e in claims.read(claims.start)]
    assert [type(r).__name__ for r in records[-2:]] == ["Done", "Renew"]
    assert claims.read(renewed_at, 1)[0].position == renewed_at
    assert server.batch.take_held() == [] and server.batch.take_late() == ([], [])
    assert check_log(claims) == []


def test_a_task_claimed_ahead_is_renewed_before_it_runs_once_its_claim_is_old(
    logs: tuple[RedisLog, RedisLog],
) -> None:
    _, claims = logs
    lease = 60_000_000
    server, got = _claim_three(logs, lease)
    batch = server.batch
    # claimed a third of a lease ago (the task before it ran long)
    batch.keep(got.more, time.monotonic() - lease / 3_000_000)
    ahead = batch.take_ahead(server.verdict_log.server, "a-1-aa", lease, 5)
    assert ahead is not None and ahead.claim.task == got.more[0].claim.task
    last = decode_claims_entry(claims.read(claims.start)[-1])
    assert isinstance(last, Renew) and last.task == ahead.claim.task
    # the renewal began its lease again: its DONE may wait for the next call, as the
    # next task claimed with it is old too (it will be renewed in its turn)
    assert batch.can_hold(0.0, lease / 1_000_000)
    again = batch.take_ahead(server.verdict_log.server, "a-1-aa", lease, 6)
    assert again is not None and again.claim.task == got.more[1].claim.task
    last = decode_claims_entry(claims.read(claims.start)[-1])
    assert isinstance(last, Renew) and last.task == again.claim.task
    assert check_log(claims) == []


def test_a_task_claimed_ahead_that_another_worker_took_over_is_left(
    logs: tuple[RedisLog, RedisLog],
) -> None:
    _, claims = logs
    server, got = _claim_three(logs, -1000)  # leases lapsed at once: tasks 0, 1 and 2
    assert [m.claim.task for m in got.more] == [1, 2]
    batch = ClaimBatch()
    batch.keep(got.more, time.monotonic() - 1.0)
    other = server.next("b-2-bb", NEVER, 3, want=2)  # takes 0 and 1 over
    assert other.claim is not None and other.claim.task == 0
    assert [m.claim.task for m in other.more] == [1]
    assert other.more[0].claimed.verdict is Verdict.TAKEOVER
    # our claim on 1 is a second old, past a quarter of a 1 ms lease: renewed before it
    # runs, refused (b holds it), left; 2 is still ours
    ahead = batch.take_ahead(server.verdict_log.server, "a-1-aa", 1000, 4)
    assert ahead is not None and ahead.claim.task == 2
    verdicts = [decode_claims_entry(e) for e in claims.read(claims.start)][-2:]
    assert [type(r).__name__ for r in verdicts] == ["Renew", "Renew"]
    assert not batch.has_ahead
    assert check_log(claims) == []


def test_a_done_whose_call_never_landed_is_appended_again_through_the_script(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outage recovery's second append of a DONE (its call failed before reaching the
    server) goes through the verdict script like every other append of the worker: the
    server folds it, and the next call is not refused as behind a foreign writer."""
    with Queue(redis_url) as queue:
        queue.enqueue_many([0, 1, 2])
    real_next = ServerClaims.next
    failed: list[int] = []

    def fails_once_with_a_finish(self: ServerClaims, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("finish") is not None and not failed:
            failed.append(kwargs["finish"].task)
            raise LogError("the server went away (the call never reached it)")
        return real_next(self, *args, **kwargs)

    monkeypatch.setattr(ServerClaims, "next", fails_once_with_a_finish)
    config = WorkerConfig(
        redis_url, str(tmp_path / "run"), name="w0", exit_when_drained=True, idle_poll_s=0.01
    )
    with open_worker(config, handler=lambda payload: payload) as worker:
        assert worker.run() == "queue drained"
    assert failed == [0]
    report = load_report(redis_url)
    assert report.ok and report.tasks_done == 3 and report.completions == 3
    tasks_log, claims = open_topics(redis_url)
    with tasks_log, claims:
        assert isinstance(claims, RedisLog)
        assert check_log(claims) == []
