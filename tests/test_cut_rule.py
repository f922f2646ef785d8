"""What a reader may cut, and what is damage (docs/protocol.md §5, "What a reader may cut";
issue 30, rows 1, 2, 4 and 14): a sealed segment of another length than the next one's base
says, an invalid frame below the forced offset, garbage in the zeros after the last record.
Every reader gives the same answer on the same bytes: `qw report`, `qw status`, `qw up`'s
start-up check, `qw compact` and the file log's own reads, walks and appends."""

from __future__ import annotations

import json
import multiprocessing
import re
import shutil
import struct
import subprocess
import sys
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import msgpack
import pytest

from logstore import CorruptLogError, Durability
from logstore.file.framing import encode_frame
from logstore.file.log import FileLog
from logstore.file.segments import segment_files
from tests.helpers import log_end

QW = [sys.executable, "-m", "supervisor.cli.app"]
EXIT_REFUSED = 2
CTX = multiprocessing.get_context("fork")
SMALL = 4096


def qw(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QW, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def up(data: Path, *more: str) -> subprocess.CompletedProcess[str]:
    """`qw up` until drained; one that hangs fails the test (timeout)."""
    return qw(
        "up", "--no-tui", "--exit-when-drained", "--dir", str(data), "--workers", "2",
        "--work-ms", "0", *more, cwd=data.parent, timeout=90,
    )  # fmt: skip


def synced(log_path: Path) -> int:
    """The forced offset of a log: the SYNCED word of its shared state."""
    state = (log_path.parent / f"{log_path.name}.sync").read_bytes()
    return int(struct.unpack_from("<Q", state)[0])


def files(data: Path) -> dict[str, tuple[int, bytes]]:
    """Every log file's size and bytes, and the fold checkpoint's: to show nothing was written."""
    return {
        p.name: (p.stat().st_size, p.read_bytes())
        for p in sorted(data.iterdir())
        if p.suffix in (".log", ".seg") or p.name == "fold.checkpoint"
    }


def refused_by_every_reader(data: Path, *words: str) -> str:
    """`qw report`, `qw status` and `qw up` each refuse the logs (exit 2, the same one line
    naming each of `words`) and write nothing; `qw compact` removes nothing (refusing, where
    there are sealed segments it could remove). The line."""
    before = files(data)
    lines = set()
    for result in (
        qw("report", "--dir", str(data), cwd=data.parent),
        qw("report", "--json", "--dir", str(data), cwd=data.parent),
        qw("status", "--dir", str(data), cwd=data.parent),
        up(data),
    ):
        assert result.returncode == EXIT_REFUSED, (result.args, result.stdout, result.stderr)
        err = result.stderr.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        lines.add(err)
    assert len(lines) == 1, lines  # the same answer from every reader
    (line,) = lines
    for word in words:
        assert word in line, (word, line)
    compact = qw("compact", "--dir", str(data), "--retention", "0", cwd=data.parent)
    if len(segment_files(str(data / "claims.log"))) > 1:
        assert compact.returncode != 0 and "qw: error:" in compact.stderr, compact.stderr
    assert files(data) == before
    return line


@pytest.fixture(scope="module")
def segmented(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A drained queue whose logs hold several 4 KiB segments each: four enqueues of 200
    tasks (a segment each), then `qw up` ran them."""
    data = tmp_path_factory.mktemp("segmented") / "qw"
    result = up(data, "--segment-bytes", str(SMALL))  # (creates the logs, with the size)
    assert result.returncode == 0, result.stderr
    for _ in range(4):
        result = qw("enqueue", "--count", "200", "--dir", str(data), cwd=data.parent)
        assert result.returncode == 0, result.stderr
    result = up(data)
    assert result.returncode == 0, result.stderr
    return data


@pytest.fixture(scope="module")
def drained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A drained queue of six tasks, in one segment per log."""
    data = tmp_path_factory.mktemp("drained") / "qw"
    result = qw("enqueue", "--count", "6", "--dir", str(data), cwd=data.parent)
    assert result.returncode == 0, result.stderr
    result = up(data)
    assert result.returncode == 0, result.stderr
    return data


def copy(queue: Path, tmp_path: Path) -> Path:
    data = tmp_path / "qw"
    shutil.copytree(queue, data)
    return data


@pytest.mark.parametrize("topic", ["tasks", "claims"])
def test_a_sealed_segment_cut_short_is_refused_naming_the_file_and_both_lengths(
    segmented: Path, tmp_path: Path, topic: str
) -> None:
    data = copy(segmented, tmp_path)
    segments = segment_files(str(data / f"{topic}.log"))
    assert len(segments) >= 3
    (base, path), (after, _) = segments[1], segments[2]
    holds = Path(path).stat().st_size
    subprocess.run(["truncate", "-s", "3000", path], check=True)
    line = refused_by_every_reader(data, path, "3000 bytes", f"{holds} bytes", str(after))
    assert line == (
        f"qw: error: {path}: corrupt record at byte offset {base - 56 + 3000}: the file is "
        f"3000 bytes (to position {base - 56 + 3000}), but the next segment starts at "
        f"position {after}, so this sealed one holds {holds} bytes: a sealed segment cut "
        "short, or a segment is missing after it"
    )


def test_a_sealed_segment_grown_is_refused(segmented: Path, tmp_path: Path) -> None:
    data = copy(segmented, tmp_path)
    path = segment_files(str(data / "claims.log"))[1][1]
    holds = Path(path).stat().st_size
    subprocess.run(["truncate", "-s", f"+{SMALL}", path], check=True)
    refused_by_every_reader(data, path, f"{holds + SMALL} bytes", f"{holds} bytes", "grown")


def test_a_record_damaged_below_the_forced_offset_is_not_cut_as_a_torn_tail(
    drained: Path, tmp_path: Path
) -> None:
    data = copy(drained, tmp_path)
    claims = data / "claims.log"
    with FileLog.open(claims, read_only=True) as log:
        entries = list(log.iter_from(log.start))
    last_done = [e for e in entries if msgpack.unpackb(e.data)[1] == "D"][-1]
    forced = synced(claims)
    assert last_done.next <= forced  # it was forced to disk (a DONE is, under --fsync commit)
    raw = bytearray(claims.read_bytes())
    raw[last_done.next - 2] ^= 0x40  # one byte of its payload
    claims.write_bytes(bytes(raw))
    if entries[-1] is not last_done:
        # a CLAIM appended in the same batch (or after it) follows: damage with records
        # after it, which no reader ever took for a tail
        line = refused_by_every_reader(data, str(claims))
        assert f"corrupt record at byte offset {last_done.position}: " in line, line
        return
    line = refused_by_every_reader(data, str(claims), f"below position {forced}")
    found = re.search(r"corrupt record at byte offset (\d+): the records stop here", line)
    assert found is not None, line
    assert int(found[1]) <= last_done.position  # (the batch it ends, which would be cut)


def test_garbage_in_the_zeros_after_the_last_record_is_damage_to_every_reader(
    drained: Path, tmp_path: Path
) -> None:
    data = copy(drained, tmp_path)
    claims = data / "claims.log"
    end = log_end(claims)
    assert claims.stat().st_size > end + 4100  # zeros written ahead of the last DONE
    with open(claims, "r+b") as f:
        f.seek(end + 4000)
        f.write(b"garbage!")
    line = refused_by_every_reader(data, str(claims))
    assert line == (
        f"qw: error: {claims}: corrupt record at byte offset {end}: "
        "frame header check word mismatch"
    )


def test_the_report_says_which_segments_and_forced_offsets_it_verified(
    segmented: Path,
) -> None:
    result = qw("report", "--json", "--dir", str(segmented), cwd=segmented.parent)
    assert result.returncode == 0, result.stderr
    verified = json.loads(result.stdout)["verified"]
    for topic in ("tasks", "claims"):
        log_path = segmented / f"{topic}.log"
        wanted = [
            {"path": path, "base": base, "size": Path(path).stat().st_size}
            for base, path in segment_files(str(log_path))
        ]
        assert verified[topic] == {
            "segments": wanted,
            "end": log_end(log_path),
            "forced": synced(log_path),
        }
    text = qw("report", "--dir", str(segmented), cwd=segmented.parent)
    assert text.returncode == 0, text.stderr
    count = len(segment_files(str(segmented / "tasks.log")))
    assert (
        f"verified tasks: {count} segment files, each sealed one ({count - 1}) as long as the "
        "next one's base says; records whole to position "
        f"{log_end(segmented / 'tasks.log')}, forced to disk to position "
        f"{synced(segmented / 'tasks.log')}; after them only zeros (or a torn tail past the "
        "forced offset)"
    ) in text.stdout.replace("\n", " ")


# -- the file log's own paths -------------------------------------------------------------


def test_every_path_of_the_file_log_refuses_damage_below_the_forced_offset(
    tmp_path: Path,
) -> None:
    path = tmp_path / "claims.log"
    with FileLog.open(path) as log:
        for i in range(5):
            log.append(f"record {i}".encode(), durable=True)
        last = log.read(log.start)[-1]
        assert log.synced() == last.next
    raw = bytearray(path.read_bytes())
    raw[last.next - 1] ^= 0x01  # the last record's last byte: followed by zeros only
    path.write_bytes(bytes(raw))
    words = f"corrupt record at byte offset {last.position}: the records stop here, below"
    with FileLog.open(path, read_only=True) as reader:
        with pytest.raises(CorruptLogError, match=words):
            reader.read(last.position)
        with pytest.raises(CorruptLogError, match=words):
            reader.end()
        with pytest.raises(CorruptLogError, match=words):
            reader.check()
    with FileLog.open(path) as writer:
        with pytest.raises(CorruptLogError, match=words):
            writer.append(b"next")
        with pytest.raises(CorruptLogError, match=words):
            writer.repair()
    assert path.read_bytes() == bytes(raw)  # nothing cut, nothing written


def test_a_torn_tail_of_records_never_forced_is_still_cut(tmp_path: Path) -> None:
    """--fsync none: nothing is forced (the synced offset stays 0), so a torn tail after
    the records is cut by the next append, as before the rule."""
    path = tmp_path / "claims.log"
    with FileLog.open(path, Durability.NONE) as log:
        kept = [log.append(f"record {i}".encode(), durable=True) for i in range(3)]
        end = log.end()
        assert log.synced() == 0
    torn = bytearray(encode_frame(b"a record cut short"))
    torn[-1] ^= 0x01
    with open(path, "r+b") as f:
        f.seek(end)
        f.write(bytes(torn))
    with FileLog.open(path, Durability.NONE) as log:
        assert log.append(b"after") == end
        assert [e.position for e in log.iter_from(log.start)] == [*kept, end]


def test_a_reader_that_moves_into_a_sealed_segment_checks_its_length(tmp_path: Path) -> None:
    path = tmp_path / "tasks.log"
    with FileLog.open(path, segment_bytes=SMALL) as log:
        for i in range(200):
            log.append(f"task {i}-".encode() * 8)
    (base, second), (after, _) = segment_files(str(path))[1:3]
    with FileLog.open(path, read_only=True) as reader:
        with open(second, "r+b") as f:
            f.truncate(1000)
        with pytest.raises(CorruptLogError, match="a sealed segment cut short") as cut:
            list(reader.iter_from(reader.start))
        assert cut.value.path == second and cut.value.offset == base - 56 + 1000
        with pytest.raises(CorruptLogError, match=f"next segment starts at position {after}"):
            reader.checksum(reader.start, after)


def _append_forced(path: str, tag: int, count: int) -> None:
    with FileLog.open(path, segment_bytes=SMALL) as log:
        for i in range(count):
            if i % 5 == 4:
                log.append_many([b"%d-%d-a" % (tag, i), b"%d-%d-b" % (tag, i)], durable=True)
            else:
                log.append(b"%d-%d" % (tag, i) * 4, durable=i % 2 == 0)


def _follow(path: str, want: int, results: Queue[Any]) -> None:
    """Read (and check, and find the end) while the writers append and roll: none of it may
    take a frame being written, or a segment being sealed, for damage."""
    try:
        seen, position = 0, 0
        with FileLog.open(path, read_only=True) as log:
            position = log.start
            while seen < want:
                entries = log.read(position, 50)
                if entries:
                    seen += len(entries)
                    position = entries[-1].next
                else:
                    log.end()
                    log.check(position)
                    log.wait(position, 1.0)
        results.put(seen)
    except Exception as e:  # (reported to the test, which shows it)
        results.put(repr(e))


def test_readers_never_call_appends_in_flight_damage(tmp_path: Path) -> None:
    path = str(tmp_path / "claims.log")
    FileLog.open(path, segment_bytes=SMALL).close()
    writers, per_writer = 3, 400
    want = writers * (per_writer + per_writer // 5)  # (every fifth append is a pair)
    results: Queue[Any] = CTX.Queue()
    readers = [CTX.Process(target=_follow, args=(path, want, results)) for _ in range(2)]
    appenders = [
        CTX.Process(target=_append_forced, args=(path, tag, per_writer)) for tag in range(writers)
    ]
    for process in [*readers, *appenders]:
        process.start()
    for process in appenders:
        process.join(120)
        assert process.exitcode == 0
    assert [results.get(timeout=120) for _ in readers] == [want, want]
    for process in readers:
        process.join(60)
    with FileLog.open(path, read_only=True) as log:
        assert log.check() == log.end()
        assert len(segment_files(path)) > 5  # (it rolled, under the readers)


def test_a_flush_never_records_as_forced_an_end_in_a_segment_it_did_not_flush(
    tmp_path: Path,
) -> None:
    """The forced offset decides what may be cut, so it must never run ahead of what a
    flush covered: a handle whose record another handle's roll sealed (and forced) must
    not record the other handle's end, in the next segment, which its flush did not
    reach. (`_sync` is called as an append to be forced calls it, after its write.)"""
    path = tmp_path / "claims.log"
    with FileLog.open(path, segment_bytes=SMALL) as a, FileLog.open(path) as b:
        record = a.append(b"a record of the first segment")
        end = a.read(record, 1)[0].next
        while len(segment_files(str(path))) < 2:
            b.append(b"b" * 200)  # (not forced) b rolls, and appends in the next segment
        b.append(b"in the next segment")
        a._sync(end)
        assert a.synced() <= segment_files(str(path))[1][0]
