"""A file log's topic as a sequence of segment files: names, headers, and the listing.

A topic ``<dir>/<topic>.log`` is one or more segment files. Positions stay global byte
offsets, monotonic across segments: a segment's **base** is the position of its first
record, and the position of a record is ``base + (its file offset - header size)``. A new
segment's base is exactly where the one before it ended, so `Entry.next` of a segment's
last record is the first position of the next one.

    <topic>.log                   the first segment (base 48): the file a log always had, in
                                  format version 2 (48-byte header, `logstore.file.framing`).
                                  A single-file log of an older qw is this segment alone.
    <topic>.<base, 20 digits>.seg every later segment, in format version 3: the version-2
                                  header with the segment's base after it (56 bytes)

Segment header, version 3 (little-endian)::

    0   5 bytes  magic b"QWLOG"
    5   u8       3
    6   u16      flags (0)
    8   u32      max_record
    12  16 bytes queue id
    28  16 bytes topic name
    44  u64      base: the position of the segment's first record
    52  u32      crc32 of bytes 0..52

The identity (queue id, topic) is in every segment, and the base too: a segment copied
from another queue, another topic, or renamed to another base is refused at open with one
line naming the file (`check_segment`).

A segment is sealed once the next one exists: forced to disk whole before that one was
created, never written again, so its file ends exactly at the next one's base. A sealed
segment of another length is damage to every reader (`logstore.file.reads`, `_refuse_cut`).

Compaction removes whole segments from the front. A later segment is unlinked; the first
one (``<topic>.log``, which names the topic for everything that looks for a log) is instead
replaced, atomically, by a *stub*: its version-2 header alone with the COMPACTED flag. A
stub holds no records; the log then starts at the first segment that remains.
"""

import contextlib
import os
import re
import struct
from pathlib import Path
from typing import Final, NamedTuple
from zlib import crc32

from logstore.base import ForeignFileError
from logstore.file import framing
from logstore.identity import IdentityError, LogIdentity

SEGMENT_VERSION: Final = 3
#: the version-2 header's fields (flags included) and the base: then the crc32
_SEGMENT_BODY = struct.Struct("<5sBHI16s16sQ")
_U32 = struct.Struct("<I")
SEGMENT_HEADER_SIZE: Final = _SEGMENT_BODY.size + _U32.size  # 56
#: the first segment's header (version 2) and so its base: the first record ever
FIRST_BASE: Final = framing.FILE_HEADER_SIZE
#: flags bit 0 (in the first segment's version-2 header): a stub whose records are gone
COMPACTED: Final = 1
#: the default size at which an appender starts a new segment (Kafka's segment.bytes)
DEFAULT_SEGMENT_BYTES: Final = 32 * 1024 * 1024

_SEG_NAME = re.compile(r"^(?P<topic>.+)\.(?P<base>\d{20})\.seg$")


class SegmentHeader(NamedTuple):
    """What a segment's header says."""

    max_record: int
    queue: bytes
    topic: str
    base: int  # the position of the segment's first record
    size: int  # the header's size: file offset = position - base + size
    compacted: bool  # a stub of a compacted first segment: no records


def segment_path(log_path: str, base: int) -> str:
    """The file of the segment of the log `log_path` (``<dir>/<topic>.log``) at `base`."""
    if base == FIRST_BASE:
        return log_path
    return f"{log_path.removesuffix('.log')}.{base:020d}.seg"


def list_bases(log_path: str) -> list[int]:
    """The bases of the log's segment files, in order (the first segment's stub included)."""
    path = Path(log_path)
    prefix = path.name.removesuffix(".log")
    bases = [FIRST_BASE] if path.exists() else []
    try:
        names = os.listdir(path.parent)
    except FileNotFoundError:
        return bases
    for name in names:
        found = _SEG_NAME.match(name)
        if found is not None and found["topic"] == prefix:
            bases.append(int(found["base"]))
    return sorted(bases)


def segment_topic(name: str) -> str | None:
    """The topic of a segment file's name (``tasks.00000000000067108912.seg``), else None."""
    found = _SEG_NAME.match(name)
    return None if found is None else found["topic"]


def encode_segment_header(max_record: int, identity: LogIdentity, base: int) -> bytes:
    """The version-3 header of a segment that starts at `base`."""
    name = identity.topic.encode()
    body = _SEGMENT_BODY.pack(
        framing.MAGIC, SEGMENT_VERSION, 0, max_record, identity.queue, name, base
    )
    return body + _U32.pack(crc32(body))


def encode_stub(max_record: int, identity: LogIdentity) -> bytes:
    """The header of a compacted first segment: version 2 with the COMPACTED flag."""
    name = identity.topic.encode()
    body = framing.FILE_HEADER_BODY.pack(
        framing.MAGIC, framing.VERSION, COMPACTED, max_record, identity.queue, name
    )
    return body + _U32.pack(crc32(body))


def decode_segment_header(raw: bytes, path: str) -> SegmentHeader:
    """A segment's header, of either version; ForeignFileError when it is not one."""
    if len(raw) >= 6 and raw[:5] == framing.MAGIC and raw[5] == SEGMENT_VERSION:
        if len(raw) < SEGMENT_HEADER_SIZE:
            raise ForeignFileError(f"{path}: a segment header cut short ({len(raw)} bytes)")
        body = raw[: _SEGMENT_BODY.size]
        (crc,) = _U32.unpack_from(raw, _SEGMENT_BODY.size)
        if crc != crc32(body):
            raise ForeignFileError(f"{path} is not a qw log: its header checksum does not match")
        _magic, _version, _flags, max_record, queue, name, base = _SEGMENT_BODY.unpack(body)
        try:
            topic = name.rstrip(b"\0").decode()
        except UnicodeDecodeError:
            raise ForeignFileError(f"{path} is not a qw log: its topic name is not UTF-8") from None
        return SegmentHeader(max_record, bytes(queue), topic, base, SEGMENT_HEADER_SIZE, False)
    header = framing.decode_file_header(raw[: framing.FILE_HEADER_SIZE], path)
    (flags,) = struct.unpack_from("<H", raw, 6)
    return SegmentHeader(
        header.max_record,
        header.queue,
        header.topic,
        FIRST_BASE,
        framing.FILE_HEADER_SIZE,
        bool(flags & COMPACTED),
    )


def read_segment_header(fd: int, path: str) -> SegmentHeader:
    return decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0), path)


def check_segment(header: SegmentHeader, path: str, base: int, identity: LogIdentity) -> None:
    """Refuse (one line naming the file) a segment that is not the one its name promises:
    another base (renamed or misplaced), another topic, another queue."""
    if header.base != base:
        raise IdentityError(
            f"{path} holds the segment at base {header.base}, not at {base}: "
            "a segment renamed or misplaced"
        )
    if header.topic != identity.topic or header.queue != identity.queue:
        raise IdentityError(
            f"{path} is a segment of {header.queue.hex()}/{header.topic}, not of "
            f"{identity.queue_hex}/{identity.topic}: a segment of another log"
        )


def segment_files(log_path: str) -> list[tuple[int, str]]:
    """(base, path) of each segment file of the log, in order."""
    return [(base, segment_path(log_path, base)) for base in list_bases(log_path)]


def drop_segment(log_path: str, base: int, identity: LogIdentity, max_record: int) -> None:
    """Remove the (sealed) segment at `base`: unlink it, or for the first segment replace it
    by its stub, atomically (a reader sees the whole segment or none of it; one that has it
    open reads on in the old file). Idempotent: a drop killed half way is done again."""
    path = segment_path(log_path, base)
    if base == FIRST_BASE:
        tmp = f"{path}.{os.getpid()}.stub.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        try:
            os.write(fd, encode_stub(max_record, identity))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    sync_directory(str(Path(path).parent))


def sync_directory(directory: str) -> None:
    """fsync a directory: a file created, renamed or removed in it survives a power cut."""
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
