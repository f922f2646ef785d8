"""`Log.check(start)`: verify a log from a record's position to its end (what a supervisor
does after a fold checkpoint whose restore checksummed the records before it).

On every backend it ends where `check()` ends; on the file log it reads nothing before
`start` (damage there is not met, damage after it is), across segments too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore import CorruptLogError, open_log
from logstore.base import Durability, Log
from logstore.file.framing import FRAME_HEADER_SIZE
from logstore.file.log import FileLog
from logstore.memory import MemoryLog


def flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))


def positions_of(log: Log) -> list[int]:
    return [e.position for e in log.iter_from(log.start)]


@pytest.mark.parametrize("backend", ["memory", "file", "redis"])
def test_check_from_a_record_ends_where_check_ends(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    log: Log
    if backend == "memory":
        log = MemoryLog("check")
    elif backend == "file":
        log = FileLog.open(tmp_path / "check.log")
    else:
        log = open_log(request.getfixturevalue("redis_url"), "check")
    try:
        assert log.check(log.start) == log.check()
        log.append_many([b"a", b"bb", b"ccc"])
        log.append(b"dddd")
        end = log.check()
        for position in positions_of(log):
            assert log.check(position) == end
        assert log.check(end) == end  # nothing after it: nothing to read
    finally:
        log.close()


def test_damage_before_start_is_not_read_and_after_it_is(tmp_path: Path) -> None:
    path = tmp_path / "check.log"
    with FileLog.open(path) as log:
        for i in range(6):
            log.append(b"record %d" % i)
        positions = positions_of(log)
    flip(path, positions[1] + FRAME_HEADER_SIZE + 2)  # the second record's payload
    with FileLog.open(path, read_only=True) as log:
        with pytest.raises(CorruptLogError, match=f"offset {positions[1]}"):
            log.check()
        with pytest.raises(CorruptLogError, match=f"offset {positions[1]}"):
            log.check(positions[1])
        assert log.check(positions[2]) == log.end()
    flip(path, positions[4] + FRAME_HEADER_SIZE + 2)
    with (
        FileLog.open(path, read_only=True) as log,
        pytest.raises(CorruptLogError, match=f"offset {positions[4]}"),
    ):
        log.check(positions[2])


def test_check_from_a_later_segment_skips_the_earlier_ones(tmp_path: Path) -> None:
    path = tmp_path / "check.log"
    with FileLog.open(path, Durability.NONE, segment_bytes=256) as log:
        for i in range(40):
            log.append(b"record %02d" % i)
        segments = log.segments()
        assert len(segments) >= 3
        end = log.check()
        in_first = [e.position for e in log.read(log.start) if e.position < segments[0][1]]
    # damage in the first segment (the file of the log's own name): met from the start, not
    # from the third segment on
    middle = in_first[len(in_first) // 2]
    flip(path, middle + FRAME_HEADER_SIZE + 2)  # (its base is 0: positions are offsets)
    with FileLog.open(path, read_only=True) as log:
        with pytest.raises(CorruptLogError):
            log.check()
        assert log.check(segments[2][0]) == end
        # from inside the second segment: its later records are read, the first's are not
        inside = next(p for p in positions_of_from(log, segments[1][0]) if p > segments[1][0])
        assert log.check(inside) == end


def positions_of_from(log: FileLog, position: int) -> list[int]:
    return [e.position for e in log.read(position)]
