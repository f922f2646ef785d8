"""The byte format of a file log, and pure functions to encode and decode it (no I/O).

Layout of a log file (all integers little-endian)::

    file header, 16 bytes
        0   5 bytes  magic b"QWLOG"
        5   u8       format version (1)
        6   u16      flags (0; reserved)
        8   u32      max_record: the largest payload a frame of this file may carry
        12  u32      crc32 of bytes 0..12
    then frames, back to back, each:
        0   u32      word: bits 0..30 payload length, bit 31 CONTINUED
        4   u32      check: word XOR 0xFFFFFFFF
        8   u32      crc32 of the payload, started from `word` instead of 0
        12  payload  `length` bytes, opaque

A record's position is the byte offset of its frame; the first record is at offset 16.
CONTINUED marks a frame whose batch goes on in the next frame: `append_many` writes its
records as one batch, and a reader returns a batch only once every frame of it is whole and
valid, so a writer killed in the middle of a batch leaves nothing of it visible.

The check word makes a damaged length detectable before its payload is read, and makes an
all-zero header (a hole left by a power cut) invalid, so that an empty record is allowed.
Seeding the crc with `word` makes it cover the length and flag too, at no extra cost.

Worked example: a log created with max_record = 16 MiB holding one record b"hi"::

    51 57 4c 4f 47 01 00 00 00 00 00 01 85 c3 0b fa     "QWLOG", v1, flags 0, 0x01000000, crc
    02 00 00 00 fd ff ff ff 2e 48 a5 ea 68 69           length 2, check, crc32(b"hi", 2), "hi"

The record's position is 16, the next one starts at 16 + 12 + 2 = 30.

Decoding rules (`decode_frames`), for a buffer that starts at a frame boundary:

- A complete, valid frame (batch) is returned.
- An incomplete frame or batch at the end of the buffer: NEED_DATA (read more from
  `consumed`); when the buffer reaches the end of the file it is a TORN_TAIL instead.
- An invalid frame (bad check word, length over max_record, or payload checksum mismatch)
  that ends exactly at the end of the file, or is followed only by zero bytes to the end of
  the file: TORN_TAIL. This is what a writer killed mid-append, or a power cut, leaves.
- An invalid frame followed by any non-zero byte: corruption. `CorruptLogError` names the
  frame's byte offset. Records before it are returned first (stop DAMAGED); decoding again
  from `consumed` raises.

NEED_DATA and TORN_TAIL both mean "no more complete records here yet" to a reader; a writer
holding the append lock truncates a TORN_TAIL before it appends.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Sequence
from typing import NamedTuple

from logstore.base import CorruptLogError, Entry, ForeignFileError

Buffer = bytes | bytearray | memoryview

MAGIC = b"QWLOG"
VERSION = 1
#: magic, version, flags, max_record — followed by the crc32 of these 12 bytes
FILE_HEADER_BODY = struct.Struct("<5sBHI")
_U32 = struct.Struct("<I")
FILE_HEADER_SIZE = FILE_HEADER_BODY.size + _U32.size  # 16

#: word (length | CONTINUED), check (word XOR ALL_ONES), crc32(payload, word)
FRAME_HEADER = struct.Struct("<III")
FRAME_HEADER_SIZE = FRAME_HEADER.size  # 12
CONTINUED = 0x8000_0000
LENGTH_MASK = 0x7FFF_FFFF
ALL_ONES = 0xFFFF_FFFF

MAX_RECORD = 16 * 1024 * 1024
MAX_RECORD_LIMIT = LENGTH_MASK  # what the length field can hold

_crc32 = zlib.crc32


class Stop(enum.Enum):
    """Why `decode_frames` stopped."""

    CLEAN = "clean"  # at a frame boundary: the buffer ended, or `limit` records were returned
    NEED_DATA = "need_data"  # an incomplete or undecidable frame at `consumed`: read more
    TORN_TAIL = "torn_tail"  # from `consumed` to the end of the file is a torn tail
    DAMAGED = "damaged"  # corruption follows `consumed`; decoding from there raises


class Decoded(NamedTuple):
    """The answer of `decode_frames`. Offsets are relative to the start of the buffer."""

    entries: list[Entry]
    #: where the next decode starts: just after the last returned record
    consumed: int
    #: the end of the last complete, valid batch (>= consumed; larger when `limit` cut a batch)
    verified: int
    stop: Stop
    #: with NEED_DATA: how many bytes from `consumed` are needed to decide; 0 = read to the end
    needed: int


# -- the file header -------------------------------------------------------------------------


def encode_file_header(max_record: int = MAX_RECORD) -> bytes:
    if not 0 <= max_record <= MAX_RECORD_LIMIT:
        raise ValueError(f"max_record {max_record} is out of range 0..{MAX_RECORD_LIMIT}")
    body = FILE_HEADER_BODY.pack(MAGIC, VERSION, 0, max_record)
    return body + _U32.pack(_crc32(body))


def decode_file_header(raw: bytes, path: str) -> int:
    """Check a file header and return the file's max_record; ForeignFileError if it is not ours."""
    if len(raw) < FILE_HEADER_SIZE:
        raise ForeignFileError(
            f"{path} is not a qw log: {len(raw)} bytes is shorter than the "
            f"{FILE_HEADER_SIZE}-byte header"
        )
    body = raw[: FILE_HEADER_BODY.size]
    magic, version, _flags, max_record = FILE_HEADER_BODY.unpack(body)
    if magic != MAGIC:
        raise ForeignFileError(f"{path} is not a qw log: it starts with {magic!r}, not {MAGIC!r}")
    (crc,) = _U32.unpack_from(raw, FILE_HEADER_BODY.size)
    if crc != _crc32(body):
        raise ForeignFileError(f"{path} is not a qw log: its header checksum does not match")
    if version != VERSION:
        raise ForeignFileError(
            f"{path}: qw log format version {version}; this code reads {VERSION}"
        )
    return int(max_record)


# -- encoding --------------------------------------------------------------------------------


def frame_header(data: Buffer, continued: bool = False) -> bytes:
    """The 12-byte header of the frame carrying `data`."""
    word = len(data) | (CONTINUED if continued else 0)
    return FRAME_HEADER.pack(word, word ^ ALL_ONES, _crc32(data, word))


def encode_frame(data: Buffer, continued: bool = False) -> bytes:
    """One frame: header + payload."""
    return frame_header(data, continued) + bytes(data)


def encode_batch(records: Sequence[Buffer]) -> bytes:
    """Frames for `records` as one batch: every frame but the last is marked CONTINUED."""
    last = len(records) - 1
    parts: list[Buffer] = []
    for i, data in enumerate(records):
        parts.append(frame_header(data, continued=i < last))
        parts.append(data)
    return b"".join(parts)


def peek_frame(header: Buffer, max_record: int) -> tuple[int, bool] | None:
    """(frame size, continued) from a frame header alone, or None when the header is invalid.

    For hopping over frames without reading their payloads; it checks no payload checksum.
    """
    if len(header) < FRAME_HEADER_SIZE:
        return None
    word, check, _crc = FRAME_HEADER.unpack_from(header)
    length = word & LENGTH_MASK
    if word ^ check != ALL_ONES or length > max_record:
        return None
    return FRAME_HEADER_SIZE + length, bool(word & CONTINUED)


class Walk(NamedTuple):
    """Where a walk over frame headers got to (absolute file offsets)."""

    #: where the walk stopped: the end of the file, or a frame that is incomplete or invalid
    end: int
    #: the start of the batch still open at `end` (== `end` when no batch is open)
    open_batch: int
    #: the start of the last complete batch before `open_batch` (or where the walk began)
    last_batch: int


def walk_frames(buf: Buffer, base: int, max_record: int, open_batch: int, last_batch: int) -> Walk:
    """Walk frame headers in `buf` (file offset `base`) while whole, valid-looking frames fit.

    No payload checksum is checked: this is how a writer skips over the frames other writers
    appended. `open_batch` and `last_batch` carry the state of a walk that began before
    `base` (pass `base` for both to start fresh at a batch boundary).
    """
    view = memoryview(buf)
    size = len(view)
    unpack = FRAME_HEADER.unpack_from
    pos = 0
    while size - pos >= FRAME_HEADER_SIZE:
        word, check, _crc = unpack(view, pos)
        length = word & LENGTH_MASK
        end = pos + FRAME_HEADER_SIZE + length
        if word ^ check != ALL_ONES or length > max_record or end > size:
            break
        pos = end
        if not word & CONTINUED:
            last_batch, open_batch = open_batch, base + pos
    return Walk(base + pos, open_batch, last_batch)


# -- decoding --------------------------------------------------------------------------------


def decode_frames(
    buf: Buffer,
    base: int,
    *,
    at_eof: bool,
    max_record: int,
    path: str,
    limit: int | None = None,
) -> Decoded:
    """Decode the frames in `buf`, which starts at file offset `base` on a frame boundary.

    `at_eof` says the buffer ends where the file ends (so an incomplete tail is torn rather
    than unread). Returns at most `limit` entries. Raises `CorruptLogError` (with `path` and
    the absolute offset) when the damage is at the first frame or batch of the buffer.
    """
    return _decode(buf, base, at_eof, max_record, path, limit, collect=True)


def scan_frames(buf: Buffer, base: int, *, at_eof: bool, max_record: int, path: str) -> Decoded:
    """Verify the frames in `buf` like `decode_frames` but build no entries (for writers).

    Raises `CorruptLogError` at any damage, however far into the buffer.
    """
    return _decode(buf, base, at_eof, max_record, path, None, collect=False)


def _all_zero(view: memoryview) -> bool:
    raw = view.tobytes()
    return raw.count(0) == len(raw)


def _decode(
    buf: Buffer,
    base: int,
    at_eof: bool,
    max_record: int,
    path: str,
    limit: int | None,
    collect: bool,
) -> Decoded:
    if limit is not None and limit <= 0:
        return Decoded([], 0, 0, Stop.CLEAN, 0)
    view = memoryview(buf)
    size = len(view)
    unpack = FRAME_HEADER.unpack_from
    hsize = FRAME_HEADER_SIZE
    entries: list[Entry] = []
    batch: list[tuple[int, int]] = []  # (start, end) of the frames of the open batch
    batch_start = 0  # the first frame of the open batch (== pos when no batch is open)
    pos = 0
    # The loop returns at a clean stop; otherwise it breaks out with `needed` set (the open
    # batch is incomplete) or with `bad` set (an invalid frame at `bad`, its bytes to `after`).
    needed = after = 0
    bad = -1
    reason = ""
    while True:
        if size - pos < hsize:
            if pos == size and not batch:
                return Decoded(entries, pos, pos, Stop.CLEAN, 0)
            needed = pos + hsize - batch_start
            break
        word, check, crc = unpack(view, pos)
        length = word & LENGTH_MASK
        end = pos + hsize + length
        if word ^ check != ALL_ONES:
            bad, after, reason = pos, pos + hsize, "frame header check word mismatch"
            break
        if length > max_record:
            bad, after = pos, pos + hsize
            reason = f"frame length {length} exceeds max {max_record}"
            break
        if end > size:
            needed = end - batch_start
            break
        if _crc32(view[pos + hsize : end], word) != crc:
            bad, after, reason = pos, end, "payload checksum mismatch"
            break
        if word & CONTINUED:
            batch.append((pos, end))
            pos = end
            continue
        if not collect:
            batch.clear()
        elif not batch:  # the common case: a batch of one
            entries.append(Entry(base + pos, base + end, view[pos + hsize : end].tobytes()))
            if limit is not None and len(entries) >= limit:
                return Decoded(entries, end, end, Stop.CLEAN, 0)
        else:
            batch.append((pos, end))
            for start, stop in batch:
                data = view[start + hsize : stop].tobytes()
                entries.append(Entry(base + start, base + stop, data))
                if limit is not None and len(entries) >= limit:
                    return Decoded(entries, stop, end, Stop.CLEAN, 0)
            batch.clear()
        pos = batch_start = end

    if bad >= 0:
        # Torn if nothing but zero bytes follows the invalid frame to the end of the file.
        rest = view[after:]
        if not _all_zero(rest):
            if entries:  # return the good records first; the next decode from here raises
                return Decoded(entries, batch_start, batch_start, Stop.DAMAGED, 0)
            raise CorruptLogError(path, base + bad, reason)
        # Whether non-zero data follows is beyond this buffer: need one more byte, or (when
        # zeros fill the rest of the buffer) everything to the end of the file.
        needed = 0 if len(rest) else after - batch_start + 1
    # Nothing from batch_start on is returned: it is incomplete, or torn.
    if at_eof:
        return Decoded(entries, batch_start, batch_start, Stop.TORN_TAIL, 0)
    return Decoded(entries, batch_start, batch_start, Stop.NEED_DATA, needed)
