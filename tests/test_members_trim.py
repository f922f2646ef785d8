"""The members topic stays small: what no longer decides who is alive is removed, on the
file log (whole segments) and on Redis (XTRIM), and every reader — one that starts after
a trim, and one that had read part of what was removed — still sees the members the whole
history says are alive."""

from __future__ import annotations

import os
import random
import secrets
import subprocess
from pathlib import Path

import pytest

from logstore import Entry, MemoryLog
from queue_worker.partitions.member import member_command
from queue_worker.partitions.members_trim import keep_from, read_all, trim_members
from queue_worker.partitions.membership import (
    MEMBERS_TOPIC,
    MemberView,
    encode_heartbeat,
    encode_leave,
    members_location,
    open_members,
)
from queue_worker.partitions.queue import resolve_partitions
from queue_worker.worker.config import WorkerConfig
from tests.helpers import wait_until
from tests.test_redis_cluster import Cluster
from tests.test_redis_cluster import cluster as cluster_fixture  # noqa: F401 - the fixture

S = 1_000_000  # µs
LEASE = 3 * S
SEGMENT = 2048


def _entries(*records: bytes) -> list[Entry]:
    log = MemoryLog(MEMBERS_TOPIC)
    for data in records:
        log.append(data)
    return log.read(log.start)


def test_keep_from_keeps_the_live_heartbeats_the_clock_and_the_leaves_that_count() -> None:
    entries = _entries(
        encode_heartbeat("a", 0, LEASE),  # 0: superseded by a's later heartbeat
        encode_heartbeat("b", 1 * S, LEASE),  # 1: b's last, lapsed at 4 s
        encode_heartbeat("c", 2 * S, LEASE),  # 2: c's last before its LEAVE, not lapsed
        encode_heartbeat("a", 3 * S, LEASE),  # 3: a's last: alive
        encode_leave("c", 4 * S),  # 4: needed, or c's heartbeat would make it alive
        encode_heartbeat("d", 5 * S, LEASE),  # 5: d alive; the clock
    )
    assert keep_from(entries) == entries[3].position
    # once c's heartbeat has lapsed, its LEAVE says nothing more
    later = _entries(*[e.data for e in entries], encode_heartbeat("a", 6 * S, LEASE))
    assert keep_from(later) == later[5].position
    assert keep_from([]) is None


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def test_the_members_topic_stays_bounded_across_many_rebalances(tmp_path: Path) -> None:
    """1,500 rounds of simulated time: members join, beat, leave or die (-9: they just stop),
    and a member trims after each round. The topic's files stay within a few segments
    while twenty times that is written, and the views agree with the whole history's."""
    location = str(tmp_path / "qw")
    writer = open_members(location, segment_bytes=SEGMENT)
    trimmer = open_members(location)
    follower_log = open_members(location)
    follower = MemberView()  # reads along between trims: some of what it read goes
    whole = MemberView()  # the fold of every record ever written (the reference)
    everything = MemoryLog("all")
    rng = random.Random(7)
    alive: set[str] = set()
    written = biggest = trimmed = changes = 0
    last_alive: list[str] = []
    now = 0
    for round_ in range(1500):
        now += S  # one second a round: each live member beats (lease 3 s: 3 a lease)
        if rng.random() < 0.5 or not alive:
            alive.add(f"m{round_}")
        if len(alive) > 1 and rng.random() < 0.25:
            alive.discard(rng.choice(sorted(alive)))  # killed -9: no more heartbeats
        records = [encode_heartbeat(m, now, LEASE) for m in sorted(alive)]
        if len(alive) > 4:
            gone = rng.choice(sorted(alive))
            alive.discard(gone)
            records.append(encode_leave(gone, now))
        for data in records:
            writer.append(data)
            for entry in everything.read(everything.append(data)):
                whole.apply(entry)
            written += len(data)
        trimmed += trim_members(trimmer)
        follower.catch_up(follower_log)
        fresh = MemberView()
        fresh.catch_up(trimmer)
        assert follower.alive() == whole.alive() == fresh.alive(), round_
        assert follower.now == whole.now == fresh.now
        changes += whole.alive() != last_alive
        last_alive = whole.alive()
        biggest = max(biggest, _dir_bytes(Path(members_location(location))))
    for log in (writer, trimmer, follower_log):
        log.close()
    assert changes > 500  # the assignment changed this often: many rebalances
    assert trimmed > 0
    # the kept part: the last lease of records (< one segment here) and the segment being
    # written, rounded to segments, plus the files' headers
    assert biggest <= 4 * SEGMENT, biggest
    assert written > 20 * biggest, (written, biggest)


def _trim_on_redis(redis_url: str) -> None:
    """Members that left are dropped once their heartbeats have lapsed by the server's
    clock, and what stays is each live member's last beat."""
    writer = open_members(redis_url)
    reader_log = open_members(redis_url)
    reader = MemberView()
    short = 50_000  # µs: the departed members' leases lapse within the test
    for i in range(60):
        writer.append(encode_heartbeat(f"gone{i}", 0, short))
        writer.append(encode_leave(f"gone{i}", 0))
        reader.catch_up(reader_log)  # it has read some of what will go
    live = [f"live{i}" for i in range(3)]

    def lapsed() -> bool:
        """The live members beat; has the server's clock passed every departed lease?"""
        writer.append_many([encode_heartbeat(name, 0, 600 * S) for name in live])
        entries = read_all(writer)
        return (entries[-1].server_time_us or 0) > (entries[119].server_time_us or 0) + short

    wait_until(lapsed, 10, "the departed members' leases to lapse by the server's clock")
    before = len(read_all(writer))
    assert trim_members(writer) == before - 3  # each live member's last beat stays
    kept = read_all(writer)
    assert len(kept) == 3
    reader.catch_up(reader_log)
    fresh = MemberView()
    fresh.catch_up(writer)
    assert reader.alive() == fresh.alive() == live
    writer.close()
    reader_log.close()


def test_on_redis_the_stream_is_trimmed_to_the_live_members(redis_url: str) -> None:
    _trim_on_redis(redis_url)


def test_on_a_redis_cluster_the_stream_is_trimmed_too(request: pytest.FixtureRequest) -> None:
    """(The members stream's keys share one hash tag: XTRIM goes to its node.)"""
    cluster: Cluster = request.getfixturevalue("cluster_fixture")  # tests.test_redis_cluster's
    _trim_on_redis(f"{cluster.url}&prefix=t{secrets.token_hex(3)}")


# make test trims the members topic in test_the_members_topic_stays_bounded_across_many_rebalances
@pytest.mark.slow
def test_a_member_process_trims_the_topic_as_it_beats(tmp_path: Path) -> None:
    """A real member (lease 0.6 s: a heartbeat every 0.2 s, a trim every 30): the topic's
    first segments are removed while it runs, and its view keeps it alive."""
    data = tmp_path / "qw"
    manifest = resolve_partitions(str(data), 2)
    assert manifest is not None
    open_members(str(data), segment_bytes=512).close()  # small segments, kept by the topic
    config = WorkerConfig(
        str(data),
        str(data / "run"),
        name="m0",
        handler="queue_worker.worker.handlers:demo",
        work_ms=1,
        lease_s=0.6,
        fsync="none",
        parent_pid=os.getpid(),
    )
    proc = subprocess.Popen(member_command(config), stdout=subprocess.DEVNULL)
    try:
        log = open_members(str(data))
        origin = log.origin

        def trimmed() -> bool:
            return log.start > origin

        wait_until(trimmed, 60, "the member to remove the topic's first segment")
        log.close()
        log = open_members(str(data))  # (this handle's reading would predate the trim)
        view = MemberView()
        view.catch_up(log)
        assert [m.split("@")[0] for m in view.alive()] == ["m0"]
        log.close()
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_a_topic_created_by_members_is_written_in_small_segments(tmp_path: Path) -> None:
    location = str(tmp_path / "qw")
    log = open_members(location)
    for i in range(5000):
        log.append(encode_heartbeat(f"m{i % 4}", i * S, LEASE))
    files = sorted(p.name for p in Path(members_location(location)).iterdir())
    assert sum(name.endswith(".seg") for name in files) > 1, files
    assert trim_members(log) > 4000
    assert len(read_all(log)) < 2000
    log.close()
