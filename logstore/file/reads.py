"""How a file log's handle reads its frames: the read loops of `FileLog` (`_read`,
`_read_span`, `_vouch`), the walks that find where the valid frames end (`_find_end`,
`_verify`), and the rule every one of them applies where a segment's records stop
(`_refuse_cut`), as a base class of `logstore.file.log.FileLog`, which keeps the
descriptors, the segments, the appends and the waits. The rules they follow (what a reader
returns, when it stops, how far it trusts what it verified) are in `logstore.file.log`'s
docstring; the byte format and the decoding rules in `logstore.file.framing`; what may be cut
and what is damage in docs/protocol.md §5 ("What a reader may cut").
"""

from __future__ import annotations

import mmap
import os
import sys
from typing import Any

from logstore.base import CorruptLogError, Entry, SpanLoop, SpanRead
from logstore.file import framing
from logstore.file.framing import FRAME_HEADER_SIZE, Stop
from logstore.file.segments import list_bases, segment_path
from logstore.file.shared_state import ACTIVE_WORD, COMMITTED_WORD, LOAD, SYNCED

#: a reader's pread size (a frame larger than this is read whole, in a buffer of its own)
READ_CHUNK = 256 * 1024
#: a read that goes on past its first buffer (a long gap, a long batch) reads this much at a
#: time: fewer, larger preads
BIG_READ = 1024 * 1024
#: a read for a few records reads no less than this...
MIN_READ = 4 * 1024
#: ...and guesses this many bytes a record (a longer record costs one more pread)
RECORD_GUESS = 64
#: gaps larger than this are walked header by header instead of read whole
SCAN_CHUNK = 64 * 1024

#: `max_records=None` as the decoding loop's limit (framing's own)
_NO_LIMIT = sys.maxsize
ZERO_HEADER = bytes(FRAME_HEADER_SIZE)
#: "no next segment known": beyond every position
NO_SEGMENT = 1 << 62


def _pread(fd: int, pos: int, want: int, buf: memoryview) -> memoryview:
    """Up to `want` bytes at `pos`, into `buf` when they fit (no allocation) or a new buffer."""
    if want <= len(buf):
        return buf[: os.preadv(fd, [buf[:want]], pos)]
    return memoryview(os.pread(fd, want, pos))


def _read_on(max_records: int | None, count: int, span: int) -> int:
    """The size of the next read of a call that has read `count` records in `span` bytes.

    A read that goes on past its first buffer is reading a long gap: BIG_READ at a time,
    unless only a few more records are wanted, as large as the records so far suggest.
    """
    if max_records is None:
        return BIG_READ
    per_record = span // count if count else RECORD_GUESS
    return min(BIG_READ, max(MIN_READ, (max_records - count) * per_record))


class FileReads:
    """The reading half of `FileLog` (see the module docstring). It holds no state of its
    own: these are the handle's attributes it reads and moves."""

    name: str
    path: str  # the first segment's file (``<topic>.log``): the others are named after it
    _file_max: int  # the file's max_record, which decoding enforces
    _rfd: int  # the descriptor of the segment being read...
    _rbase: int  # ...its base...
    _rdelta: int  # ...position - file offset in it...
    _rnext: int  # ...and the next segment's base (NO_SEGMENT: none known yet)
    _seen: int  # how far this handle has verified whole batches of that segment
    _stall: tuple[int, int, int]  # (position, file size, COMMITTED) of an incomplete tail
    _walked: bool  # whether `_find_end` has verified the file's last batch once
    _state: mmap.mmap  # the shared state (`logstore.file.shared_state`)...
    _words: memoryview  # ...as words
    _pending_word: int  # which of them is PENDING (COMMITTED in an older state file)

    def _refuse_cut(self, base: int, delta: int, end: int, size: int, after: int) -> None:
        """Raise CorruptLogError unless the segment at `base` may end its whole, valid
        records at position `end` while its file ends at `size` (file offset = position -
        `delta`; `after`: the next segment's base, NO_SEGMENT for the active segment, see
        `_after`). This is the rule of what a reader may take for the end of a segment's
        records, and so of what a writer may cut after them (protocol §5, "What a reader
        may cut"); every path that stops where a segment's records stop asks it: the reads,
        the end walks and the writers' settling, the checks and the checksums.

        A sealed segment was forced to disk whole before the next one began and is never
        written again: its file ends exactly at the next one's base, and its records reach
        it. Of the active one, every byte below the forced offset (``SYNCED``, stored once
        a flush of them returned; nothing of qw writes or cuts there again) is records:
        only what lies past it may be a torn tail. A reader that met this while writers
        were at work decides again with them held off (`FileLog.read`), as for any damage.
        """
        path = segment_path(self.path, base)
        if after != NO_SEGMENT:
            if size != after:
                lengths = (
                    f"the file is {size - delta} bytes (to position {size}), but the next "
                    f"segment starts at position {after}, so this sealed one holds "
                    f"{after - delta} bytes"
                )
                what = "cut short, or a segment is missing after it" if size < after else "grown"
                raise CorruptLogError(path, min(size, after), f"{lengths}: a sealed segment {what}")
            if end < after:
                raise CorruptLogError(
                    path, end, "the records stop here, inside a sealed segment (forced to "
                    "disk whole when the next one began): damage, not a torn tail",
                )  # fmt: skip
            return
        forced = LOAD(self._state, SYNCED)[0]
        if end < forced:
            raise CorruptLogError(
                path, end, f"the records stop here, below position {forced} that "
                f"{self.path}.sync records as forced to disk: damage, not a torn tail",
            )  # fmt: skip

    def _after(self, base: int, size: int) -> int:
        """The `after` of `_refuse_cut` for the segment at `base`, whose file ends at `size`:
        NO_SEGMENT while it is the active one; once sealed, the next segment's base, or
        `size` while the next file is not there yet (its roller, killed, left it to the
        next appender: the records are then judged, not the length)."""
        word = int(self._words[ACTIVE_WORD]) if len(self._words) > ACTIVE_WORD else 0
        if word == base:
            return NO_SEGMENT
        if base == self._rbase and self._rnext != NO_SEGMENT:
            return self._rnext
        later = min((b for b in list_bases(self.path) if b > base), default=NO_SEGMENT)
        if later == NO_SEGMENT and word > base:
            return size
        return later

    def _find_end(
        self, fd: int, start: int, size: int, buf: memoryview, delta: int
    ) -> tuple[int, Stop]:
        """The end of the valid frames between positions `start` (a batch boundary) and
        `size` of the segment open as `fd` (file offset = position - `delta`).

        Returns (end, CLEAN) or (end, TORN_TAIL). Only the end of the file can be torn: each
        writer checked the end before it wrote whole frames after it. So frame headers are
        walked (payloads unread) and only the last complete batch and what follows it are
        verified in full — when the walk stops short of `size` or inside a batch (a writer
        was killed mid-append), and on this handle's first walk. A whole frame with a bad
        payload at the end is what a power cut leaves; it can only predate this handle (a
        power cut ends every process), so after the first walk a clean walk is trusted.
        """
        pos = open_batch = last_batch = start
        chunk = len(buf)
        while size - pos > chunk:  # far from the end: walk a chunk at a time
            view = _pread(fd, pos - delta, chunk, buf)
            walked, open_batch, last_batch = framing.walk_frames(
                view, pos, self._file_max, open_batch, last_batch
            )
            if walked > pos:
                pos = walked
                continue
            # not one whole frame in a chunk: a large one, hopped over by its header
            peek = framing.peek_frame(view, self._file_max)
            if peek is None or pos + peek[0] > size:
                break
            pos += peek[0]
            if not peek[1]:
                last_batch, open_batch = open_batch, pos
        if size - pos <= chunk:  # near the end: one read, walked in memory
            view = _pread(fd, pos - delta, size - pos, buf)
            walk = framing.walk_frames(view, pos, self._file_max, open_batch, last_batch)
            if walk.end == walk.open_batch == size and self._walked:
                return size, Stop.CLEAN
            last_batch = walk.last_batch
            if last_batch >= pos:  # what needs verifying is in the buffer already
                found = framing.scan_frames(
                    view[last_batch - pos :],
                    last_batch,
                    at_eof=True,
                    max_record=self._file_max,
                    path=self.name,
                )
                self._walked = True
                return last_batch + found.consumed, found.stop
        verified = self._verify(fd, last_batch, size, buf, delta)
        self._walked = True
        return verified

    def _verify(
        self, fd: int, start: int, size: int, buf: memoryview, delta: int
    ) -> tuple[int, Stop]:
        """Check every frame (payload checksums too) from `start` to `size` (positions of
        the segment open as `fd`: file offset = position - `delta`)."""
        pos = start
        needed = 0
        while True:
            want = min(size - pos, max(len(buf), needed))
            view = _pread(fd, pos - delta, want, buf)
            at_eof = len(view) < want or pos + len(view) >= size
            found = framing.scan_frames(
                view, pos, at_eof=at_eof, max_record=self._file_max, path=self.name
            )
            pos += found.consumed
            if found.stop is Stop.NEED_DATA:
                needed = found.needed or size - pos
                if not found.consumed:
                    needed = max(needed, want * 2)
                continue
            if at_eof or found.stop is Stop.TORN_TAIL:
                return pos, found.stop
            needed = 0

    def _read(self, position: int, max_records: int | None) -> list[Entry]:
        fd = self._rfd
        delta = self._rdelta
        entries: list[Entry] = []
        pos = position
        if max_records is None:
            want = READ_CHUNK
        else:  # read(pos, 1) must not copy 256 KiB: size the first read for what is asked
            # (min(READ_CHUNK, max(MIN_READ, …)) without min and max: each parses its
            # arguments as keywords, ~1.3k instructions a call, and every read pays this)
            want = max_records * RECORD_GUESS
            if want > READ_CHUNK:
                want = READ_CHUNK
            elif want < MIN_READ:
                want = MIN_READ
        # Past PENDING (the end of the last append begun) there are only zeros written ahead,
        # if anything: a reader near the end reads a few KiB of them, not a whole buffer.
        words = self._words
        committed = words[COMMITTED_WORD]  # before any read: see the stall below
        room = words[self._pending_word] - pos + FRAME_HEADER_SIZE
        if room < want:
            want = room if room > MIN_READ else MIN_READ
        vouch = True  # whether a batch longer than the buffer may still be verified ahead
        while True:
            # A fresh bytes object rather than a reused bytearray: decoding slices each
            # Entry.data straight out of bytes (a bytearray would be copied to bytes first).
            buf = os.pread(fd, want, pos - delta)
            size = len(buf)
            at_eof = size < want
            if at_eof and pos + size < self._seen:
                # Shorter than what this handle verified: cut by something outside this
                # protocol (which never cuts a complete batch). Vouch for nothing any more.
                self._seen = self._rbase
            if not size:  # nothing past `pos` (a caught-up reader's usual read): done
                return entries
            # The usual reads: whole batches up to the buffer's end, or `max_records` reached.
            # `decode_frames` answers them with its loop's result as it is; the loop is
            # called here directly, without that call's keywords and its Decoded (~a
            # quarter of a small read's instructions). Anything else (a torn or open tail,
            # damage) is decided by `decode_frames`, which decodes the buffer again.
            limit = _NO_LIMIT if max_records is None else max_records - len(entries)
            got, end, batch_start, ready = framing._entries_loop(
                buf, self._file_max, self._seen - pos, limit, pos, Entry
            )
            if ready >= limit:  # (a batch verified in full may go on past the limit)
                del got[limit:]
                entries += got
                if pos + batch_start > self._seen:
                    self._seen = pos + batch_start
                return entries
            if (
                end == batch_start
                and end < size
                and not buf[end]
                and buf[end : end + FRAME_HEADER_SIZE] == ZERO_HEADER
                and pos + end >= committed > 0
                and self._rnext == NO_SEGMENT
            ):
                # Whole batches, then zeros where no append has completed: the end for now
                # (zeros written ahead, or an append still being written). Not in a segment
                # known sealed, which has no zeros ahead: decoding decides there.
                entries += got
                pos += end
                if pos > self._seen:
                    self._seen = pos
                return entries
            if end == batch_start and (end == size or (end and not at_eof)):
                # Whole batches to the buffer's end; or to a frame the buffer cuts short,
                # which the next read starts with (a long log's reads: decoded again by
                # `decode_frames`, every buffer cost twice as much)
                if entries:
                    entries += got
                else:
                    entries = got
                pos += end
                if pos > self._seen:
                    self._seen = pos
                if at_eof:
                    return entries
                want = _read_on(max_records, len(entries), pos - position)
                continue
            if not batch_start and end and not at_eof and vouch and pos >= self._seen:
                # Frames of one batch that goes on past the buffer (a producer's enqueue of
                # thousands): verified in full and read again, as below, without
                # `decode_frames` decoding the buffer a second time first to learn it
                if self._vouch(pos, 2 * want):
                    continue
                vouch = False
            found = framing.decode_frames(
                buf,
                pos,
                at_eof=at_eof,
                max_record=self._file_max,
                path=self.name,
                limit=None if max_records is None else max_records - len(entries),
                verified=self._seen - pos,  # frames before it are not verified again
            )
            if found.entries:
                entries += found.entries
            if pos + found.verified > self._seen:
                self._seen = pos + found.verified
            stop = found.stop
            if stop is Stop.CLEAN:
                pos += found.consumed
                if at_eof or (max_records is not None and len(entries) >= max_records):
                    return entries
                want = _read_on(max_records, len(entries), pos - position)
            elif stop is Stop.NEED_DATA:
                pos += found.consumed
                if not found.needed:  # only zero bytes to the end of the buffer: read it all
                    want = os.lseek(fd, 0, os.SEEK_END) + delta - pos + 1
                elif found.consumed:  # read on from the open frame or batch
                    want = max(found.needed, _read_on(max_records, len(entries), pos - position))
                elif pos < self._seen:  # a verified frame longer than the buffer: read it
                    want = max(found.needed, want)
                elif vouch and self._vouch(pos, 2 * want):
                    pass  # the batch at pos is verified: its frames come from any buffer now
                else:
                    # A batch not complete yet (being written, or torn) or damaged: decoding
                    # decides with all of it in hand. (Doubling: a long batch must not be
                    # re-read one frame longer each time.)
                    vouch = False
                    want = max(found.needed, want * 2)
            elif stop is Stop.TORN_TAIL:
                # Nothing more yet. Remember what we saw, so that wait() sleeps until it changes.
                # (The committed end as it was before the reads: one stored since, by an
                # append that completed after our read, must end the stall, not be part of it.)
                # Unless it cannot be a torn tail (then the next read from there raises)
                torn, eof = pos + found.consumed, pos + len(buf)
                self._stall = (torn, eof, committed)
                if not entries:
                    self._refuse_cut(self._rbase, delta, torn, eof, self._after(self._rbase, eof))
                return entries
            else:  # DAMAGED: return the good records; the next read from here raises
                return entries

    def _read_span(self, position: int, max_records: int, loop: SpanLoop) -> SpanRead:
        """Read and decode frames from `position` in the current segment, each payload made
        into an item by `loop` (`framing.decode_span`).

        This is `_read`'s loop, step for step, for span reads. `_read` keeps its own copy: a
        drain's reads are small and many, and going through a loop shared with this one
        (its closures, its calls) cost them 7.8 → 10.1 µs a `read(position, 2)`, measured.
        tests/test_claims_span.py holds the two to the same records, positions, stopping
        points and errors on torn, damaged and segmented files."""
        items: list[Any] = []
        positions: list[int] = []
        max_record, name = self._file_max, self.name
        fd = self._rfd
        delta = self._rdelta
        kept = 0
        pos = position
        # read(pos, 1) must not copy 256 KiB: size the first read for what is asked (without
        # min and max, as in `_read`)
        want = max_records * RECORD_GUESS
        if want > READ_CHUNK:
            want = READ_CHUNK
        elif want < MIN_READ:
            want = MIN_READ
        words = self._words
        committed = words[COMMITTED_WORD]  # (as in `_read`)
        room = words[self._pending_word] - pos + FRAME_HEADER_SIZE
        if room < want:
            want = room if room > MIN_READ else MIN_READ
        vouch = True  # whether a batch longer than the buffer may still be verified ahead
        while True:
            # A fresh bytes object rather than a reused bytearray: decoding slices each
            # Entry.data straight out of bytes (a bytearray would be copied to bytes first).
            buf = os.pread(fd, want, pos - delta)
            at_eof = len(buf) < want
            if at_eof and pos + len(buf) < self._seen:
                # Shorter than what this handle verified: cut by something outside this
                # protocol (which never cuts a complete batch). Vouch for nothing any more.
                self._seen = self._rbase
            if not buf:  # nothing past `pos` (a caught-up reader's usual read): done
                return SpanRead(items, positions, pos)
            # `_read`'s usual reads, answered as there without `decode_span`'s call and Span
            limit = max_records - kept
            got, at, end, batch_start, ready = loop(buf, max_record, self._seen - pos, limit, pos)
            if ready >= limit:  # (a batch verified in full may go on past the limit)
                consumed = at[limit] - pos if limit < ready else batch_start
                del got[limit:], at[limit:]
                items += got
                positions += at
                if pos + batch_start > self._seen:
                    self._seen = pos + batch_start
                return SpanRead(items, positions, pos + consumed)
            if (
                end == batch_start
                and end < len(buf)
                and not buf[end]
                and buf[end : end + FRAME_HEADER_SIZE] == ZERO_HEADER
                and pos + end >= committed > 0
                and self._rnext == NO_SEGMENT
            ):  # (as in `_read`: zeros where no append has completed, the end for now)
                items += got
                positions += at
                pos += end
                if pos > self._seen:
                    self._seen = pos
                return SpanRead(items, positions, pos)
            if end == batch_start and (end == len(buf) or (end and not at_eof)):
                # (as in `_read`: whole batches to the buffer's end or to a frame it cuts)
                if items:
                    items += got
                    positions += at
                else:
                    items, positions = got, at
                kept = len(items)
                pos += end
                if pos > self._seen:
                    self._seen = pos
                if at_eof:
                    return SpanRead(items, positions, pos)
                want = _read_on(max_records, kept, pos - position)
                continue
            if not batch_start and end and not at_eof and vouch and pos >= self._seen:
                if self._vouch(pos, 2 * want):  # (as in `_read`: a batch longer than a buffer)
                    continue
                vouch = False
            found = framing.decode_span(
                buf, pos, loop, at_eof=at_eof, max_record=max_record, path=name,
                limit=max_records - kept,
                verified=self._seen - pos,  # frames before it are not verified again
            )  # fmt: skip
            if found.items:
                items.extend(found.items)
                positions.extend(found.positions)
            kept = len(items)
            if pos + found.verified > self._seen:
                self._seen = pos + found.verified
            stop = found.stop
            if stop is Stop.CLEAN:
                pos += found.consumed
                if at_eof or kept >= max_records:
                    return SpanRead(items, positions, pos)
                want = _read_on(max_records, kept, pos - position)
            elif stop is Stop.NEED_DATA:
                pos += found.consumed
                if not found.needed:  # only zero bytes to the end of the buffer: read it all
                    want = os.lseek(fd, 0, os.SEEK_END) + delta - pos + 1
                elif found.consumed:  # read on from the open frame or batch
                    want = max(found.needed, _read_on(max_records, kept, pos - position))
                elif pos < self._seen:  # a verified frame longer than the buffer: read it
                    want = max(found.needed, want)
                elif vouch and self._vouch(pos, 2 * want):
                    pass  # the batch at pos is verified: its frames come from any buffer now
                else:
                    # A batch not complete yet (being written, or torn) or damaged: decoding
                    # decides with all of it in hand. (Doubling: a long batch must not be
                    # re-read one frame longer each time.)
                    vouch = False
                    want = max(found.needed, want * 2)
            elif stop is Stop.TORN_TAIL:
                # Nothing more yet. Remember what we saw, so that wait() sleeps until it changes.
                # (The committed end as it was before the reads: one stored since, by an
                # append that completed after our read, must end the stall, not be part of it.)
                # Unless it cannot be a torn tail (then the next read from there raises)
                torn, eof = pos + found.consumed, pos + len(buf)
                self._stall = (torn, eof, committed)
                if not items:
                    self._refuse_cut(self._rbase, delta, torn, eof, self._after(self._rbase, eof))
                return SpanRead(items, positions, torn)
            else:  # DAMAGED: return the good records; the next read from here raises
                return SpanRead(items, positions, pos + found.consumed)

    def _vouch(self, start: int, chunk: int) -> bool:
        """Verify the batch at `start` (not verified yet, longer than the read buffer) in full.

        Every frame's checksum is checked, a buffer at a time with the batch carried across
        buffers, so memory stays bounded however long the batch. The buffers start at
        `chunk` bytes and double up to BIG_READ: verifying ahead of the batch (whatever else
        is in the last buffer) costs at most about as much as the batch itself. On success
        `_seen` moves past the batch (and the whole batches after it in the last buffer),
        and reads return its frames without verifying it again. False when the batch is not
        whole and valid: still being written, torn, or damaged; decoding decides which.
        """
        fd = self._rfd
        delta = self._rdelta
        max_record = self._file_max
        pos = open_batch = last_batch = start
        while True:
            chunk = min(chunk, BIG_READ)
            buf = os.pread(fd, chunk, pos - delta)
            chunk *= 2
            walk = framing.walk_frames(buf, pos, max_record, open_batch, last_batch, check=True)
            if walk.end == pos:  # not one whole, valid frame in the buffer
                peek = framing.peek_frame(buf, max_record)
                if peek is None or peek[0] <= len(buf):  # invalid, or whole and damaged
                    return False
                buf = os.pread(fd, peek[0], pos - delta)  # one frame longer than a buffer
                walk = framing.walk_frames(buf, pos, max_record, open_batch, last_batch, check=True)
                if walk.end == pos:  # incomplete (the end of the file), or damaged
                    return False
            pos, open_batch, last_batch = walk
            if open_batch > start:  # the batch at `start` ended
                self._seen = max(self._seen, open_batch)
                return True
