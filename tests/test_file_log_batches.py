"""Reading long batches (append_many) from a file log: each batch is verified once a handle.

A reader returns no frame of a batch until all of it is whole and valid. A handle that has
verified a batch must not verify it again for every read inside it: these tests count the
payload checksums computed (framing._crc32) and the bytes read (os.pread) to pin that down,
and check that the torn-tail and damage rules still hold for long batches.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from logstore.base import CorruptLogError, Durability
from logstore.file import framing
from logstore.file.framing import FRAME_HEADER_SIZE, encode_batch
from logstore.file.log import FileLog
from logstore.file.reads import BIG_READ, MIN_READ, READ_CHUNK


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "tasks.log"


@pytest.fixture
def crc_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One item per payload checksum computed by the decoder (its length)."""
    calls: list[int] = []

    def counting(data: bytes, value: int = 0) -> int:
        calls.append(len(data))
        return zlib.crc32(data, value)

    monkeypatch.setattr(framing, "_crc32", counting)
    # the Python frame loop, whose checksums go through _crc32
    monkeypatch.setattr(framing, "_frames_loop", framing._decode_loop)
    monkeypatch.setattr(framing, "_entries_loop", framing._decode_entries)
    return calls


@pytest.fixture
def pread_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size asked for by every os.pread."""
    sizes: list[int] = []
    real = os.pread

    def counting(fd: int, size: int, offset: int) -> bytes:
        sizes.append(size)
        return real(fd, size, offset)

    monkeypatch.setattr(os, "pread", counting)
    return sizes


def records(count: int, size: int) -> list[bytes]:
    return [(b"%07d:" % i).ljust(size, b"r") for i in range(count)]


@pytest.fixture
def reader(log_path: Path) -> Iterator[FileLog]:
    handle = FileLog.open(log_path)
    yield handle
    handle.close()


def write(log_path: Path, *batches: list[bytes]) -> list[int]:
    positions: list[int] = []
    with FileLog.open(log_path, Durability.NONE) as writer:
        for batch in batches:
            positions += writer.append_many(batch)
    return positions


# size 40: the batch fits one BIG_READ; size 500: it takes two, carried across buffers
@pytest.mark.parametrize("size", [40, 500])
def test_one_record_at_a_time_from_a_long_batch_verifies_the_batch_once(
    log_path: Path, size: int, crc_calls: list[int], pread_sizes: list[int]
) -> None:
    batch = records(3000, size)
    assert (size > 100) == (len(batch) * (FRAME_HEADER_SIZE + size) > BIG_READ)
    positions = write(log_path, [b"before"], batch, [b"after"])
    with FileLog.open(log_path) as handle:
        crc_calls.clear()  # (the writer's, and opening's, do not count)
        pread_sizes.clear()
        for position, data in zip(positions[1:-1], batch, strict=True):
            assert [(e.position, e.data) for e in handle.read(position, 1)] == [(position, data)]
        # every frame checksummed twice at most: once verifying the batch, once returned
        # (each call re-verifying the rest of the batch would be ~4.5 million); plus those
        # of the first buffer, decoded before the batch turned out longer than it, and
        # b"after", which was in the last buffer that verified the batch
        assert len(crc_calls) <= 2 * len(batch) + MIN_READ // size + 1
        # and a read of one small record reads a few KiB, not a whole chunk
        assert sorted(pread_sizes)[len(pread_sizes) // 2] <= MIN_READ
        assert [e.data for e in handle.read(positions[-1])] == [b"after"]


def test_chunked_and_unlimited_reads_of_a_long_batch_verify_it_once(
    log_path: Path, crc_calls: list[int]
) -> None:
    batch = records(20_000, 40)
    write(log_path, batch)
    crc_calls.clear()
    with FileLog.open(log_path) as handle:
        position, seen = handle.start, []
        while entries := handle.read(position, 100):
            seen += [e.data for e in entries]
            position = entries[-1].next
        assert seen == batch
        assert len(crc_calls) <= 2 * len(batch) + READ_CHUNK // 40  # (as above)
    crc_calls.clear()
    with FileLog.open(log_path) as handle:
        assert [e.data for e in handle.read(handle.start)] == batch
        assert len(crc_calls) <= 2 * len(batch) + READ_CHUNK // 40


def test_a_record_longer_than_a_read_buffer_inside_a_long_batch(log_path: Path) -> None:
    big = bytes(range(256)) * (BIG_READ // 256 + 1000)  # longer than any read buffer
    batch = [b"first", big, *records(2000, 40), b"last"]
    positions = write(log_path, batch)
    with FileLog.open(log_path) as handle:
        assert [e.data for e in handle.read(positions[0], 1)] == [b"first"]
        assert [e.data for e in handle.read(positions[1], 1)] == [big]
        assert [e.data for e in handle.read(positions[2], 2)] == batch[2:4]
        assert [e.data for e in handle.read(positions[-1])] == [b"last"]
    with FileLog.open(log_path) as handle:  # a fresh handle, starting from the big one
        assert [e.data for e in handle.read(positions[1], 3)] == batch[1:4]
        assert [e.data for e in handle.iter_from(handle.start)] == batch


@pytest.mark.parametrize("size", [40, 500])
def test_a_long_batch_is_invisible_until_it_is_whole(
    log_path: Path, reader: FileLog, size: int
) -> None:
    # A writer's pwrite of a long batch is not atomic for readers: they may see part of it.
    (first,) = write(log_path, [b"first"])
    batch = [b"x" * (BIG_READ + 10), *records(3000, size)] if size > 100 else records(3000, size)
    frames = encode_batch(batch)
    after_first = first + FRAME_HEADER_SIZE + len(b"first")
    with log_path.open("ab") as f:
        for cut in (len(frames) // 3, len(frames) - 1):
            f.write(frames[f.tell() - after_first : cut])
            f.flush()
            assert [e.data for e in reader.read(first)] == [b"first"]
            assert reader.read(after_first, 1) == []
            assert reader.read(after_first) == []
        f.write(frames[f.tell() - after_first :])
    assert [e.data for e in reader.read(after_first, 1)] == batch[:1]
    assert [e.data for e in reader.read(after_first)] == batch


def test_a_torn_long_batch_is_never_seen_and_the_next_appender_cuts_it(
    log_path: Path, reader: FileLog
) -> None:
    (first,) = write(log_path, [b"first"])
    end = first + FRAME_HEADER_SIZE + len(b"first")
    with log_path.open("ab") as f:  # what a writer killed in the middle of append_many leaves
        f.write(encode_batch(records(40_000, 40))[:-5])
    assert [e.data for e in reader.read(reader.start)] == [b"first"]
    assert reader.read(end, 1) == []
    assert reader.end() == end
    assert write(log_path, [b"after"]) == [end]
    assert log_path.stat().st_size == end + FRAME_HEADER_SIZE + len(b"after")
    assert [e.data for e in reader.read(end, 1)] == [b"after"]
    assert [e.data for e in reader.read(reader.start)] == [b"first", b"after"]


def test_damage_inside_a_batch_already_verified_is_still_caught(
    log_path: Path, reader: FileLog
) -> None:
    batch = records(50, 40)
    positions = write(log_path, batch)
    assert [e.data for e in reader.read(reader.start)] == batch  # verified now
    with log_path.open("r+b") as f:  # a payload byte of record 20 goes bad on disk
        f.seek(positions[20] + FRAME_HEADER_SIZE + 3)
        f.write(b"\xff")
    with pytest.raises(CorruptLogError) as caught:
        reader.read(positions[20], 1)
    assert caught.value.offset == positions[20]
    assert caught.value.reason == "payload checksum mismatch"
    # the good records before it first (their batch was verified whole before), then the error
    assert [e.data for e in reader.read(positions[10], 100)] == batch[10:20]
    with pytest.raises(CorruptLogError, match=f"offset {positions[20]}"):
        reader.read(positions[20])


def test_a_file_cut_below_what_a_reader_verified_is_verified_again(
    log_path: Path, reader: FileLog
) -> None:
    # Not something the protocol does (it cuts only torn tails); an operator might.
    positions = write(log_path, [b"alone"], records(10, 40))
    assert len(reader.read(reader.start)) == 11
    os.truncate(log_path, positions[4] + 5)  # inside the batch, which must now disappear
    assert [e.data for e in reader.read(reader.start)] == [b"alone"]
    assert reader.read(positions[1], 1) == []
    assert reader.read(positions[2], 1) == []


def test_reads_start_small_and_grow_for_a_long_gap(
    log_path: Path, reader: FileLog, pread_sizes: list[int]
) -> None:
    for _ in range(50):
        write(log_path, records(1000, 40))
    pread_sizes.clear()
    assert len(reader.read(reader.start, 1)) == 1
    # the first batch (52 KB) is longer than the first read: verified with reads that
    # double from twice that size, not with one BIG_READ walking 20 batches ahead
    assert pread_sizes == [MIN_READ, 2 * MIN_READ, 4 * MIN_READ, 8 * MIN_READ, MIN_READ]
    assert len(reader.read(reader.start + 100 * 52, 1)) == 1  # verified: one small read
    assert pread_sizes[5:] == [MIN_READ]
    pread_sizes.clear()
    assert len(reader.read(reader.start)) == 50_000
    assert max(pread_sizes) == BIG_READ  # after the first buffer, large ones
    assert len(pread_sizes) < log_path.stat().st_size / BIG_READ + 3
    assert reader.read(reader.start, 0) == []
