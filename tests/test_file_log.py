"""The file log across real processes: concurrency, kill -9, damage, disk limits, locks, fsync.

Child processes are forked (multiprocessing "fork"); each opens its own FileLog. They
report back through multiprocessing queues; nothing here sleeps to wait for an event.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import itertools
import multiprocessing
import os
import random
import resource
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.context import ForkProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any

import filelock
import pytest

from logstore import open_log
from logstore.base import (
    AppendError,
    CorruptLogError,
    Durability,
    ForeignFileError,
    LogClosedError,
)
from logstore.file import framing
from logstore.file.framing import FILE_HEADER_SIZE, FRAME_HEADER_SIZE, encode_batch, encode_frame
from logstore.file.log import FileLog, zeros_ahead
from logstore.file.reads import READ_CHUNK
from logstore.file.segments import FIRST_BASE, SEGMENT_HEADER_SIZE, segment_files
from logstore.file.waiting import InotifyWaiter, PollWaiter, make_waiter
from logstore.locking import FlockLock, maintenance_lock
from tests.helpers import wait_until

CTX = multiprocessing.get_context("fork")
CHILD_TIMEOUT = 120.0  # a deadline for children, far beyond what a healthy run needs


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "claims.log"


@pytest.fixture
def log(log_path: Path) -> Iterator[FileLog]:
    handle = FileLog.open(log_path)
    yield handle
    handle.close()


def start(target: Callable[..., None], *args: object) -> ForkProcess:
    process = CTX.Process(target=target, args=args, daemon=True)
    process.start()
    return process


def finish(*processes: ForkProcess) -> None:
    for process in processes:
        process.join(CHILD_TIMEOUT)
        assert process.exitcode == 0, f"child {process.pid} exited with {process.exitcode}"


def frame_size(data: bytes) -> int:
    return FRAME_HEADER_SIZE + len(data)


def all_data(handle: FileLog) -> list[bytes]:
    return [e.data for e in handle.iter_from(handle.start)]


# -- opening ---------------------------------------------------------------------------------


def test_a_new_log_has_its_header_and_keeps_its_record_limit(log_path: Path) -> None:
    with FileLog.open(log_path, max_record=100) as first:
        assert log_path.read_bytes()[:5] == b"QWLOG"
        assert log_path.stat().st_size == FILE_HEADER_SIZE == first.start
    with FileLog.open(log_path) as again:  # asks for the default 16 MiB: the file says 100
        assert isinstance(again, FileLog)
        assert again.max_record == 100


def test_open_log_puts_one_file_per_topic_in_the_directory(data_dir: Path) -> None:
    with open_log(data_dir, "tasks", Durability.NONE) as tasks:
        assert isinstance(tasks, FileLog)
        assert tasks.durability is Durability.NONE
        tasks.append(b"t")
    assert (data_dir / "tasks.log").exists()


@pytest.mark.parametrize(
    "content",
    [b"#!/bin/sh\necho this is not a log\n", b"QWLOG", b"QWLOG\x01" + bytes(10), b"\x00" * 64],
    ids=["text", "short", "bad-checksum", "zeros"],
)
def test_a_foreign_file_is_refused_and_left_untouched(log_path: Path, content: bytes) -> None:
    log_path.write_bytes(content)
    with pytest.raises(ForeignFileError, match=str(log_path)):
        FileLog.open(log_path)
    assert log_path.read_bytes() == content
    assert sorted(p.name for p in log_path.parent.iterdir()) == [log_path.name]


def test_a_position_before_the_first_record_is_refused(log: FileLog) -> None:
    with pytest.raises(ValueError, match="before the first record"):
        log.read(0)


def test_close_releases_every_descriptor(log_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    handle = FileLog.open(log_path)
    handle.append(b"x")
    assert handle.wait(handle.end(), 0.01) is False  # creates the inotify descriptor
    handle.close()
    assert len(os.listdir("/proc/self/fd")) == before
    with pytest.raises(LogClosedError):
        handle.wait(handle.start, 0)


# -- many writers, many readers --------------------------------------------------------------

WRITERS = 8
PER_WRITER = 10_000
READERS = 2


def _write_numbered(path: str, writer: int, count: int, barrier: Barrier) -> None:
    with FileLog.open(path, durability=Durability.NONE) as handle:  # creators race here too
        barrier.wait(CHILD_TIMEOUT)
        pad = b"." * 80
        for seq in range(count):
            handle.append(b"%d:%d:" % (writer, seq) + pad)


def _digest(entries: list[tuple[int, bytes]]) -> str:
    digest = hashlib.sha256()
    for position, data in entries:
        digest.update(struct.pack("<Q", position))
        digest.update(data)
    return digest.hexdigest()


def _read_all_numbered(path: str, total: int, barrier: Barrier, results: Queue[Any]) -> None:
    with FileLog.open(path) as handle:
        barrier.wait(CHILD_TIMEOUT)
        seen: list[tuple[int, bytes]] = []
        position = handle.start
        deadline = time.monotonic() + CHILD_TIMEOUT
        while len(seen) < total and time.monotonic() < deadline:
            entries = handle.read(position, 4096)
            if not entries:
                handle.wait(position, 1.0)
                continue
            seen += [(e.position, e.data) for e in entries]
            position = entries[-1].next
        results.put((len(seen), _digest(seen)))


def test_eight_processes_append_and_every_reader_sees_every_record_once_in_one_order(
    log_path: Path,
) -> None:
    path = str(log_path)
    total = WRITERS * PER_WRITER
    barrier = CTX.Barrier(WRITERS + READERS)
    results: Queue[Any] = CTX.Queue()
    readers = [start(_read_all_numbered, path, total, barrier, results) for _ in range(READERS)]
    writers = [start(_write_numbered, path, w, PER_WRITER, barrier) for w in range(WRITERS)]
    finish(*writers)
    reported = [results.get(timeout=CHILD_TIMEOUT) for _ in readers]
    finish(*readers)

    with FileLog.open(path) as handle:
        entries = [(e.position, e.data) for e in handle.iter_from(handle.start)]
        assert handle.end() == log_path.stat().st_size
    assert len(entries) == total
    next_seq = dict.fromkeys(range(WRITERS), 0)
    for _, data in entries:  # each writer's records exactly once, in its own order
        writer, seq, _ = data.split(b":", 2)
        assert int(seq) == next_seq[int(writer)]
        next_seq[int(writer)] += 1
    assert set(next_seq.values()) == {PER_WRITER}
    assert reported == [(total, _digest(entries))] * READERS


# -- kill -9 in the middle of appends --------------------------------------------------------

MAGIC = b"QWREC"


def _checked(body: bytes) -> bytes:
    """A record that proves itself whole: magic, sha256 of the body, body."""
    return MAGIC + hashlib.sha256(body).digest() + body


def _is_whole(record: bytes) -> bool:
    return record[:5] == MAGIC and hashlib.sha256(record[37:]).digest() == record[5:37]


#: the writers killed below start a new segment every few MiB: kills land in rolls too
_KILL_SEGMENT = 4 * 1024 * 1024


def _disk_end(log_path: Path) -> int:
    """Where the log's bytes end, by the files alone: the newest segment's base + its data."""
    base, path = segment_files(str(log_path))[-1]
    header = SEGMENT_HEADER_SIZE if base != FIRST_BASE else FILE_HEADER_SIZE
    return base + os.path.getsize(path) - header


def _append_big_records_forever(path: str, seed: int) -> None:
    rng = random.Random(seed)
    records = [_checked(rng.randbytes(rng.randint(256 * 1024, 1024 * 1024))) for _ in range(4)]
    handle = FileLog.open(path, durability=Durability.NONE, segment_bytes=_KILL_SEGMENT)
    for i in itertools.count():  # until SIGKILL
        if i % 5 == 4:
            handle.append_many(records[:2])  # a batch: all of it or none must show
        else:
            handle.append(records[i % 4])


def _read_checking_until_end(path: str, results: Queue[Any]) -> None:
    with FileLog.open(path) as handle:
        position = handle.start
        seen: list[tuple[int, bytes]] = []
        broken = 0
        deadline = time.monotonic() + CHILD_TIMEOUT
        while time.monotonic() < deadline:
            entries = handle.read(position, 8)
            if not entries:
                handle.wait(position, 1.0)
                continue
            for entry in entries:
                if entry.data == b"END":
                    results.put((len(seen), broken, _digest(seen)))
                    return
                broken += not _is_whole(entry.data)
                seen.append((entry.position, hashlib.sha256(entry.data).digest()))
            position = entries[-1].next
        results.put(("timed out", len(seen), broken))


@pytest.mark.chaos
def test_kill_9_writers_mid_append_never_shows_a_partial_record(log_path: Path) -> None:
    iterations = 200 if os.environ.get("QW_CHAOS") == "long" else 25
    path = str(log_path)
    rng = random.Random(1234)
    with FileLog.open(path, segment_bytes=_KILL_SEGMENT) as handle:
        results: Queue[Any] = CTX.Queue()
        readers = [start(_read_checking_until_end, path, results) for _ in range(2)]
        torn = 0
        # Past `iterations`, go on (to 8x) until a kill has landed mid-append: the check
        # below needs one, and on a loaded machine 25 kills have all landed between appends.
        for i in itertools.count():
            if i >= iterations * (1 if torn else 8):
                break
            target = _disk_end(log_path) + rng.randint(1, 3 * 1024 * 1024)
            writer = start(_append_big_records_forever, path, i)

            def grown(target: int = target, writer: ForkProcess = writer) -> bool:
                return _disk_end(log_path) >= target or not writer.is_alive()

            wait_until(grown, CHILD_TIMEOUT, "the writer to get going")
            assert writer.is_alive()
            os.kill(writer.pid or 0, signal.SIGKILL)
            writer.join(CHILD_TIMEOUT)
            torn += _disk_end(log_path) != handle.end()

        # The next appender cuts the torn tail off and lands right after the last whole record.
        end = handle.end()
        assert handle.append(b"END") == end
        assert _disk_end(log_path) == handle.end() == end + frame_size(b"END")
        assert len(segment_files(path)) > 2  # the writers started segments as they went
        reported = [results.get(timeout=CHILD_TIMEOUT) for _ in readers]
        finish(*readers)

        entries = list(handle.iter_from(handle.start))
        assert entries[-1].data == b"END"
        whole = [(e.position, hashlib.sha256(e.data).digest()) for e in entries[:-1]]
        assert all(_is_whole(e.data) for e in entries[:-1])
        assert reported == [(len(whole), 0, _digest(whole))] * 2
        assert handle.repair() == 0  # nothing left to cut
        # a kill lands mid-write nearly every time; the short run needs only one to cover it
        assert torn >= 1, "no kill landed in the middle of an append"


# -- torn tails, damage ----------------------------------------------------------------------


def _tear(path: Path, kind: str) -> None:
    """Leave at the end of `path` what a killed writer or a power cut leaves."""
    with path.open("ab") as f:
        if kind == "partial-frame":
            f.write(encode_frame(b"z" * 5000)[:3000])
        elif kind == "partial-header":
            f.write(encode_frame(b"z")[:7])
        elif kind == "bad-checksum":
            frame = bytearray(encode_frame(b"zzz"))
            frame[-1] ^= 1
            f.write(frame)
        elif kind == "zeros":
            f.write(bytes(4096))
        elif kind == "partial-batch":
            f.write(encode_batch([b"b1", b"b2", b"b3"])[:-1])


@pytest.mark.parametrize(
    "kind", ["partial-frame", "partial-header", "bad-checksum", "zeros", "partial-batch"]
)
def test_a_torn_tail_is_invisible_and_the_next_appender_cuts_it(
    log_path: Path, log: FileLog, kind: str
) -> None:
    first = log.append(b"A")
    _tear(log_path, kind)
    torn_size = log_path.stat().st_size
    with FileLog.open(log_path) as reader:
        assert all_data(reader) == [b"A"]
        assert reader.end() == first + frame_size(b"A")
        assert reader.wait(reader.end(), 0.01) is False  # a torn tail is not news
        with FileLog.open(log_path) as writer:
            second = writer.append(b"B")
        assert second == first + frame_size(b"A")
        if kind == "zeros":  # what zeros written ahead look like: B lands in them, none cut
            assert log_path.stat().st_size == torn_size
        else:
            size = log_path.stat().st_size
            assert size == second + frame_size(b"B") < torn_size + frame_size(b"B")
        assert reader.wait(second, 0) is True
        assert all_data(reader) == [b"A", b"B"]
    assert log.append(b"C") == second + frame_size(b"B")
    assert all_data(log) == [b"A", b"B", b"C"]


def test_repair_cuts_a_torn_tail_and_says_how_much(log_path: Path, log: FileLog) -> None:
    log.append(b"keep")
    size = log_path.stat().st_size
    _tear(log_path, "partial-frame")
    assert log.repair() == 3000
    assert log_path.stat().st_size == size
    assert log.repair() == 0


def test_damage_in_the_middle_names_the_file_and_the_offset(log_path: Path, log: FileLog) -> None:
    positions = [log.append(b"record %d" % i) for i in range(3)]
    with log_path.open("r+b") as f:  # flip a payload byte of the second record
        f.seek(positions[1] + FRAME_HEADER_SIZE + 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x40]))
    with FileLog.open(log_path) as reader:
        entries = reader.read(reader.start)
        assert [e.data for e in entries] == [b"record 0"]  # the good ones first
        with pytest.raises(CorruptLogError) as caught:
            reader.read(entries[-1].next)
        assert caught.value.path == str(log_path)
        assert caught.value.offset == positions[1]
        assert str(caught.value) == (
            f"{log_path}: corrupt record at byte offset {positions[1]}: payload checksum mismatch"
        )
        with pytest.raises(CorruptLogError, match=f"offset {positions[1]}"):
            reader.repair()


# -- a write that does not fit ---------------------------------------------------------------


def _append_under_rlimit(path: str, limit: int, records: list[bytes], results: Queue[Any]) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills us at the limit
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    outcomes: list[tuple[str, object]] = []
    with FileLog.open(path) as handle:
        for data in records:
            try:
                outcomes.append(("ok", handle.append(data)))
            except AppendError as exc:
                outcomes.append(("error", str(exc)))
    results.put(outcomes)


@pytest.mark.parametrize("room", [100, 0], ids=["short-write", "no-room-at-all"])
def test_a_write_past_the_file_size_limit_fails_cleanly(
    log_path: Path, log: FileLog, room: int
) -> None:
    log.append(b"before")
    size = log_path.stat().st_size
    small = b"s" * (room - FRAME_HEADER_SIZE) if room else b""
    records = [b"x" * 1000, small] if room else [b"x" * 1000]
    results: Queue[Any] = CTX.Queue()
    finish(start(_append_under_rlimit, str(log_path), size + room, records, results))
    outcomes = results.get(timeout=CHILD_TIMEOUT)
    assert outcomes[0] == (
        "error",
        f"{log_path}: append of {frame_size(records[0])} bytes at offset {size} failed: "
        "File too large",
    )
    if room:
        assert outcomes[1] == ("ok", size)  # the failed append left nothing behind
    assert log_path.stat().st_size == size + (frame_size(small) if room else 0)
    log.append(b"after")
    assert all_data(log) == [b"before", *([small] if room else []), b"after"]


def test_a_full_disk_mid_write_leaves_nothing_behind(
    log_path: Path, log: FileLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    log.append(b"before")
    size = log_path.stat().st_size
    real_pwrite = os.pwrite

    def half_then_enospc(fd: int, data: Any, offset: int) -> int:
        if offset == size:  # the first write gets half its bytes out
            return real_pwrite(fd, bytes(data)[: len(data) // 2], offset)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", half_then_enospc)
    with pytest.raises(AppendError, match="No space left on device"):
        log.append(b"y" * 100)
    monkeypatch.undo()
    assert log_path.stat().st_size == size
    log.append(b"after")
    assert all_data(log) == [b"before", b"after"]


# -- the lock file ---------------------------------------------------------------------------


def _hold_flock(path: str, held: Event, release: Event) -> None:
    lock = FlockLock(path)
    lock.acquire()
    held.set()
    release.wait(CHILD_TIMEOUT)
    lock.release()
    lock.close()


def _hold_filelock(path: str, held: Event, release: Event) -> None:
    with maintenance_lock(path):
        held.set()
        release.wait(CHILD_TIMEOUT)


def test_the_hot_path_flock_and_filelock_exclude_each_other_across_processes(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "claims.log.lock")
    held, release = CTX.Event(), CTX.Event()

    # a process holds the flock on its kept descriptor: filelock cannot take the file
    holder = start(_hold_flock, path, held, release)
    assert held.wait(CHILD_TIMEOUT)
    inode = os.stat(path).st_ino
    probe = filelock.FileLock(path)  # plain filelock, as any other tool would take it
    with pytest.raises(filelock.Timeout):
        probe.acquire(blocking=False)
    release.set()
    finish(holder)
    with probe:
        pass
    assert os.stat(path).st_ino == inode  # filelock kept the file: one inode for everyone

    # a process holds filelock (as `repair` does): neither an exclusive nor a shared flock
    # gets in
    held.clear()
    release.clear()
    holder = start(_hold_filelock, path, held, release)
    assert held.wait(CHILD_TIMEOUT)
    mine = FlockLock(path)
    try:
        for mode in (fcntl.LOCK_EX, fcntl.LOCK_SH):
            with pytest.raises(BlockingIOError):
                fcntl.flock(mine.fd, mode | fcntl.LOCK_NB)
        release.set()
        finish(holder)
        mine.acquire()
        mine.release()
    finally:
        mine.close()
    assert os.stat(path).st_ino == inode


# -- durability ------------------------------------------------------------------------------


@pytest.fixture
def fdatasyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every fdatasync call's descriptor (the real call still happens)."""
    calls: list[int] = []
    real = os.fdatasync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    return calls


def test_commit_forces_durable_appends_only(log_path: Path, fdatasyncs: list[int]) -> None:
    with FileLog.open(log_path, Durability.COMMIT) as handle:
        handle.append(b"casual")
        assert fdatasyncs == [] and handle.synced() == 0
        position = handle.append(b"important", durable=True)
        assert len(fdatasyncs) == 1
        assert handle.synced() == position + frame_size(b"important")
        handle.append_many([b"a", b"b"], durable=True)
        assert len(fdatasyncs) == 2
        assert handle.synced() == handle.end()
        # The first forced append wrote zeros ahead of itself; the second landed in them.
        first_end = position + frame_size(b"important")
        assert log_path.stat().st_size == first_end + zeros_ahead(first_end - FILE_HEADER_SIZE)
        assert log_path.read_bytes()[handle.end() :] == bytes(
            log_path.stat().st_size - handle.end()
        )


def test_always_forces_every_append(log_path: Path, fdatasyncs: list[int]) -> None:
    with FileLog.open(log_path, Durability.ALWAYS) as handle:
        for i in range(5):
            handle.append(b"%d" % i)
            assert handle.synced() == handle.end()
        assert len(fdatasyncs) == 5


def test_none_never_forces(log_path: Path, fdatasyncs: list[int]) -> None:
    with FileLog.open(log_path, Durability.NONE) as handle:
        handle.append(b"x", durable=True)
        handle.append_many([b"y"], durable=True)
    assert fdatasyncs == []


def _durable_append(path: str, data: bytes, results: Queue[Any]) -> None:
    calls = 0
    real = os.fdatasync

    def counting(fd: Any) -> None:
        nonlocal calls
        calls += 1
        real(fd)

    os.fdatasync = counting  # this child only
    with FileLog.open(path) as handle:
        handle.append(data, durable=True)
    results.put(calls)


def test_concurrent_durable_appends_share_one_fdatasync(log_path: Path, log: FileLog) -> None:
    sync = FlockLock(str(log_path) + ".sync")
    sync.acquire()  # hold the group-commit lock so all three writers queue behind it
    try:
        results: Queue[Any] = CTX.Queue()
        records = [b"one", b"two", b"three"]
        writers = [start(_durable_append, str(log_path), r, results) for r in records]
        everything = FILE_HEADER_SIZE + sum(frame_size(r) for r in records)
        wait_until(lambda: log.end() == everything, CHILD_TIMEOUT, "three writes")
    finally:
        sync.release()
        sync.close()
    finish(*writers)
    calls = [results.get(timeout=CHILD_TIMEOUT) for _ in writers]
    assert sum(calls) == 1  # the first one in forced all three records
    assert log.synced() == everything


# -- waiting ---------------------------------------------------------------------------------


def _append_when(path: str, go: Event) -> None:
    go.wait(CHILD_TIMEOUT)
    with FileLog.open(path) as handle:
        handle.append(b"from another process")


def test_wait_wakes_on_an_append_from_another_process(log_path: Path, log: FileLog) -> None:
    go = CTX.Event()
    writer = start(_append_when, str(log_path), go)
    position = log.end()
    timeout = 60.0
    started = time.monotonic()
    go.set()
    assert log.wait(position, timeout) is True
    assert time.monotonic() - started < timeout  # woken by the append, not the deadline
    finish(writer)
    assert [e.data for e in log.read(position)] == [b"from another process"]


@pytest.mark.parametrize("kind", ["inotify", "poll"])
def test_waiters_wake_on_a_write_and_time_out_without_one(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "watched"
    path.write_bytes(b"")
    waiter = InotifyWaiter(str(path)) if kind == "inotify" else PollWaiter()
    try:
        assert waiter.wait(lambda: path.stat().st_size > 0, 0.02) is False
        writer = threading.Thread(target=lambda: path.write_bytes(b"news"))
        writer.start()
        assert waiter.wait(lambda: path.stat().st_size > 0, 60.0) is True
        writer.join()
    finally:
        waiter.close()
    assert isinstance(make_waiter(str(path)), InotifyWaiter)


# -- fork and big records --------------------------------------------------------------------


def _use_inherited(handle: FileLog, results: Queue[Any]) -> None:
    results.put(handle._stale)  # marked by the fork hook before any use
    handle.append(b"child")
    results.put(handle.end())


def test_a_forked_child_reopens_an_inherited_handle(log: FileLog) -> None:
    log.append(b"parent")
    results: Queue[Any] = CTX.Queue()
    finish(start(_use_inherited, log, results))
    assert results.get(timeout=CHILD_TIMEOUT) is True
    child_end = results.get(timeout=CHILD_TIMEOUT)
    log.append(b"parent again")
    assert all_data(log) == [b"parent", b"child", b"parent again"]
    assert log.read(child_end)[0].data == b"parent again"


def test_records_larger_than_a_read_chunk_and_many_small_ones(log: FileLog) -> None:
    big = os.urandom(READ_CHUNK * 3 + 7)
    small = [b"s%05d" % i + b"." * 990 for i in range(600)]  # more than one chunk of them
    log.append(b"first")
    log.append(big)
    log.append_many(small)
    with FileLog.open(log.path) as reader:
        assert all_data(reader) == [b"first", big, *small]
        page = reader.read(reader.start, max_records=2)
        assert [e.data for e in page] == [b"first", big]
        assert len(reader.read(page[-1].next, max_records=500)) == 500
        assert reader.end() == log.end() == Path(log.path).stat().st_size


@pytest.mark.parametrize("tail", ["clean", "partial-frame", "partial-long-batch"])
def test_an_appender_finds_the_end_after_a_long_gap(
    log_path: Path, log: FileLog, tail: str
) -> None:
    # `log` appends first, then stays idle while another handle writes far more than one
    # scan chunk: small frames, frames larger than a chunk, and (perhaps) a torn tail.
    log.append(b"start")
    expected = [b"start"]
    with FileLog.open(log_path) as other:
        for i in range(3000):
            other.append(b"small %d" % i)
        big = [bytes([i]) * (200 * 1024) for i in range(3)]
        other.append_many(big)
        other.append(b"last whole one")
    expected += [b"small %d" % i for i in range(3000)] + big + [b"last whole one"]
    if tail == "partial-frame":
        _tear(log_path, "partial-frame")
    elif tail == "partial-long-batch":  # a batch longer than a scan chunk, cut short
        with log_path.open("ab") as f:
            f.write(encode_batch([b"%04d" % i * 250 for i in range(100)])[:-10])
    end = FILE_HEADER_SIZE + sum(frame_size(d) for d in expected)
    with FileLog.open(log_path) as reader:
        assert reader.end() == end  # (the reader's walk)
    assert log.append(b"mine") == end  # (the writer's walk)
    assert log_path.stat().st_size == end + frame_size(b"mine")
    assert all_data(log) == [*expected, b"mine"]


def test_a_reader_that_meets_damage_decides_again_with_writers_held_off(
    log: FileLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reader can see a torn tail being cut and rewritten under its feet, a mix of old and
    # new bytes that looks like damage; it must read again under a shared lock.
    log.append(b"one")
    log.append(b"two")
    real_loop = framing._entries_loop
    real_decode = framing.decode_frames
    calls: list[bool] = []

    def loop_racing(*args: Any) -> Any:
        probe = FlockLock(log.path + ".lock")  # can a writer get in right now?
        try:
            fcntl.flock(probe.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            calls.append(False)
        except BlockingIOError:
            calls.append(True)
        finally:
            probe.close()
        if len(calls) == 1:
            return [], 0, 0, 0  # the walk stopped at the first frame: decode_frames decides
        return real_loop(*args)

    def decode_racing(*args: Any, **kwargs: Any) -> framing.Decoded:
        if len(calls) == 1:
            raise CorruptLogError(log.path, 16, "a mix of old and new bytes")
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(framing, "_entries_loop", loop_racing)
    monkeypatch.setattr(framing, "decode_frames", decode_racing)
    assert [e.data for e in log.read(log.start)] == [b"one", b"two"]
    assert calls == [False, True]  # the second look held the writers off
