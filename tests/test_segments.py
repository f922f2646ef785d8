"""Segmented file logs: global positions across segment files, rolls by several processes,
a single-file log of an older qw kept, foreign or misplaced segments refused, compacted
positions reported as such, and readers woken across a roll."""

from __future__ import annotations

import itertools
import mmap
import multiprocessing
import os
import shutil
import struct
import threading
from pathlib import Path

import pytest

from logstore import (
    CorruptLogError,
    Durability,
    IdentityError,
    LogIdentity,
    PositionCompactedError,
)
from logstore.file.framing import FILE_HEADER_SIZE, encode_file_header, encode_frame
from logstore.file.log import FileLog
from logstore.file.segments import FIRST_BASE, list_bases, segment_files, segment_path

CTX = multiprocessing.get_context("fork")
SMALL = 4096
QUEUE = bytes(range(16))


def records(count: int, tag: str) -> list[bytes]:
    return [f"{tag}-{i}-".encode() * 20 for i in range(count)]


def _append_all(path: str, tag: str, count: int) -> None:
    with FileLog.open(path, Durability.NONE, segment_bytes=SMALL) as log:
        for i, data in enumerate(records(count, tag)):
            if i % 7 == 6:
                log.append_many([data, data + b"+"])
            else:
                log.append(data)


def test_positions_stay_global_and_contiguous_across_segments(tmp_path: Path) -> None:
    path = str(tmp_path / "tasks.log")
    with FileLog.open(path, segment_bytes=SMALL) as log:
        wanted = records(300, "a")
        positions = [log.append(data) for data in wanted]
        assert len(list_bases(path)) > 5  # ~70 KB of records in 4 KiB segments
        entries = list(log.iter_from(log.start))
        assert [e.data for e in entries] == wanted
        assert [e.position for e in entries] == positions
        # the next record starts where the last one ended, across segment boundaries too
        assert all(a.next == b.position for a, b in itertools.pairwise(entries))
        for base, _ in segment_files(path)[1:]:
            assert base in positions  # a segment's base is the position of its first record
        assert log.end() == entries[-1].next
    with FileLog.open(path, read_only=True) as again:  # another handle reads the same
        assert [(e.position, e.data) for e in again.iter_from(again.start)] == [
            (e.position, e.data) for e in entries
        ]
        assert again.end() == entries[-1].next


def test_processes_rolling_at_once_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "claims.log")
    FileLog.open(path, segment_bytes=SMALL).close()
    writers = [CTX.Process(target=_append_all, args=(path, f"w{n}", 400)) for n in range(3)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(60)
        assert w.exitcode == 0
    with FileLog.open(path, segment_bytes=SMALL) as log:
        entries = list(log.iter_from(log.start))
        positions = [e.position for e in entries]
        assert positions == sorted(set(positions))
        got = sorted(e.data for e in entries)
        expected = []
        for n in range(3):
            for i, data in enumerate(records(400, f"w{n}")):
                expected += [data, data + b"+"] if i % 7 == 6 else [data]
        assert got == sorted(expected)
        assert log.check() == log.end() == entries[-1].next


def test_a_single_file_log_of_an_older_qw_is_the_first_segment(tmp_path: Path) -> None:
    """A version-2 file (one file per topic) opens with its records where they were, and
    new records go to new segments after it."""
    path = tmp_path / "tasks.log"
    old = [b"old-%d" % i * 50 for i in range(100)]
    path.write_bytes(encode_file_header(1 << 24, QUEUE, "tasks") + b"".join(map(encode_frame, old)))
    size = path.stat().st_size
    with FileLog.open(path, identity=LogIdentity(QUEUE, "tasks"), segment_bytes=SMALL) as log:
        assert log.start == FILE_HEADER_SIZE
        entries = list(log.iter_from(log.start))
        assert [e.data for e in entries] == old
        assert entries[-1].next == size  # the positions it always had
        new = log.append(b"new")
        assert new == size  # the first segment was full: a new segment starts at its end
    assert [base for base, _ in segment_files(str(path))] == [FIRST_BASE, size]
    assert path.stat().st_size == size  # the old file is kept as it was
    with FileLog.open(path, read_only=True) as log:
        assert [e.data for e in log.iter_from(log.start)] == [*old, b"new"]


def test_a_renamed_or_foreign_segment_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = str(tmp_path / "tasks.log")
    with FileLog.open(path, segment_bytes=SMALL) as log:
        for data in records(100, "a"):
            log.append(data)
    (base, seg), (later, _) = segment_files(path)[1:3]
    # a segment renamed to another base
    moved = segment_path(path, base + 1)
    os.rename(seg, moved)
    with pytest.raises(IdentityError) as refused:
        FileLog.open(path, segment_bytes=SMALL).read(base + 1)
    assert f"{moved} holds the segment at base {base}, not at {base + 1}" in str(refused.value)
    os.rename(moved, seg)
    # a segment of another queue's log, copied in at the right name
    other = str(tmp_path / "other" / "tasks.log")
    os.mkdir(tmp_path / "other")
    with FileLog.open(other, segment_bytes=SMALL) as log:
        for data in records(100, "a"):
            log.append(data)
    shutil.copy(segment_path(other, later), segment_path(path, later))
    with (
        pytest.raises(IdentityError) as foreign,  # at open, or at the read that meets it
        FileLog.open(path, segment_bytes=SMALL) as log,
    ):
        log.read(later)
    assert f"{segment_path(path, later)} is a segment of " in str(foreign.value)
    assert "a segment of another log" in str(foreign.value)


def test_a_compacted_position_raises_the_typed_error(tmp_path: Path) -> None:
    path = str(tmp_path / "claims.log")
    with FileLog.open(path, segment_bytes=SMALL) as log:
        positions = [log.append(data) for data in records(300, "a")]
        reader = FileLog.open(path, segment_bytes=SMALL)
        assert reader.read(positions[0], 1)[0].position == positions[0]  # holds segment 0
        sealed = log.sealed_segments()
        cut = sealed[2][1]  # the end of the third segment
        dropped = log.drop_segments(cut)
        assert dropped == sealed[:3]
        assert log.start == cut
        assert Path(path).exists()  # the first segment's stub names the log still
        fresh = FileLog.open(path, segment_bytes=SMALL)
        with pytest.raises(PositionCompactedError) as gone:
            fresh.read(positions[0])
        assert gone.value.start == cut and gone.value.position == positions[0]
        fresh.close()
        # A reader inside a removed segment reads on in the file it has open (whole: never
        # a half-deleted file); moving on to a removed segment is the typed error.
        first_end = sealed[0][1]
        got = reader.read(positions[1], None)
        assert [e.position for e in got] == [p for p in positions[1:] if p < first_end]
        with pytest.raises(PositionCompactedError):
            reader.read(got[-1].next)
        assert reader.read(cut, 1)[0].position == cut
        reader.close()
    with FileLog.open(path, segment_bytes=SMALL) as log:  # a new handle: the same answers
        assert log.start == cut
        assert [e.position for e in log.iter_from(log.start)] == [p for p in positions if p >= cut]
        assert log.checksum(cut, log.end()) == log.checksum(cut, log.end())
        with pytest.raises(PositionCompactedError):
            log.checksum(positions[0], cut)


def test_a_reader_of_the_then_active_segment_meets_its_removal_as_compaction(
    tmp_path: Path,
) -> None:
    """A handle that read the active segment, which has since been sealed and removed with
    the segments after it, reaches its end: compacted, not a missing segment (damage)."""
    path = str(tmp_path / "members.log")
    with FileLog.open(path, segment_bytes=SMALL) as log:
        first = log.append(b"first")
        reader = FileLog.open(path, segment_bytes=SMALL)
        assert reader.read(first, 1)[0].data == b"first"  # segment 0, the active one then
        positions = [log.append(data) for data in records(300, "a")]
        sealed = log.sealed_segments()
        cut = sealed[2][1]
        assert log.drop_segments(cut) == sealed[:3]
        got = reader.read(positions[0], None)  # on in the file it has open
        assert [e.position for e in got] == [p for p in positions if p < sealed[0][1]]
        with pytest.raises(PositionCompactedError) as gone:
            reader.read(got[-1].next)
        assert gone.value.start == cut
        assert reader.read(cut, 1)[0].position == cut
        reader.close()


def test_a_reader_waiting_at_a_segment_end_wakes_for_the_next_segment(tmp_path: Path) -> None:
    path = str(tmp_path / "claims.log")
    with FileLog.open(path, segment_bytes=SMALL) as log:
        while len(list_bases(path)) == 1 or log.end() - list_bases(path)[-1] < SMALL - 100:
            log.append(b"x" * 90)
        reader = FileLog.open(path, segment_bytes=SMALL)
        end = reader.end()
        assert reader.read(end) == []
        woke = threading.Event()

        def wait() -> None:
            if reader.wait(end, 30):
                woke.set()

        waiting = threading.Thread(target=wait)
        waiting.start()
        bases_before = list_bases(path)
        appended = [log.append(b"y" * 200) for _ in range(3)]  # rolls on the way
        waiting.join(30)
        assert woke.is_set()
        assert len(list_bases(path)) > len(bases_before)
        assert [e.position for e in reader.iter_from(end)] == appended
        reader.close()


def test_an_appender_finishes_a_roll_whose_roller_was_killed(tmp_path: Path) -> None:
    """A roller killed after it announced the new segment (the ACTIVE word) and before it
    created the file: the next appender creates it and appends there, never to the old
    segment (whose end the new base already promised)."""
    path = str(tmp_path / "claims.log")
    with FileLog.open(path, segment_bytes=1 << 20) as log:
        first = [log.append(data) for data in records(20, "a")]
        end = log.end()
        with open(path + ".sync", "r+b") as f, mmap.mmap(f.fileno(), 24) as state:
            struct.pack_into("<Q", state, 16, end)  # what _roll stores first
        assert list_bases(path) == [FIRST_BASE]
        assert log.append(b"after") == end
        assert list_bases(path) == [FIRST_BASE, end]
        assert [e.data for e in log.iter_from(first[0])][-1] == b"after"


def test_every_writer_rolls_at_the_size_the_log_was_last_given(tmp_path: Path) -> None:
    """`qw up --segment-bytes` opens the logs with a size; a writer that names none (a
    worker, `qw enqueue`) rolls at that size too."""
    path = str(tmp_path / "tasks.log")
    FileLog.open(path, segment_bytes=SMALL).close()
    with FileLog.open(path) as log:
        assert log.segment_bytes == SMALL
        for data in records(300, "a"):
            log.append(data)
    assert len(list_bases(path)) > 5  # ~70 KB in 4 KiB segments
    FileLog.open(path, segment_bytes=1 << 20).close()
    with FileLog.open(path) as log:
        before = list_bases(path)
        for data in records(300, "b"):
            log.append(data)
        assert log.segment_bytes == 1 << 20
        assert len(list_bases(path)) <= len(before) + 1


def test_a_segment_missing_in_the_middle_is_damage_naming_the_file(tmp_path: Path) -> None:
    path = str(tmp_path / "claims.log")
    with FileLog.open(path, segment_bytes=SMALL) as log:
        for data in records(300, "a"):
            log.append(data)
    (_, first_path), (gone, gone_path) = segment_files(path)[1:3]
    os.unlink(gone_path)
    with FileLog.open(path, read_only=True) as log, pytest.raises(CorruptLogError) as damage:
        list(log.iter_from(log.start))
    assert f"{first_path}: corrupt record at byte offset {gone}" in str(damage.value)
    assert "a segment is missing" in str(damage.value)


def test_a_first_segment_removed_by_hand_is_refused_one_created_meanwhile_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "claims.log")
    FileLog.open(path).close()
    # Another process creates the log between our look for its header and our listing of
    # its segments (a CI run's eight processes opening one new log at once): not damage.
    import logstore.file.log as file_log

    looked: list[str] = []

    def before_it_was_there(name: str) -> None:
        looked.append(name)

    monkeypatch.setattr(file_log, "read_file_header", before_it_was_there)
    with FileLog.open(path) as log:  # created meanwhile: the creator's header is read
        assert log.end() == FILE_HEADER_SIZE
    assert looked == [path]
    monkeypatch.undo()
    with FileLog.open(path, segment_bytes=SMALL) as log:
        for data in records(300, "a"):
            log.append(data)
    os.unlink(path)  # the first segment removed by hand, later ones left
    with pytest.raises(IdentityError) as refused:
        FileLog.open(path)
    assert "is missing but later segments of it are there" in str(refused.value)
