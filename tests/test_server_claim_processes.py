"""`qw up --log redis://…?verdicts=server`: worker processes that claim through the server
(queue_worker.redis.server_claim) drain a queue exactly once without folding the claims stream,
and `qw report` re-folds it and agrees with the server, partition by partition on a
partitioned queue. (Kill -9 of workers and of the server under them: test_redis_chaos.py,
run with both kinds of verdicts.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import msgpack
import pytest
import redis

from logstore.redis.log import RedisLog
from queue_worker.partition_layout import partition_location
from queue_worker.producer import Queue
from queue_worker.redis.server_verdicts import state_key
from queue_worker.worker.stats import read_all
from tests.test_redis_e2e import ENV, finish, queue_url, qw, qw_command

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("verdicts", ["client", "server"])
def test_a_drain_with_server_verdicts_folds_no_claims_record_in_any_worker(
    redis_url: str, tmp_path: Path, verdicts: str
) -> None:
    url = f"{queue_url(redis_url)}&verdicts={verdicts}"
    tasks = 60
    with Queue(url) as producer:
        producer.enqueue_many([{"n": n, "work_ms": 5} for n in range(tasks)])
    data = tmp_path / "d"
    # fmt: off
    up = subprocess.Popen(
        qw_command(
            "up", "--log", url, "--dir", str(data), "--workers", "3", "--lease", "5",
            "--exit-when-drained", "--no-tui",
        ),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=ENV,
    )
    # fmt: on
    [output] = finish([up], 120, [data])
    assert up.returncode == 0, output
    assert f"qw: drained (published {tasks}, done {tasks}" in output
    snaps = read_all(data / "run")
    assert sum(s["finished"] for s in snaps) == tasks
    folded = [int(s["consumed_up_to"]) for s in snaps]
    if verdicts == "server":
        assert folded == [0] * len(snaps)  # the server settled every claim: nobody read them
    else:
        assert all(f > 0 for f in folded)  # each worker read the claims stream to settle
    report = qw("report", "--log", url, cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"OK: every finished task was completed exactly once ({tasks} done)" in report.stdout
    assert "BUG" not in report.stderr


def test_a_partitioned_queue_with_server_verdicts_is_checked_partition_by_partition(
    redis_url: str, tmp_path: Path
) -> None:
    url = f"{queue_url(redis_url)}&verdicts=server"
    # fmt: off
    up = qw(
        "up", "--log", url, "--dir", str(tmp_path / "d"), "--partitions", "2", "--workers", "2",
        "--tasks", "30", "--work-ms", "2", "--exit-when-drained", "--no-tui", cwd=tmp_path,
    )
    # fmt: on
    assert up.returncode == 0, up.stdout + up.stderr
    ok = qw("report", "--log", url, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    claims = RedisLog(partition_location(url, 1, 2), "claims")
    key = state_key(claims)
    claims.close()
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.hlen(key) > 1  # partition 1's workers claimed through the server
        client.hset(key, "0", msgpack.packb({"s": "x", "l": "forged"}))
    finally:
        client.close()
    bad = qw("report", "--log", url, cwd=tmp_path)
    assert bad.returncode == 3, bad.stdout + bad.stderr
    assert "qw: BUG: partition 1: task 0: the server's verdicts say dead ('forged');" in bad.stderr


def test_a_bad_verdicts_parameter_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for command in ("report", "up"):
        result = qw(command, "--log", "redis://127.0.0.1:1/0?verdicts=maybe", cwd=tmp_path)
        assert result.returncode == 2
        assert result.stderr == (
            "qw: error: --log: verdicts='maybe' in redis://127.0.0.1:1/0?verdicts=maybe: "
            "expected client or server\n"
        )
