"""One contract, every backend: what the protocol may rely on from a `Log`.

Each test runs against the in-memory log, the file log and the Redis log. The Redis case is
skipped only when no redis-server is installed, and never in CI (QW_REQUIRE_REDIS=1 makes
its absence a failure: see the `redis_url` fixture).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from logstore import open_log
from logstore.base import Entry, Log, LogClosedError, LogError, RecordTooLargeError
from logstore.file.framing import MAX_RECORD
from logstore.file.log import FileLog
from logstore.memory import MemoryLog

#: the record limit the memory and file backends are opened with (small: cheap to exceed)
SMALL_MAX = 64 * 1024


@dataclass
class Backend:
    log: Log
    #: another handle on the same log (for the memory log: the same object, shared)
    another: Callable[[], Log]
    max_record: int
    handles: list[Log] = field(default_factory=list)


@pytest.fixture(params=["memory", "file", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    handles: list[Log] = []
    if request.param == "memory":
        shared = MemoryLog("contract", max_record=SMALL_MAX)
        handles.append(shared)

        def another() -> Log:
            return shared

    elif request.param == "file":
        path = tmp_path / "contract.log"

        def another() -> Log:
            handle = FileLog.open(path, max_record=SMALL_MAX)
            handles.append(handle)
            return handle

    else:
        url = request.getfixturevalue("redis_url")  # skips when redis-server is missing

        def another() -> Log:
            handle = open_log(url, "contract")
            handles.append(handle)
            return handle

    log = another()
    limit = getattr(log, "max_record", MAX_RECORD)
    yield Backend(log, another, int(limit), handles)
    for handle in handles:
        handle.close()


def datas(entries: list[Entry]) -> list[bytes]:
    return [e.data for e in entries]


def test_an_empty_log(backend: Backend) -> None:
    log = backend.log
    assert log.read(log.start) == []
    assert log.end() == log.start
    assert list(log.iter_from(log.start)) == []


def test_append_then_read_round_trip(backend: Backend) -> None:
    log = backend.log
    records = [b"first", b"", b"\x00\xff binary \x00", b"x" * 1000]
    positions = [log.append(r) for r in records]
    entries = log.read(log.start)
    assert datas(entries) == records
    assert [e.position for e in entries] == positions
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert positions[0] >= log.start


def test_entry_next_chains_to_the_following_record_and_ends_at_end(backend: Backend) -> None:
    log = backend.log
    for i in range(5):
        log.append(b"r%d" % i)
    entries = log.read(log.start)
    for before, after in itertools.pairwise(entries):
        # positions are opaque: `next` need not equal the following position, but reading
        # from it must give the following record
        assert before.position < before.next <= after.position
        assert log.read(before.next, max_records=1) == [after]
    assert log.end() == entries[-1].next
    assert log.read(entries[-1].next) == []
    assert log.read(log.end()) == []


def test_read_from_a_middle_position(backend: Backend) -> None:
    log = backend.log
    positions = [log.append(b"m%d" % i) for i in range(6)]
    assert datas(log.read(positions[3])) == [b"m3", b"m4", b"m5"]
    middle = log.read(log.start)[2]
    assert datas(log.read(middle.next)) == [b"m3", b"m4", b"m5"]


def test_max_records_pages_through_the_log(backend: Backend) -> None:
    log = backend.log
    for i in range(7):
        log.append(b"p%d" % i)
    pages = []
    position = log.start
    while page := log.read(position, max_records=3):
        assert len(page) <= 3
        pages.append(datas(page))
        position = page[-1].next
    assert pages == [[b"p0", b"p1", b"p2"], [b"p3", b"p4", b"p5"], [b"p6"]]
    assert [e.data for e in log.iter_from(log.start, batch=2)] == [b"p%d" % i for i in range(7)]


def test_append_many_is_contiguous_even_with_a_concurrent_writer(backend: Backend) -> None:
    log = backend.log
    other = backend.another()
    stop = threading.Event()

    def interleave() -> None:
        while not stop.is_set():
            other.append(b"single")

    thread = threading.Thread(target=interleave)
    thread.start()
    try:
        batches = [[b"b%d-%d" % (n, i) for i in range(5)] for n in range(20)]
        returned = [log.append_many(batch) for batch in batches]
    finally:
        stop.set()
        thread.join()
    entries = log.read(log.start)
    by_position = {e.position: i for i, e in enumerate(entries)}
    for batch, positions in zip(batches, returned, strict=True):
        first = by_position[positions[0]]
        assert datas(entries[first : first + len(batch)]) == batch
        assert [e.position for e in entries[first : first + len(batch)]] == positions
    assert log.append_many([]) == []


def test_a_durable_append_is_an_append(backend: Backend) -> None:
    log = backend.log
    position = log.append(b"keep me", durable=True)
    positions = log.append_many([b"and", b"us"], durable=True)
    assert [e.position for e in log.read(log.start)] == [position, *positions]


def test_wait_returns_true_when_another_thread_appends(backend: Backend) -> None:
    log = backend.log
    writer = backend.another()
    log.append(b"before")
    position = log.end()
    about_to_wait = threading.Event()

    def append_soon() -> None:
        about_to_wait.wait()
        writer.append(b"wake up")

    thread = threading.Thread(target=append_soon)
    thread.start()
    timeout = 60.0
    started = time.monotonic()
    about_to_wait.set()
    woke = log.wait(position, timeout)
    waited = time.monotonic() - started
    thread.join()
    assert woke
    assert waited < timeout  # woken by the append, not by the deadline
    assert datas(log.read(position)) == [b"wake up"]


def test_wait_returns_false_after_the_timeout_with_nothing_new(backend: Backend) -> None:
    log = backend.log
    log.append(b"old news")
    assert log.wait(log.end(), 0.05) is False
    assert log.wait(log.start, 0.05) is True  # a record is already there


def test_end_is_where_the_next_append_lands(backend: Backend) -> None:
    log = backend.log
    log.append(b"one")
    end = log.end()
    position = log.append(b"two")
    assert position >= end
    assert datas(log.read(end)) == [b"two"]


def test_a_record_over_the_limit_is_refused_and_nothing_is_written(backend: Backend) -> None:
    log = backend.log
    log.append(b"fits")
    end = log.end()
    too_big = bytes(backend.max_record + 1)
    with pytest.raises(RecordTooLargeError) as caught:
        log.append(too_big)
    assert caught.value.size == len(too_big)
    with pytest.raises(RecordTooLargeError):
        log.append_many([b"small", too_big])
    assert log.end() == end
    assert log.read(end) == []
    assert datas(log.read(log.start)) == [b"fits"]
    log.append(bytes(backend.max_record))  # the limit itself is allowed


def test_a_closed_log_refuses_to_work(backend: Backend) -> None:
    log = backend.log
    log.append(b"x")
    log.close()
    log.close()  # idempotent
    with pytest.raises(LogClosedError):
        log.append(b"y")
    with pytest.raises(LogClosedError):
        log.append_many([b"y"])
    with pytest.raises(LogClosedError):
        log.read(log.start)


def test_two_handles_see_the_same_records_in_the_same_order(backend: Backend) -> None:
    first, second = backend.log, backend.another()

    def write(handle: Log, tag: bytes) -> None:
        for i in range(200):
            handle.append(tag + b"%d" % i)

    threads = [
        threading.Thread(target=write, args=(first, b"a")),
        threading.Thread(target=write, args=(second, b"b")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seen_first = [(e.position, e.data) for e in first.iter_from(first.start)]
    seen_second = [(e.position, e.data) for e in second.iter_from(second.start)]
    assert seen_first == seen_second
    assert len(seen_first) == 400
    for tag in (b"a", b"b"):
        own = [data for _, data in seen_first if data.startswith(tag)]
        assert own == [tag + b"%d" % i for i in range(200)]  # each writer's order is kept


# -- identity: the logs of one queue name it (file and Redis backends) ------------------------


@pytest.fixture(params=["file", "redis"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return str(tmp_path / "queue")
    return str(request.getfixturevalue("redis_url"))


FAMILY = ("tasks", "claims")


def test_the_logs_of_one_queue_share_its_identity_and_name_their_topic(location: str) -> None:
    with (
        open_log(location, "tasks", family=FAMILY) as tasks,
        open_log(location, "claims", family=FAMILY) as claims,
    ):
        tasks_id = getattr(tasks, "identity", None)
        claims_id = getattr(claims, "identity", None)
        assert tasks_id is not None and claims_id is not None
        assert (tasks_id.topic, claims_id.topic) == FAMILY
        assert tasks_id.queue == claims_id.queue
        tasks.append(b"t")
    with open_log(location, "tasks", family=FAMILY) as again:  # reopened: the same queue
        assert getattr(again, "identity", None) == tasks_id


def test_a_read_only_handle_reads_and_never_appends(location: str) -> None:
    with open_log(location, "tasks", family=FAMILY) as writer:
        writer.append(b"one")
    with open_log(location, "tasks", family=FAMILY, read_only=True) as reader:
        assert datas(reader.read(reader.start)) == [b"one"]
        with pytest.raises(LogError, match="read-only"):
            reader.append(b"two")
    with open_log(location, "tasks", family=FAMILY) as writer:
        assert datas(writer.read(writer.start)) == [b"one"]


def test_check_reads_to_the_end_and_checksum_follows_the_records(backend: Backend) -> None:
    log, other = backend.log, backend.another()
    assert log.check() == log.end() or not log.read(log.start)
    empty = log.checksum(log.start, log.end())
    log.append_many([b"a", b"bb"])
    end = log.end()
    assert log.check() >= end - 1
    full = log.checksum(log.start, end)
    assert full != empty
    assert other.checksum(other.start, end) == full  # another handle: the same value
    positions = [e.position for e in log.read(log.start)]
    # extending a checksum taken to a record boundary gives the same value
    assert log.checksum(positions[1], end, log.checksum(log.start, positions[1])) == full


def test_read_span_decodes_what_read_returns(backend: Backend) -> None:
    """`Log.read_span` with the claims decoder gives the records a decode of `read`'s entries
    gives, at the same positions, and pages as `read` does: the file log from its frames,
    every other backend through `SpanDecoder.entries`."""
    from queue_worker.protocol.records import Claim, Done, encode
    from queue_worker.topics import claims_decoder, claims_entries

    log = backend.log
    records = [encode(Claim(task, "w", 10 + task, 9)) for task in range(5)]
    log.append_many([*records, b"\xc1", encode(Done(0, "w", 20, 48, 7))])
    position, spans, items = log.start, [], []
    while found := log.read_span(position, 3, claims_decoder()):
        assert len(found) <= 3
        spans += found.positions
        items += found.items
        position = found.next
    entries = list(log.iter_from(log.start))
    assert spans == [e.position for e in entries]
    assert items == claims_entries(entries)
    assert items[5] is None and items[6] is not None  # the malformed one, then a DONE
