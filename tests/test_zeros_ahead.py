"""Zeros written ahead of forced appends (logstore/file/log.py, "Zeros ahead"; docs/protocol.md
§5): the log's end is no longer the file's size, and every reader and writer must still
find it, through appends, kills mid-append, rolls and waits."""

from __future__ import annotations

import hashlib
import itertools
import mmap
import multiprocessing
import os
import random
import signal
import struct
from collections.abc import Callable
from multiprocessing.context import ForkProcess
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import pytest

from logstore.base import Durability
from logstore.file import log as file_log
from logstore.file.framing import FILE_HEADER_SIZE, encode_frame
from logstore.file.log import STALL_POLL, ZERO_AHEAD, ZERO_AHEAD_MIN, FileLog, zeros_ahead
from logstore.file.segments import segment_files
from tests.helpers import wait_until

CTX = multiprocessing.get_context("fork")
CHILD_TIMEOUT = 60.0
#: the shared state words (logstore/file/log.py): committed end, pending end, file end
COMMITTED, PENDING, FILE_END = 8, 32, 40


def frame_size(data: bytes) -> int:
    return len(encode_frame(data))


def all_data(log: FileLog) -> list[bytes]:
    return [e.data for e in log.iter_from(log.start)]


def store_word(path: Path, offset: int, value: int) -> None:
    """Write one word of the log's shared state, as a writer does (native order)."""
    with open(str(path) + ".sync", "r+b") as f, mmap.mmap(f.fileno(), 0) as state:
        state[offset : offset + 8] = struct.pack("=Q", value)


def one_record_then_an_append_begun(path: Path, frame: bytes, written: int) -> int:
    """A log of one forced record, then what a writer inside its pwrite leaves (killed there,
    or still writing): PENDING stored, the first `written` bytes of `frame` in the zeros,
    COMMITTED not moved. Returns where the record ends (and `frame` begins)."""
    with FileLog.open(path) as log:
        log.append(b"one", durable=True)
        end = log.end()
    store_word(path, PENDING, end + len(frame))
    write_at(path, end, frame[:written])
    return end


def write_at(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_forced_appends_write_zeros_ahead_and_the_next_ones_land_in_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "claims.log"
    with FileLog.open(path, Durability.COMMIT) as log:
        log.append(b"casual")  # not forced: the file grows as it goes
        assert path.stat().st_size == log.end()
        first_end = log.append(b"forced", durable=True) + frame_size(b"forced")
        size = first_end + ZERO_AHEAD_MIN  # a small log: the fewest zeros
        assert path.stat().st_size == size
        records = [b"r%d" % i for i in range(100)]
        for record in records:
            log.append(record, durable=True)
        end = log.end()
        assert path.stat().st_size == size  # all of them in the zeros
        assert path.read_bytes()[end:] == bytes(size - end)
        # An append that leaves too few zeros writes more of them, a quarter of the records.
        big = b"x" * (size - end)
        at = log.append(big, durable=True)
        end = at + frame_size(big)
        assert path.stat().st_size == end + zeros_ahead(end - FILE_HEADER_SIZE)
        assert all_data(log) == [b"casual", b"forced", *records, big]
        with FileLog.open(path, read_only=True) as reader:
            assert reader.end() == log.end() == reader.check()
            assert all_data(reader) == all_data(log)
        assert log.repair() == 0  # zeros ahead are no torn tail


def test_the_zeros_ahead_grow_with_the_segment_up_to_a_bound() -> None:
    assert zeros_ahead(0) == zeros_ahead(4 * ZERO_AHEAD_MIN) == ZERO_AHEAD_MIN
    assert zeros_ahead(400 * 1024) == 100 * 1024
    assert zeros_ahead(4 * ZERO_AHEAD) == zeros_ahead(1 << 30) == ZERO_AHEAD


def test_a_writer_killed_mid_append_in_the_zeros_is_cut_by_the_next(tmp_path: Path) -> None:
    path = tmp_path / "claims.log"
    frame = encode_frame(b"never finished" * 100)
    end = one_record_then_an_append_begun(path, frame, len(frame) // 2)  # and killed
    with FileLog.open(path, read_only=True) as reader:
        assert all_data(reader) == [b"one"]
        assert reader.end() == end
        assert reader.wait(end, 0.05) is False  # a torn append is not news
        with FileLog.open(path) as writer:
            assert writer.append(b"two") == end  # cut, and written where the torn one began
        assert reader.wait(end, 0) is True
        assert all_data(reader) == [b"one", b"two"]
    with FileLog.open(path) as log:
        assert log.check() == log.end() == end + frame_size(b"two")
        assert log.repair() == 0
        assert log.append(b"three", durable=True) == end + frame_size(b"two")
        assert all_data(log) == [b"one", b"two", b"three"]


class _RecordingWaiter:
    """A waiter that records how long it is asked to sleep and sleeps not at all; on its
    second call the writer in flight stores its committed end."""

    def __init__(self, complete: Callable[[], None]) -> None:
        self.steps: list[float] = []
        self.complete = complete

    def wait(self, ready: Callable[[], bool], timeout: float) -> bool:
        self.steps.append(timeout)
        if len(self.steps) == 2:
            self.complete()
        return ready()

    def close(self) -> None:
        pass


def test_a_reader_stopped_on_an_append_in_flight_polls_until_it_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The committed end that ends a reader's stall is stored after the write raised its
    inotify event (which the waiter may have consumed already): while PENDING is ahead of
    COMMITTED the reader polls every STALL_POLL, rather than sleeping on the event."""
    path = tmp_path / "claims.log"
    frame = encode_frame(b"in flight" * 50)
    end = one_record_then_an_append_begun(path, frame, 20)  # the reader sees part of it
    with FileLog.open(path, read_only=True) as reader:
        assert all_data(reader) == [b"one"]  # and stops there, stalled
        write_at(path, end + 20, frame[20:])  # the rest lands (its event gone by the wait)
        waiter = _RecordingWaiter(lambda: store_word(path, COMMITTED, end + len(frame)))
        monkeypatch.setattr(file_log, "make_waiter", lambda _path: waiter)
        assert reader.wait(end, CHILD_TIMEOUT) is True
        assert waiter.steps[0] == STALL_POLL and len(waiter.steps) == 2
        assert all_data(reader) == [b"one", b"in flight" * 50]


def test_a_roll_cuts_the_zeros_off_the_segment_it_seals(tmp_path: Path) -> None:
    path = tmp_path / "claims.log"
    records = [bytes([i % 256]) * 3000 for i in range(60)]
    with FileLog.open(path, segment_bytes=64 * 1024) as log:
        rolled = 0
        for record in records:
            log.append(record, durable=True)
            if len(log.sealed_segments()) > rolled:  # this append started a segment
                rolled = len(log.sealed_segments())
                base, active = segment_files(str(path))[-1]
                # ...and wrote zeros ahead of itself there, as in any other segment
                held = log.end() - base
                assert os.path.getsize(active) == 56 + held + zeros_ahead(held)
        sealed = log.sealed_segments()
        assert len(sealed) >= 2
        files = dict(segment_files(str(path)))
        for base, after in sealed:
            header = os.path.getsize(files[base]) - (after - base)
            assert header in (48, 56)  # the file ends at its last record: no zeros left
        assert all_data(log) == records
        with FileLog.open(path, read_only=True) as reader:
            assert all_data(reader) == records


def _append_when_told(path: str, go: Any, count: int) -> None:
    go.wait(CHILD_TIMEOUT)
    with FileLog.open(path) as log:
        for i in range(count):
            log.append(b"from the other process %d" % i, durable=True)


def test_a_waiting_reader_wakes_for_appends_into_the_zeros(tmp_path: Path) -> None:
    path = tmp_path / "claims.log"
    with FileLog.open(path) as log:
        log.append(b"first", durable=True)  # zeros ahead from here on
        size = path.stat().st_size
    go = CTX.Event()
    writer = CTX.Process(target=_append_when_told, args=(str(path), go, 3))
    writer.start()
    try:
        with FileLog.open(path, read_only=True) as reader:
            position = reader.end()
            assert reader.wait(position, 0.02) is False
            got: list[bytes] = []
            go.set()
            while len(got) < 3:
                assert reader.wait(position, CHILD_TIMEOUT) is True
                entries = reader.read(position)
                got += [e.data for e in entries]
                if entries:
                    position = entries[-1].next
            assert got == [b"from the other process %d" % i for i in range(3)]
    finally:
        writer.join(CHILD_TIMEOUT)
    assert path.stat().st_size == size  # they all landed in the zeros


# -- kill -9 -----------------------------------------------------------------------------


def _checked(body: bytes) -> bytes:
    """A record that proves itself whole: sha256 of the body, then the body."""
    return hashlib.sha256(body).digest() + body


def _is_whole(record: bytes) -> bool:
    return hashlib.sha256(record[32:]).digest() == record[:32]


def _append_forced_forever(path: str, seed: int) -> None:
    rng = random.Random(seed)
    records = [_checked(rng.randbytes(rng.randint(1, 48 * 1024))) for _ in range(8)]
    log = FileLog.open(path, segment_bytes=1024 * 1024)
    for i in itertools.count():  # until SIGKILL
        if i % 4 == 3:
            log.append_many(records[:3], durable=True)  # all of it or none must show
        else:
            log.append(records[i % 8], durable=True)


def _read_until_end(path: str, results: Queue[Any]) -> None:
    with FileLog.open(path, read_only=True) as log:
        position = log.start
        digest = hashlib.sha256()
        count = broken = 0
        while True:
            entries = log.read(position, 16)
            if not entries:
                if not log.wait(position, CHILD_TIMEOUT):
                    results.put(("timed out", count))
                    return
                continue
            for entry in entries:
                if entry.data == b"END":
                    results.put((count, broken, digest.hexdigest()))
                    return
                count += 1
                broken += not _is_whole(entry.data)
                digest.update(struct.pack("<Q", entry.position) + entry.data)
            position = entries[-1].next


def _state_words(path: Path) -> tuple[int, int]:
    with open(str(path) + ".sync", "rb") as f:
        raw = f.read(48)
    return struct.unpack_from("=Q", raw, COMMITTED)[0], struct.unpack_from("=Q", raw, PENDING)[0]


@pytest.mark.chaos
def test_kill_9_forced_writers_never_shows_a_partial_record(tmp_path: Path) -> None:
    iterations = 100 if os.environ.get("QW_CHAOS") == "long" else 12
    path = tmp_path / "claims.log"
    rng = random.Random(99)
    with FileLog.open(path, segment_bytes=1024 * 1024) as log:
        log.append(b"start", durable=True)
        results: Queue[Any] = CTX.Queue()
        readers = [CTX.Process(target=_read_until_end, args=(str(path), results)) for _ in "ab"]
        for reader in readers:
            reader.start()
        in_flight = 0
        for i in range(iterations):
            target = log.end() + rng.randint(1, 512 * 1024)
            writer: ForkProcess = CTX.Process(target=_append_forced_forever, args=(str(path), i))
            writer.start()

            def grown(target: int = target, writer: ForkProcess = writer) -> bool:
                return log.end() >= target or not writer.is_alive()

            wait_until(grown, CHILD_TIMEOUT, "the writer to get going")
            assert writer.is_alive()
            os.kill(writer.pid or 0, signal.SIGKILL)
            writer.join(CHILD_TIMEOUT)
            committed, pending = _state_words(path)
            in_flight += committed != pending
        end = log.end()
        assert log.append(b"END") == end  # after the last whole record, a torn one cut
        reported = [results.get(timeout=CHILD_TIMEOUT) for _ in readers]
        for reader in readers:
            reader.join(CHILD_TIMEOUT)
        entries = list(log.iter_from(log.start))
        assert [e.data for e in entries[:1]] == [b"start"] and entries[-1].data == b"END"
        assert all(_is_whole(e.data) for e in entries[1:-1])
        digest = hashlib.sha256()
        for entry in entries[:-1]:
            digest.update(struct.pack("<Q", entry.position) + entry.data)
        # (the readers' `broken` counts "start", which is not a checked record)
        assert reported == [(len(entries) - 1, 1, digest.hexdigest())] * 2
        assert len(segment_files(str(path))) > 2
        assert log.repair() == 0
    # (how many kills landed inside an append is luck: reported, not required)
    print(f"kills inside an append: {in_flight} of {iterations}")
