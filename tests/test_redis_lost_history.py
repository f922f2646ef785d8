"""A Redis queue that lost part of itself is refused, never folded as if whole (issue 30,
rows 5 and 16): a stream trimmed by hand (``XTRIM``) under its kept identity, and a server
flushed (``FLUSHALL``) under a running ``qw up``, with both kinds of verdicts. Real
``qw`` processes on a real redis-server."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from logstore import IdentityError
from logstore.redis.log import RedisLog
from queue_worker.producer import Queue
from queue_worker.protocol.records import Claim, encode
from queue_worker.redis.server_claim import ServerClaims
from queue_worker.topics import open_topics
from tests.helpers import wait_until

QW = [sys.executable, "-m", "supervisor.cli.app"]
MODES = ["server", "client"]


def client_of(url: str):  # type: ignore[no-untyped-def]
    import redis

    return redis.Redis.from_url(url.split("?")[0])


@pytest.fixture(params=MODES)
def queue(request: pytest.FixtureRequest, redis_url: str) -> Iterator[str]:
    """A new queue's URL, with server or client verdicts."""
    yield f"{redis_url}?verdicts={request.param}"


def qw(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QW, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def drain(url: str, tmp_path: Path, tasks: int) -> None:
    done = qw(
        "up", "--log", url, "--dir", str(tmp_path / "qw"), "--no-tui", "--workers", "2",
        "--work-ms", "0", "--tasks", str(tasks), "--exit-when-drained", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def state(url: str) -> dict[str, object]:
    """Every key of the database with what it holds (a stream: its entries): to show that
    a refusal wrote nothing."""
    client = client_of(url)
    try:
        seen: dict[str, object] = {}
        for key in sorted(client.keys("*")):
            kind = client.type(key)
            if kind == b"stream":
                seen[key.decode()] = client.xrange(key)
            elif kind == b"string":
                seen[key.decode()] = client.get(key)
            else:
                seen[key.decode()] = client.dump(key)
        return seen
    finally:
        client.close()


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# -- row 5: a stream trimmed by hand ----------------------------------------------------------


def test_report_refuses_a_claims_stream_trimmed_by_hand(queue: str, tmp_path: Path) -> None:
    drain(queue, tmp_path, 60)
    client = client_of(queue)
    added = client.xlen("qw:claims")  # (a CLAIM and a DONE a task, and the CLAIMs lost)
    assert client.xtrim("qw:claims", maxlen=10, approximate=False) == added - 10
    before = state(queue)
    report = qw("report", "--log", queue, cwd=tmp_path)
    assert report.returncode == 3, report.stdout + report.stderr
    line = one_line(report.stderr)
    assert line.startswith("qw: error: ") and "qw:claims" in line, line
    assert f"the stream holds 10 of the {added} entries ever added" in line, line
    assert f"{added - 10} entries are gone that qw did not remove" in line, line
    assert state(queue) == before


def test_report_refuses_a_tasks_stream_trimmed_mid_id(queue: str, tmp_path: Path) -> None:
    drain(queue, tmp_path, 40)
    client = client_of(queue)
    middle = client.xrange("qw:tasks")[20][0]
    assert client.xtrim("qw:tasks", minid=middle, approximate=False) == 20
    report = qw("report", "--log", queue, "--json", cwd=tmp_path)
    assert report.returncode == 3, report.stdout + report.stderr
    assert "qw:tasks" in one_line(report.stderr)


def test_up_refuses_a_trimmed_stream_before_any_worker_appends(queue: str, tmp_path: Path) -> None:
    drain(queue, tmp_path, 30)
    client_of(queue).xtrim("qw:claims", maxlen=5, approximate=False)
    with Queue(queue) as producer:
        producer.enqueue_many([{"n": n} for n in range(5)])
    before = state(queue)
    up = qw(
        "up", "--log", queue, "--dir", str(tmp_path / "qw"), "--no-tui", "--workers", "2",
        "--work-ms", "0", "--exit-when-drained", cwd=tmp_path,
    )  # fmt: skip
    assert up.returncode == 2, up.stderr
    assert "entries are gone that qw did not remove" in one_line(up.stderr)
    assert state(queue) == before


def start_up(queue: str, tmp_path: Path, *, work_ms: int, tasks: int) -> subprocess.Popen[str]:
    """`qw up` with two workers on `queue`, `tasks` tasks of `work_ms` each, until drained."""
    return subprocess.Popen(
        [*QW, "up", "--log", queue, "--dir", str(tmp_path / "qw"), "--no-tui", "--workers",
         "2", "--work-ms", str(work_ms), "--tasks", str(tasks), "--exit-when-drained"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_up_stops_on_a_stream_trimmed_mid_run(queue: str, tmp_path: Path) -> None:
    """`XTRIM … MINID` of the tasks stream under running workers: the tasks gone never run,
    and `qw up` stopped waiting for them, ending on the trimmed stream with exit 3."""
    up = start_up(queue, tmp_path, work_ms=20, tasks=300)
    try:
        client = client_of(queue)
        wait_until(lambda: client.xlen("qw:claims") >= 20, 60, "the first tasks done")
        middle = client.xrange("qw:tasks", count=200)[-1][0]
        assert client.xtrim("qw:tasks", minid=middle, approximate=False) == 199
        _, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == 3, err
    line = one_line(err)
    assert line.startswith("qw: error: stopped on a log: "), line
    assert "qw:tasks" in line and "entries are gone that qw did not remove" in line, line


def test_the_report_says_what_it_verified(queue: str, tmp_path: Path) -> None:
    """Compaction's trims are counted where it makes them: the report of a compacted queue
    still verifies every stream, and says so; a trim by hand after it is refused."""
    drain(queue, tmp_path, 20)
    compacted = qw("compact", "--log", queue, "--retention", "0", cwd=tmp_path)
    assert compacted.returncode == 0, compacted.stderr
    client = client_of(queue)
    assert client.xlen("qw:claims") < 40  # (trimmed by qw)
    report = qw("report", "--log", queue, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    claims_added = client.xinfo_stream("qw:claims")["entries-added"]
    claims_held = client.xlen("qw:claims")
    assert (
        f"qw:claims: {claims_held} entries held of {claims_added} added, "
        f"{claims_added - claims_held} removed by qw"
    ) in " ".join(report.stdout.split())
    assert "history verified: qw:tasks: " in report.stdout
    with Queue(queue) as producer:
        producer.enqueue_many([{"n": n} for n in range(3)])
    client.xtrim("qw:tasks", maxlen=1, approximate=False)
    refused = qw("report", "--log", queue, cwd=tmp_path)
    assert refused.returncode == 3
    assert "qw:tasks" in one_line(refused.stderr)
    before = state(queue)
    not_compacted = qw("compact", "--log", queue, "--retention", "0", cwd=tmp_path)
    assert not_compacted.returncode != 0
    assert "entries are gone that qw did not remove" in one_line(not_compacted.stderr)
    assert state(queue) == before


def test_a_stream_an_older_qw_trimmed_is_counted_from_its_next_trim(
    redis_url: str, tmp_path: Path
) -> None:
    """A start key without a count (trimmed by a qw that kept none) cannot be verified, and
    says so; the next compaction takes what is gone as that qw's trims and counts on."""
    drain(redis_url, tmp_path, 20)
    qw("compact", "--log", redis_url, "--retention", "0", cwd=tmp_path)
    client = client_of(redis_url)
    client.delete("qw:claims:removed", "qw:tasks:removed")
    with RedisLog.open(redis_url, "claims") as log:
        assert log.verify_history() == (
            "qw:claims: not verified (trimmed by a qw that kept no count of it)"
        )
    drain(redis_url, tmp_path, 20)
    assert qw("compact", "--log", redis_url, "--retention", "0", cwd=tmp_path).returncode == 0
    with RedisLog.open(redis_url, "claims") as log:
        assert "removed by qw" in str(log.verify_history())


# -- row 16: FLUSHALL under a running queue ---------------------------------------------------


def test_flushall_mid_run_stops_every_worker_before_it_appends(queue: str, tmp_path: Path) -> None:
    up = start_up(queue, tmp_path, work_ms=100, tasks=200)
    try:
        client = client_of(queue)
        wait_until(lambda: client.xlen("qw:claims") >= 6, 60, "the first tasks done")
        client.flushall()
        out, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == 3, err
    line = one_line(err)
    assert line.startswith("qw: error: stopped on a log: "), line
    assert "the queue identity qw:queue is missing: the server was reset" in line, line
    # nothing of the queue was written to the flushed server: no record, no retry record
    assert client.keys("qw:*") == [], state(queue)  # not even a queue made anew
    assert out.count("death: ") <= 2, out  # each worker once: none was restarted


def test_an_append_checks_the_identity_in_the_same_call(redis_url: str) -> None:
    """The identity is checked by the append's own script: a key removed, or changed,
    after the handle's last look refuses the append and nothing is written."""
    with Queue(redis_url) as producer:
        producer.enqueue({"n": 1})
    tasks, claims = open_topics(redis_url)
    with tasks, claims:
        assert isinstance(tasks, RedisLog) and isinstance(claims, RedisLog)
        server = ServerClaims(claims, tasks)
        client = client_of(redis_url)
        client.set("qw:queue", b"x" * 16)
        with pytest.raises(IdentityError, match="identity qw:queue has changed"):
            tasks.append(b"a task")
        client.delete("qw:queue")
        with pytest.raises(IdentityError, match="identity qw:queue is missing"):
            server.next("w0-1-ab", 5_000_000, 0)
        with pytest.raises(IdentityError, match="identity qw:queue is missing"):
            server.verdict_log.append(encode(Claim(0, "w0-1-ab", 0, 5_000_000)))
        with pytest.raises(IdentityError, match="identity qw:queue is missing"):
            tasks.read(0)
        assert client.xlen("qw:tasks") == 1 and not client.exists("qw:claims")
        assert not client.keys("qw:*:w:*")  # no append's retry record either
