"""Compaction with server verdicts: the done tasks' fields of the verdicts' state go in the
step that trims the claims stream (queue_worker.compaction.verdict_trim), a kill -9 at every step
leaves the server's verdicts and the fold in agreement, and the verdicts do not change."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
import redis

from logstore.redis.log import RedisLog
from queue_worker.compaction.files import STEPS
from queue_worker.compaction.redis_streams import compact_redis
from queue_worker.compaction.settled import Retention
from queue_worker.proof.verdict_check import check_location
from queue_worker.protocol.records import Claim, Done, Fail, TaskRecord, encode
from queue_worker.protocol.state import Verdict
from queue_worker.redis.server_claim import ServerClaims
from queue_worker.redis.server_verdicts import ServerVerdicts, state_key
from queue_worker.topics import open_topics

pytestmark = pytest.mark.redis

NOW_US = 1_700_000_000_000_000
LEASE = 30_000_000
EVERYTHING = Retention(seconds=0, bytes=0)
DONE, PENDING = 300, 20
WORKER = "w0-1-aaaa"


@pytest.fixture
def url(redis_url: str) -> Iterator[str]:
    """300 tasks claimed through the server's claiming script and finished (every tenth
    dead at its first failure), then 20 never claimed."""
    location = f"{redis_url}?prefix=t{uuid.uuid4().hex[:10]}&verdicts=server"
    tasks_log, claims_log = open_topics(location)
    with tasks_log, claims_log:
        assert isinstance(tasks_log, RedisLog) and isinstance(claims_log, RedisLog)
        tasks_log.append_many(
            [encode(TaskRecord({"n": t}, NOW_US + t)) for t in range(DONE + PENDING)]
        )
        server = ServerClaims(claims_log, tasks_log)
        got = server.next(WORKER, LEASE, NOW_US)
        for t in range(DONE):
            assert got.claim is not None and got.claimed is not None and got.claim.task == t
            claim = got.claimed.position
            finish: Done | Fail = (
                Fail(t, WORKER, NOW_US, claim, f"boom {t}", None)
                if t % 10 == 3
                else Done(t, WORKER, NOW_US, claim, {"r": t})
            )
            got = server.next(WORKER, LEASE, NOW_US, finish=finish, claim=t < DONE - 1)
    yield location


def fields(url: str) -> dict[str, bytes]:
    tasks_log, claims_log = open_topics(url)
    with tasks_log, claims_log:
        assert isinstance(claims_log, RedisLog)
        key = state_key(claims_log)
    client = redis.Redis.from_url(url.split("?")[0])
    try:
        raw: dict[bytes, bytes] = client.hgetall(key)  # type: ignore[assignment]
    finally:
        client.close()
    return {k.decode(): v for k, v in raw.items()}


def task_fields(url: str) -> set[int]:
    return {int(name) for name in fields(url) if name.isdigit()}


def dead_tasks() -> set[int]:
    return {t for t in range(DONE) if t % 10 == 3}


def qw(*args: str, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    """`qw`; with `kill_at`, killed with SIGKILL when its compaction reaches that step
    (tests/qw_run.py)."""
    command = (
        ["supervisor.cli.app"]
        if kill_at is None
        else ["tests.qw_run", "--kill-compaction-at", kill_at, "--"]
    )
    return subprocess.run(
        [sys.executable, "-m", *command, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_claims_trim_drops_done_tasks_fields_and_the_verdicts_stay(url: str) -> None:
    assert task_fields(url) == set(range(DONE))
    compact_redis(url, EVERYTHING)
    # only the dead tasks' fields are left below the watermark, which ~below records
    assert task_fields(url) == dead_tasks()
    assert fields(url)["~below"] == str(DONE).encode()
    assert check_location(url) == []  # the report's cross-check: exact
    tasks_log, claims_log = open_topics(url)
    with tasks_log, claims_log:
        assert isinstance(tasks_log, RedisLog) and isinstance(claims_log, RedisLog)
        assert claims_log.start > 0  # trimmed
        verdicts = ServerVerdicts(claims_log)
        # a done task's CLAIM still loses as done, a dead one's as dead
        assert verdicts.append(Claim(5, "w1-2-bb", NOW_US, LEASE)).verdict is Verdict.LOST_DONE
        assert verdicts.append(Claim(3, "w1-2-bb", NOW_US, LEASE)).verdict is Verdict.LOST_DEAD
        # the next task handed out is the first never claimed
        got = ServerClaims(claims_log, tasks_log).next("w1-2-bb", LEASE, NOW_US)
        assert got.claim is not None and got.claim.task == DONE
    assert task_fields(url) == dead_tasks() | {DONE}  # (a lost CLAIM writes no field)
    assert check_location(url) == []
    shown = qw("report", "--log", url)
    assert shown.returncode == 0, shown.stdout + shown.stderr


@pytest.mark.parametrize("step", STEPS)
def test_kill_9_at_every_step_leaves_the_verdicts_and_the_fold_agreeing(
    url: str, step: str
) -> None:
    args = ("compact", "--log", url, "--retention", "0", "--retention-bytes", "0")
    killed = qw(*args, kill_at=step)
    assert killed.returncode == -9, killed.stderr
    # the drop is made in the claims trim's own call: before it nothing went, after it both
    trimmed = step == "dropped"
    assert task_fields(url) == (dead_tasks() if trimmed else set(range(DONE)))
    assert ("~below" in fields(url)) == trimmed
    assert check_location(url) == []
    finished = qw(*args)  # (it makes the trims a killed compaction listed, and the drop)
    assert finished.returncode == 0, finished.stderr
    assert task_fields(url) == dead_tasks()
    assert check_location(url) == []
    shown = qw("report", "--log", url)
    assert shown.returncode == 0, shown.stdout + shown.stderr
