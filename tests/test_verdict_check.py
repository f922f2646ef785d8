"""`qw report` re-folds a Redis claims stream written with server verdicts and compares every
task with the server's state (queue_worker.proof.verdict_check): agreement passes, any difference
is named, loudly, with a non-zero exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import redis

from logstore.redis.log import RedisLog
from queue_worker.proof.verdict_check import check_log
from queue_worker.protocol.records import Claim, Done, Fail, TaskRecord, encode
from queue_worker.redis.server_verdicts import ServerVerdicts, index_key, state_key
from queue_worker.topics import open_topics

pytestmark = pytest.mark.redis

REPO = Path(__file__).resolve().parent.parent
NEVER = 10**9


@pytest.fixture
def url(redis_url: str) -> str:
    return f"{redis_url}?prefix=v{uuid.uuid4().hex[:10]}"


@pytest.fixture
def claims(url: str) -> Iterator[RedisLog]:
    """A queue of three tasks: 0 done, 1 held, 2 released after a FAIL; written through
    the verdict script."""
    tasks_log, claims_log = open_topics(url)
    with tasks_log, claims_log:
        for n in range(3):
            tasks_log.append(encode(TaskRecord({"n": n}, 1)))
        assert isinstance(claims_log, RedisLog)
        server = ServerVerdicts(claims_log)
        won = server.append(Claim(0, "w0-1-aa", 1, NEVER))
        server.append(Done(0, "w0-1-aa", 2, won.position, "ok"))
        server.append(Claim(1, "w1-2-bb", 3, NEVER))
        failed = server.append(Claim(2, "w0-1-aa", 4, NEVER))
        server.append(Fail(2, "w0-1-aa", 5, failed.position, "boom", 5 + NEVER))
        yield claims_log


def _tamper(url: str, log: RedisLog, task: int, state: dict[str, object]) -> None:
    client = redis.Redis.from_url(url.split("?")[0])
    try:
        client.hset(state_key(log), str(task), msgpack.packb(state))
    finally:
        client.close()


def report(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli.app", "report", "--log", url, *extra],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_the_fold_and_the_server_agree(claims: RedisLog) -> None:
    assert check_log(claims) == []


def test_a_task_the_server_holds_otherwise_is_named(url: str, claims: RedisLog) -> None:
    _tamper(url, claims, 1, {"s": "d"})  # the fold has task 1 held by w1
    [problem] = check_log(claims)
    assert problem.startswith("task 1: the server's verdicts say done;")
    assert "held by w1·2 under claim" in problem


def test_a_task_only_the_fold_knows_is_named(url: str, claims: RedisLog) -> None:
    client = redis.Redis.from_url(url.split("?")[0])
    try:
        client.hdel(state_key(claims), "2")
    finally:
        client.close()
    [problem] = check_log(claims)
    assert problem.startswith("task 2: the server's verdicts say never claimed;")
    assert "retry at" in problem and "'boom'" in problem


def test_an_index_that_is_not_the_open_tasks_is_named(url: str, claims: RedisLog) -> None:
    client = redis.Redis.from_url(url.split("?")[0])
    try:
        client.zadd(index_key(claims), {"0": 5})  # task 0 is done: not open
        client.zincrby(index_key(claims), 1, "1")  # task 1's expiry, off by one
    finally:
        client.close()
    first, second = check_log(claims)
    assert first.startswith("task 0: the server's index of open tasks says claimable from 5;")
    assert first.endswith("the fold says not open")
    assert second.startswith("task 1: the server's index of open tasks says claimable from ")


def test_a_record_written_without_the_script_is_named(claims: RedisLog) -> None:
    claims.append(encode(Claim(2, "w9-9-zz", 6, NEVER)))
    [problem] = check_log(claims)
    assert "a writer appended without them" in problem


def test_qw_report_passes_then_fails_loudly_on_a_disagreement(url: str, claims: RedisLog) -> None:
    ok = report(url)
    assert ok.returncode == 0, ok.stderr
    assert "BUG" not in ok.stderr
    _tamper(url, claims, 0, {"s": "x", "l": "never"})
    bad = report(url)
    assert bad.returncode == 3, bad.stdout + bad.stderr
    assert "qw: BUG: the server's verdicts disagree with the fold" in bad.stderr
    assert "qw: BUG: task 0: the server's verdicts say dead ('never'); " in bad.stderr
    as_json = report(url, "--json")
    assert as_json.returncode == 3
    [line] = json.loads(as_json.stdout)["verdict_disagreements"]
    assert line.startswith("task 0:")
