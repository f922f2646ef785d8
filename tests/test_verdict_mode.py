"""A Redis queue's verdict mode (logstore.redis.verdict_mode): recorded when the queue is created
(``server`` unless the URL says ``verdicts=client``), followed by every writer that opens
the queue without ``verdicts=``, and a URL that contradicts it is refused before anything
is appended. Queues created before the mode was recorded are read from their state."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import redis

from logstore.redis.log import RedisLog
from logstore.redis.verdict_mode import VerdictModeError, mode_key
from queue_worker.partition_layout import partition_location
from queue_worker.producer import Queue
from queue_worker.redis.server_verdicts import THROUGH, state_key
from queue_worker.topics import CLAIMS_TOPIC, TASKS_TOPIC, TOPICS
from queue_worker.worker.stats import read_all
from tests.test_redis_e2e import queue_url, qw

pytestmark = pytest.mark.redis


@contextlib.contextmanager
def _open(url: str, topic: str = CLAIMS_TOPIC, *, read_only: bool = False) -> Iterator[RedisLog]:
    log = RedisLog.open(url, topic, family=TOPICS, read_only=read_only)
    try:
        yield log
    finally:
        log.close()


def _recorded(url: str) -> tuple[bytes | None, bytes | None, int, int]:
    """(the recorded mode, the server's state's ~through, tasks, claims) of the queue."""
    with _open(url, read_only=True) as claims, _open(url, TASKS_TOPIC, read_only=True) as tasks:
        client = redis.Redis.from_url(url.partition("?")[0])
        try:
            mode = client.get(mode_key(claims))
            through = client.hget(state_key(claims), THROUGH)
            assert isinstance(mode, bytes | None) and isinstance(through, bytes | None)
            return mode, through, client.xlen(tasks.key), client.xlen(claims.key)
        finally:
            client.close()


def _drain(url: str, data: Path, tasks: int) -> str:
    # fmt: off
    up = qw(
        "up", "--log", url, "--dir", str(data), "--workers", "2", "--tasks", str(tasks),
        "--work-ms", "2", "--lease", "5", "--exit-when-drained", "--no-tui", cwd=data.parent,
    )
    # fmt: on
    assert up.returncode == 0, up.stdout + up.stderr
    return up.stdout


def test_a_new_queue_gets_server_verdicts_recorded_and_used_by_qw_up(
    redis_url: str, tmp_path: Path
) -> None:
    url = queue_url(redis_url)  # no verdicts=
    _drain(url, tmp_path / "d", 30)
    mode, through, _, claims = _recorded(url)
    assert mode == b"server"
    assert through is not None and claims > 0  # the script folded the claims
    snaps = read_all(tmp_path / "d" / "run")
    assert snaps and all(int(s["consumed_up_to"]) == 0 for s in snaps)  # no worker folded
    report = qw("report", "--log", url, cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "OK: every finished task was completed exactly once (30 done)" in report.stdout
    # the report cross-checks the server's state of a queue that never named its mode
    with _open(url, read_only=True) as log:
        key = state_key(log)
    client = redis.Redis.from_url(redis_url)
    try:
        client.hset(key, "0", msgpack.packb({"s": "x", "l": "forged"}))
    finally:
        client.close()
    bad = qw("report", "--log", url, cwd=tmp_path)
    assert bad.returncode == 3, bad.stdout + bad.stderr
    assert "qw: BUG: task 0: the server's verdicts say dead ('forged');" in bad.stderr


def test_an_explicit_client_queue_stays_client_when_the_url_says_nothing(
    redis_url: str, tmp_path: Path
) -> None:
    url = queue_url(redis_url)
    _drain(url + "&verdicts=client", tmp_path / "a", 20)
    assert _recorded(url)[:2] == (b"client", None)
    _drain(url, tmp_path / "b", 20)  # the queue's mode, without the parameter
    mode, through, tasks, _ = _recorded(url)
    assert (mode, through, tasks) == (b"client", None, 40)  # no verdict state was ever made
    snaps = read_all(tmp_path / "b" / "run")
    assert snaps and all(int(s["consumed_up_to"]) > 0 for s in snaps)  # each folded claims
    report = qw("report", "--log", url, cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr


@pytest.mark.parametrize(("created", "asked"), [("client", "server"), ("server", "client")])
def test_a_url_that_contradicts_the_recorded_mode_is_refused_and_appends_nothing(
    redis_url: str, tmp_path: Path, created: str, asked: str
) -> None:
    url = queue_url(redis_url)
    with Queue(f"{url}&verdicts={created}") as producer:
        producer.enqueue_many([{"n": n} for n in range(3)])
    before = _recorded(url)
    assert before == (created.encode(), None, 3, 0)
    with _open(url, read_only=True) as log:
        key = mode_key(log)
    bad = f"{url}&verdicts={asked}"
    expected = (
        f"qw: error: {bad}: the URL asks for verdicts={asked} but the queue was created "
        f"with verdicts={created} ({key}): every writer of a queue must use its mode "
        "(leave verdicts= out to follow the queue)\n"
    )
    enqueue = qw("enqueue", "--log", bad, "--count", "2", cwd=tmp_path)
    assert (enqueue.returncode, enqueue.stderr) == (2, expected), enqueue.stdout
    # fmt: off
    up = qw(
        "up", "--log", bad, "--dir", str(tmp_path / "d"), "--workers", "1",
        "--exit-when-drained", "--no-tui", cwd=tmp_path,
    )
    # fmt: on
    assert (up.returncode, up.stderr) == (2, expected), up.stdout
    assert _recorded(url) == before  # nothing appended, the record unchanged
    with pytest.raises(VerdictModeError), _open(bad, TASKS_TOPIC):
        pass


def _legacy(url: str) -> None:
    """Make the queue at `url` one created before the mode was recorded."""
    with _open(url, read_only=True) as log:
        key = mode_key(log)
    client = redis.Redis.from_url(url.partition("?")[0])
    try:
        assert client.delete(key) == 1
    finally:
        client.close()


def test_a_legacy_queue_with_the_server_state_reads_as_server(
    redis_url: str, tmp_path: Path
) -> None:
    url = queue_url(redis_url)
    _drain(url + "&verdicts=server", tmp_path / "a", 10)
    _legacy(url)
    with _open(url) as log:
        assert log.verdicts == "server"
    refused = pytest.raises(VerdictModeError, match="reads as verdicts=server")
    with refused, _open(url + "&verdicts=client"):
        pass
    _drain(url, tmp_path / "b", 10)  # followed without the parameter: the script folds all
    mode, through, tasks, _ = _recorded(url)
    assert (mode, tasks) == (None, 20)  # read, never written
    assert through is not None
    report = qw("report", "--log", url, cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "BUG" not in report.stderr


def test_a_legacy_queue_without_the_server_state_reads_as_client(
    redis_url: str, tmp_path: Path
) -> None:
    url = queue_url(redis_url)
    _drain(url + "&verdicts=client", tmp_path / "a", 10)
    _legacy(url)
    with _open(url) as log:
        assert log.verdicts == "client"
    refused = pytest.raises(VerdictModeError, match="reads as verdicts=client")
    with refused, _open(url + "&verdicts=server"):
        pass
    _drain(url, tmp_path / "b", 10)
    assert _recorded(url)[:3] == (None, None, 20)
    report = qw("report", "--log", url, cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr


Outcome = tuple[str, bytes | None, str]


def _race(url: str, asks: list[str]) -> list[Outcome]:
    """Open the queue at `url` from one thread per ask, all at once: (asked, the identity
    seen or None, the mode followed or "refused") for each."""
    barrier = threading.Barrier(len(asks))
    outcomes: list[Outcome] = []

    def create(asked: str) -> None:
        barrier.wait()
        try:
            with _open(url + (f"&verdicts={asked}" if asked else "")) as log:
                assert log.identity is not None
                outcomes.append((asked, log.identity.queue, log.verdicts))
        except VerdictModeError:
            outcomes.append((asked, None, "refused"))

    threads = [threading.Thread(target=create, args=(asked,)) for asked in asks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_two_creators_racing_agree_on_one_identity_and_one_mode(redis_url: str) -> None:
    asks = ["client", "server", "", "client", "server", ""]
    for _ in range(10):
        url = queue_url(redis_url)
        outcomes = _race(url, asks)
        assert len(outcomes) == len(asks)
        recorded = _recorded(url)[0]
        assert recorded in (b"client", b"server")
        mode = recorded.decode() if recorded else ""
        assert len({queue for _, queue, _ in outcomes if queue is not None}) == 1
        for asked, queue, got in outcomes:
            if asked in ("", mode):
                assert got == mode  # followed the one recorded mode
            else:
                assert (queue, got) == (None, "refused")


@pytest.mark.parametrize(("suffix", "mode"), [("", b"server"), ("&verdicts=client", b"client")])
def test_each_partition_of_a_new_partitioned_queue_records_the_mode_and_follows_it(
    redis_url: str, tmp_path: Path, suffix: str, mode: bytes
) -> None:
    url = queue_url(redis_url)
    # fmt: off
    up = qw(
        "up", "--log", url + suffix, "--dir", str(tmp_path / "d"), "--partitions", "2",
        "--rebalance", "--workers", "2", "--tasks", "20", "--work-ms", "2",
        "--exit-when-drained", "--no-tui", cwd=tmp_path,
    )
    # fmt: on
    assert up.returncode == 0, up.stdout + up.stderr
    for k in range(2):
        recorded, through, _, claims = _recorded(partition_location(url, k, 2))
        assert recorded == mode and claims > 0
        assert (through is not None) == (mode == b"server")  # the script folded its claims
    report = qw("report", "--log", url, cwd=tmp_path)  # (each partition cross-checked)
    assert report.returncode == 0, report.stdout + report.stderr
    other = "client" if mode == b"server" else "server"
    refused = qw("enqueue", "--log", f"{url}&verdicts={other}", "--count", "1", cwd=tmp_path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"the URL asks for verdicts={other} but the queue was created" in refused.stderr
