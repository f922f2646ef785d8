"""The file log: one append-only topic per log, shared by the processes of one machine.

The byte format is in `logstore.file.framing`; the locks in `logstore.locking`; waiting for new
records in `logstore.file.waiting`. Positions are byte offsets of frames; the first record is at
48, just after the file header.

Segments (`logstore.file.segments`): a topic is a sequence of segment files, and positions are
global: a segment at base B holds the positions from B, its file offset being position − B
+ its header's size. A handle appends to the *active* segment (the newest) and reads from
whichever segment holds the position asked (`_locate`); each side keeps its segment's
descriptor and *delta* (position − file offset), so the loops below work in positions and
subtract the delta only where they pread or pwrite. An appender that finds the active
segment at `segment_bytes` or more starts the next one at the end (`_roll`): under the append
lock it forces the old one to disk, stores the new base as ``ACTIVE`` in the shared state,
then creates the new file (header, fsync, rename, fsync of the directory). Every appender
compares ``ACTIVE`` with its own segment under the lock before it writes, so nothing is
appended to a sealed segment; one that finds ``ACTIVE`` ahead of the files (a roller killed
between the two steps) creates the segment itself. A reader at the end of a sealed segment
goes on in the next. A position before the first segment still there raises
PositionCompactedError. Segments are removed only by compaction (`logstore.file.segments`).

``<log>.sync`` is a small file every handle maps into memory: the *committed* end (where
the last complete append ended), the *pending* end (where the last append begun ends), the
*file end* (the active segment's size as the last append left it), the *synced* offset
(see Durability), the active segment and the segment size.

Appending, under an exclusive flock on ``<log>.lock``:

1. Find where the log ends. When the committed and pending ends both equal this handle's
   last append end and the file's size (lseek SEEK_END: cheaper than an fstat result) is
   the file end, nobody else appended: append there. When the last append (another
   handle's) completed, and the size is the file end it left, its committed end is the
   end. Otherwise a writer died mid-append, something outside qw wrote or cut the file,
   or this handle has not looked yet: walk the frame headers from the furthest known end
   and verify the last batch in full (`_find_end`); a torn tail is truncated.
2. Store the pending end, write all the frames of the append with one pwrite (pwritev for
   a large record), store the committed end. A short write or an error (disk full,
   RLIMIT_FSIZE) truncates back to where the append began and raises AppendError: nothing
   of it stays visible.

Zeros ahead. An append that will be forced to disk and leaves few zeros after it (under a
quarter of what it would write) writes more there, in the same hold of the lock: a quarter
of the segment's records so far, from 16 KiB to 256 KiB (`zeros_ahead`; a small queue's
files stay small). The appends that follow land in those zeros, and their flushes then
carry data only: the file's size, and the blocks it maps, were forced with the append that
wrote them. (Measured on this
machine's ext4: a small append and its fdatasync 91-96 µs in zeros written ahead, 136-145 µs
at the end of a growing file.) Zeros after the last record are what a power cut can leave
too, and the decoding rules of `logstore.file.framing` already read them as "nothing more":
writers leave them in place (`_zeros_after`: nothing but zeros follows is no torn tail), a
reader that meets a zero frame header at or past the committed end stops there as at the
end of the file, and `_ready` peeks at the header where it waits. A roll cuts the zeros
off the segment it seals, so a sealed segment still ends at its last record. An append not
forced (`--fsync none`, a CLAIM) writes no zeros: the file grows as it goes.

Durability (``Durability``) uses group commit across processes. A writer that must be
durable takes the flock on ``<log>.sync`` after its write (outside the append lock); if the
synced offset already covers its record, some other process's fdatasync did the work;
otherwise it notes the committed end, fdatasyncs, and stores that as the synced offset
(every append that completed before the flush began is covered by it; the file's size is
not, as it counts the zeros ahead). A truncation lowers the synced offset first.

Reading takes no lock: pread, decode, and stop at an incomplete frame (or zeros ahead).
Readers never see a record until it is whole and valid. A reader that stopped on an
incomplete tail waits for the file's size or the committed end to change; while an append
is in flight there (pending ≠ committed) it polls every STALL_POLL, as the committed end is
stored after the write's own inotify event. A handle remembers how far it has verified
whole batches (`_seen`): a frame before that point is returned as soon as it is read, its
checksum checked, without reading to the end of its batch again; a batch longer than a read
buffer is verified once, a buffer at a time (`_vouch`), before any of its frames is
returned.

One race needs care: a reader may read a torn tail while a writer truncates and rewrites it,
and so see a mix of old and new bytes that looks like damage. A reader that meets damage
decides again under a shared flock (which excludes writers): damage that is still there is
real. (What a handle has verified is never cut: writers cut only a torn tail, after the
last whole batch.)

What may be cut, and what is damage however it looks (`FileReads._refuse_cut`, asked
wherever a walk or a read stops where a segment's records stop; docs/protocol.md §5, "What a
reader may cut"): only the active segment's bytes past the synced offset may be a torn tail,
since every byte below it was on disk when it was stored and nothing writes there again. A
sealed segment is whole: its file ends at the next segment's base (checked when a reader
moves to it or off it, and by `check` for every segment), and its records reach that end.
`check` and `verify` also judge what follows the last record, which the reads leave alone
(zeros written ahead, or an append in flight): a reader that vouches for the whole log (the
start-up check, `qw status`, `qw report`) gives the same answer as a writer that walks it.

Handles and processes: every process opens its own `FileLog`. A handle inherited through
fork() must not be used by the child; as a safety net a handle notices it is in a new
process on first use and reopens its descriptors (flock belongs to the open file, which the
child shares with its parent). `append`/`append_many` may be called from several threads;
`read`, `end` and `wait` from one thread at a time (which may differ from the appending ones).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import weakref
from _thread import allocate_lock  # threading.Lock itself, without `threading` (~1 ms to import)
from collections.abc import Sequence
from pathlib import Path
from time import monotonic
from typing import NamedTuple, NoReturn
from zlib import crc32

from logstore.base import (
    AppendError,
    CorruptLogError,
    Durability,
    Entry,
    Log,
    LogClosedError,
    LogError,
    PositionCompactedError,
    RecordTooLargeError,
    SpanDecoder,
    SpanLoop,
    SpanRead,
)
from logstore.file import framing
from logstore.file.framing import FILE_HEADER_SIZE, FRAME_HEADER_SIZE, MAX_RECORD, Stop
from logstore.file.reads import (
    BIG_READ,
    NO_SEGMENT,
    READ_CHUNK,
    SCAN_CHUNK,
    ZERO_HEADER,
    FileReads,
)
from logstore.file.segments import (
    DEFAULT_SEGMENT_BYTES,
    FIRST_BASE,
    SegmentHeader,
    check_segment,
    drop_segment,
    encode_segment_header,
    list_bases,
    read_segment_header,
    segment_path,
    sync_directory,
)
from logstore.file.shared_state import (
    ACTIVE_WORD,
    COMMITTED_WORD,
    FILE_END_WORD,
    LOAD,
    OLD_STATE_SIZE,
    PENDING_WORD,
    SEGMENT_BYTES,
    STATE_SIZE,
    STORE,
    SYNCED,
)
from logstore.file.waiting import Waiter, make_waiter
from logstore.identity import (
    IdentityError,
    LogIdentity,
    check_identity,
    new_queue_id,
    read_file_header,
)
from logstore.locking import FlockLock, HeldLock, maintenance_lock, open_lock, open_read_lock

_NO_SEGMENT = NO_SEGMENT  # "no next segment known": beyond every position
#: the most and the fewest zeros a forced append writes ahead of itself (`zeros_ahead`)
ZERO_AHEAD = 256 * 1024
ZERO_AHEAD_MIN = 16 * 1024
_HEADER_PACK = framing.FRAME_HEADER.pack
_ALL_ONES = framing.ALL_ONES
_CONTINUED = framing.CONTINUED
_SEEK_END = os.SEEK_END
#: records up to this size are copied behind their header and written with pwrite; larger
#: ones go out with pwritev from where they are (a copy costs more than the iovec then)
_COPY_LIMIT = 64 * 1024
#: a reader stopped on an append being written checks again this often (seconds): see
#: `FileLog._stalled_in_flight`
STALL_POLL = 0.002


class SegmentFile(NamedTuple):
    """One segment file as `FileLog.verify` found it."""

    path: str
    base: int  # the position of its first record
    size: int  # the file's length in bytes (a sealed one's is judged against the next base)


class Verified(NamedTuple):
    """What `FileLog.verify` checked: every segment file and its length, where the records
    end (a position), and the forced offset (the ``SYNCED`` word: 0 when nothing was ever
    forced) below which every byte of the active segment is records."""

    segments: tuple[SegmentFile, ...]
    end: int
    forced: int


#: every open handle of this process, so that a forked child can mark them inherited
_HANDLES: weakref.WeakSet[FileLog] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for handle in list(_HANDLES):
        handle._stale = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _frame_batch_py(records: Sequence[bytes], max_record: int) -> tuple[bytes, list[int]]:
    """The frames of `records` as one batch (`framing.encode_batch`: every frame but the last
    CONTINUED) and each frame's length; RecordTooLargeError for a record longer than
    `max_record`."""
    last = len(records) - 1
    parts: list[bytes] = []
    lengths: list[int] = []
    for i, data in enumerate(records):
        size = len(data)
        if size > max_record:
            raise RecordTooLargeError(size, max_record)
        word = size | _CONTINUED if i < last else size
        parts.append(_HEADER_PACK(word, word ^ _ALL_ONES, crc32(data, word)))
        parts.append(data)
        lengths.append(FRAME_HEADER_SIZE + size)
    return b"".join(parts), lengths


_zero_block: bytes | None = None


def _zeros(count: int) -> memoryview:
    """`count` zero bytes (at most ZERO_AHEAD), from one block made on first use."""
    global _zero_block
    if _zero_block is None:
        _zero_block = bytes(ZERO_AHEAD)
    return memoryview(_zero_block)[:count]


def zeros_ahead(held: int) -> int:
    """How many zeros a forced append writes after the log's end, in a segment holding
    `held` bytes of records: a quarter of them, from ZERO_AHEAD_MIN to ZERO_AHEAD (see
    "Zeros ahead"). It writes them when fewer than a quarter of that many are left."""
    return min(ZERO_AHEAD, max(ZERO_AHEAD_MIN, held // 4))


class FileLog(FileReads, Log):
    """An append-only file of framed records; see the module docstring. Use `FileLog.open`."""

    reads_check_records = True  # every frame a read returns has had its checksum checked

    def __init__(
        self,
        path: str,
        durability: Durability,
        max_record: int,
        header: framing.FileHeader,
        read_only: bool = False,
        segment_bytes: int | None = None,
    ) -> None:
        self.path = path
        self.name = path
        #: the queue and topic this log belongs to (its header says so)
        self.identity = LogIdentity(header.queue, header.topic)
        #: opened for reading only: no file is created or written, appends raise LogError
        self.read_only = read_only
        file_max = header.max_record
        self.durability = durability
        #: the largest record `append` accepts
        self.max_record = min(max_record, file_max)
        self._file_max = file_max  # the file's own limit, which decoding enforces
        self._sync_all = durability is Durability.ALWAYS
        self._sync_durable = durability is not Durability.NONE
        #: an append that finds the active segment holding this many bytes starts a new one
        #: (None: the log's own size, see `open`)
        self._segment_bytes = segment_bytes
        self.segment_bytes = segment_bytes or DEFAULT_SEGMENT_BYTES
        self._tail = FILE_HEADER_SIZE  # the writer's verified end of the active segment
        #: a forced append that leaves fewer zeros than this after it writes more (see
        #: `_write_ahead`, which sets it)
        self._zero_room = ZERO_AHEAD_MIN // 4
        self._seen = FILE_HEADER_SIZE  # the reader's verified end of its segment
        #: (position, file size, COMMITTED) where a read last met an incomplete tail: the
        #: reader waits for one of them to change
        self._stall = (-1, -1, -1)
        self._walked = False  # whether _find_end has verified the file's last batch once
        self._read_view = memoryview(bytearray(READ_CHUNK))
        self._scan_view = memoryview(bytearray(SCAN_CHUNK))
        self._closed = False
        self._open_files()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        durability: Durability = Durability.COMMIT,
        max_record: int = MAX_RECORD,
        *,
        identity: LogIdentity | None = None,
        read_only: bool = False,
        segment_bytes: int | None = None,
    ) -> FileLog:
        """Open the log at `path`, creating it (with its header) if it does not exist.

        Raises ForeignFileError, leaving the file untouched, when `path` holds something that
        is not a qw log. `max_record` caps appends through this handle; a log keeps the
        max_record it was created with, and appends never exceed that either.

        `identity`: the queue and topic the log must belong to (IdentityError otherwise); a
        log created here gets it (without one: a new queue id, the file's stem as topic).
        `read_only`: never create or write anything (no lock or sync file either); a
        missing log is a LogError, appends raise LogError.
        `segment_bytes`: an append that finds the active segment this large starts a new one.
        Given, it becomes the log's segment size (kept in its shared state); None: the size
        the log has (DEFAULT_SEGMENT_BYTES when none was ever given). Every writer of a log
        so rolls at the size the last `qw up --segment-bytes` chose.
        """
        if segment_bytes is not None and segment_bytes < 1:
            raise ValueError(f"segment_bytes {segment_bytes} must be at least 1")
        if not 0 <= max_record <= framing.MAX_RECORD_LIMIT:
            raise ValueError(
                f"max_record {max_record} is out of range 0..{framing.MAX_RECORD_LIMIT}"
            )
        name = os.fspath(path)
        header = read_file_header(name)  # refuse a foreign file before creating anything
        # (only .seg files count: the first one may have been created since we looked)
        if header is None and any(base != FIRST_BASE for base in list_bases(name)):
            raise IdentityError(
                f"{name} is missing but later segments of it are there: the log's first "
                "segment was removed outside qw"
            )
        if header is None:
            if read_only:
                raise LogError(f"{name}: no such log (opened read-only, so not created)")
            new = identity or LogIdentity(new_queue_id(), _default_topic(name))
            try:
                with maintenance_lock(name + ".lock"):  # two creators must not race
                    header = _create(name, max_record, new)
            except OSError as exc:
                raise LogError(f"{name}: cannot create the log: {exc.strerror or exc}") from exc
        if identity is not None:
            check_identity(LogIdentity(header.queue, header.topic), identity, name)
        try:
            return cls(name, durability, max_record, header, read_only, segment_bytes)
        except OSError as exc:
            what = "open" if read_only else "open for writing"
            raise LogError(f"{name}: cannot {what} the log: {exc.strerror or exc}") from exc

    # -- descriptors and process ownership -----------------------------------------------------

    def _open_files(self) -> None:
        self._retired: list[int] = []  # write descriptors of sealed segments (see _switch_write)
        if self.read_only:
            self._open_read_only()
        else:
            self._open_writable()
        self._words = memoryview(self._state).cast("Q")  # (see ACTIVE_WORD)
        #: a read-only mapping of an older state file has no PENDING word: COMMITTED stands in
        self._pending_word = PENDING_WORD if len(self._words) > PENDING_WORD else COMMITTED_WORD
        self._acquire = self._lock.acquire
        self._release = self._lock.release
        self._mutex = allocate_lock()  # threads of this process sharing the handle's flock
        self._waiter: Waiter | None = None
        self._waiter_base = -1  # the segment the waiter watches
        #: True when this handle must not be used as it is: closed, or inherited through fork()
        self._stale = False
        _HANDLES.add(self)
        try:
            self._open_segments()
        except BaseException:
            self._words.release()
            self._state.close()
            if self._sync_lock is not None:
                self._sync_lock.close()
            self._lock.close()
            raise
        self._check_length()

    def _open_segments(self) -> None:
        """Open the newest segment for appending and reading (under the shared lock: no roll
        is half-listed), and make the shared ACTIVE word agree with the files."""
        self._lock.acquire_shared()
        try:
            bases = list_bases(self.path)
            active = bases[-1]
            word = self._active_word()
            if not self.read_only and (word == 0 or word < active):
                # a new state file, one of an older qw, or one that lost a roll's word in a
                # power cut: the files say where the active segment is
                self._words[ACTIVE_WORD] = active
            if not self.read_only and self._segment_bytes is not None:
                STORE(self._state, SEGMENT_BYTES, self._segment_bytes)
            self._rfd = -1
            self._fd = -1
            self._rbase = self._rdelta = 0
            self._rnext = _NO_SEGMENT
            self._wbase = self._wdelta = 0
            self._roll_at = _NO_SEGMENT
            self._switch_read(active, self._rnext)
            if not self.read_only:
                self._switch_write(active)
        finally:
            self._lock.release()
        self._tail = self._seen = self._wbase if not self.read_only else self._rbase

    def _active_word(self) -> int:
        """The ACTIVE word of the shared state: the base of the newest segment (0: unknown,
        also for a read-only handle of a state file written before segments)."""
        if len(self._words) <= ACTIVE_WORD:
            return 0
        return int(self._words[ACTIVE_WORD])

    def _open_segment(self, base: int, flags: int) -> tuple[int, SegmentHeader]:
        """A descriptor of the segment at `base`, its header checked against the log's
        identity (FileNotFoundError when there is no such file)."""
        path = segment_path(self.path, base)
        fd = os.open(path, flags | os.O_CLOEXEC)
        try:
            header = read_segment_header(fd, path)
            check_segment(header, path, base, self.identity)
        except BaseException:
            os.close(fd)
            raise
        return fd, header

    def _switch_read(self, base: int, after: int) -> SegmentHeader:
        """Read from the segment at `base` (`after`: the base of the next one, _NO_SEGMENT
        when it is the newest known)."""
        fd, header = self._open_segment(base, os.O_RDONLY)
        delta = base - header.size
        try:
            if header.compacted:  # replaced by its stub since it was listed: removed
                raise FileNotFoundError(f"{self.path}: the first segment was compacted")
            if after != _NO_SEGMENT:  # sealed: its length is known
                size = os.lseek(fd, 0, _SEEK_END) + delta
                self._refuse_cut(base, delta, size, size, after)
        except BaseException:
            os.close(fd)
            raise
        if self._rfd >= 0 and (self.read_only or self._rfd != self._fd):
            os.close(self._rfd)  # (a read-only handle's _fd is the same descriptor)
        self._rfd = fd
        if self.read_only:
            self._fd = fd
        self._rbase = base
        self._rdelta = delta
        self._rnext = after
        self._seen = base  # nothing of this segment verified by this handle yet
        self._stall = (-1, -1, -1)
        return header

    def _switch_write(self, base: int) -> None:
        """Append to the segment at `base` (under the append lock, or at open)."""
        fd, header = self._open_segment(base, os.O_RDWR)
        if self._fd >= 0:
            # Not closed yet: another thread of this process may be forcing it to disk
            # (`_sync`); it is closed at the next switch, a whole segment later.
            for old in self._retired:
                os.close(old)
            self._retired = [self._fd]
        self._fd = fd
        self._wbase = base
        self._wdelta = base - header.size
        if self._segment_bytes is None:  # the log's size, as it is now
            self.segment_bytes = int(LOAD(self._state, SEGMENT_BYTES)[0]) or DEFAULT_SEGMENT_BYTES
        self._roll_at = base + self.segment_bytes
        self._tail = base
        self._walked = False

    def _open_read_only(self) -> None:
        """Descriptors that cannot write: the lock file O_RDONLY when it exists (flock needs
        no write access), the sync state mapped read-only (or zeros). The segments are
        opened by `_open_segments`."""
        with contextlib.ExitStack() as undo:
            self._lock: HeldLock = open_read_lock(self.path + ".lock")
            undo.callback(self._lock.close)
            self._sync_lock: FlockLock | None = None
            try:
                state_fd = os.open(self.path + ".sync", os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                state_fd = -1
            size = os.fstat(state_fd).st_size if state_fd >= 0 else 0
            if size >= OLD_STATE_SIZE:
                length = min(size, STATE_SIZE)
                self._state = mmap.mmap(state_fd, length, prot=mmap.PROT_READ)
            else:
                self._state = mmap.mmap(-1, STATE_SIZE)  # zeros: nothing known committed
            if state_fd >= 0:
                os.close(state_fd)
            undo.pop_all()

    def _check_length(self) -> None:
        """Refuse a log shorter than what is known to be on disk of it: the synced offset
        only grows, except when a writer cuts a torn tail (which lowers it first, under the
        append lock). A file below it was cut outside qw (`truncate`, a copy of an older
        file): its records' ids would be given again to new ones."""
        self._lock.acquire_shared()
        try:
            synced = LOAD(self._state, SYNCED)[0]
            size = os.lseek(self._rfd, 0, _SEEK_END)
        finally:
            self._lock.release()
        if size + self._rdelta < synced:
            self._close_files()
            self._closed = self._stale = True
            raise IdentityError(
                f"{segment_path(self.path, self._rbase)} is {size} bytes, shorter than the "
                f"{synced - self._rdelta} bytes of it already forced to disk: the log was cut "
                "short outside qw"
            )

    def _open_writable(self) -> None:
        with contextlib.ExitStack() as undo:  # closes what was opened if a later step fails
            self._lock = open_lock(self.path + ".lock")
            undo.callback(self._lock.close)
            # Group commit needs flock on the sync file; without flock every durable append
            # forces the file on its own.
            self._sync_lock = None
            if isinstance(self._lock, FlockLock):
                self._sync_lock = FlockLock(self.path + ".sync")
                undo.callback(self._sync_lock.close)
                state_fd = self._sync_lock.fd
            else:
                state_fd = os.open(self.path + ".sync", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
                undo.callback(os.close, state_fd)
            if os.fstat(state_fd).st_size < STATE_SIZE:
                os.ftruncate(state_fd, STATE_SIZE)  # only ever grows it: safe without a lock
            self._state = mmap.mmap(state_fd, STATE_SIZE)
            undo.pop_all()
        if self._sync_lock is None:
            os.close(state_fd)  # the mapping stays valid

    def _close_files(self) -> None:
        if self._waiter is not None:
            self._waiter.close()
        self._words.release()
        self._state.close()
        if self._sync_lock is not None:
            self._sync_lock.close()
        self._lock.close()
        for fd in {self._rfd, self._fd, *self._retired}:
            if fd >= 0:
                os.close(fd)
        self._retired = []

    def _revive(self) -> None:
        """Called when `_stale` is set: the handle is closed, or was inherited through fork()."""
        if self._closed:
            raise LogClosedError(f"{self.name} is closed")
        # A forked child shares the parent's open files, and with them the parent's flock:
        # closing the child's copies leaves the parent's locks alone; then open our own.
        self._close_files()
        self._open_files()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stale = True  # every method's check now raises LogClosedError
        _HANDLES.discard(self)
        self._close_files()

    # -- appending -----------------------------------------------------------------------------

    def _refuse_write(self) -> NoReturn:
        raise LogError(f"{self.name} is opened read-only: nothing may be appended")

    def append(self, data: bytes, *, durable: bool = False) -> int:
        if self._stale:
            self._revive()
        if self.read_only:
            self._refuse_write()
        size = len(data)
        if size > self.max_record:
            raise RecordTooLargeError(size, self.max_record)
        header = _HEADER_PACK(size, size ^ _ALL_ONES, crc32(data, size))  # framing.frame_header
        forced = self._sync_all or (durable and self._sync_durable)
        if size > _COPY_LIMIT:
            pos = self._write((header, data), FRAME_HEADER_SIZE + size, forced)
        else:
            # `_write` inlined: this is the hot path, and a call and a tuple cost ~10% here.
            frame = header + data
            total = len(frame)
            words = self._words
            with self._mutex:
                self._acquire()
                try:
                    pos = self._tail
                    if words[ACTIVE_WORD] != self._wbase:
                        pos = self._follow_active()
                    file_size = os.lseek(self._fd, 0, _SEEK_END) + self._wdelta
                    if (
                        file_size != words[FILE_END_WORD]
                        or words[COMMITTED_WORD] != pos
                        or words[PENDING_WORD] != pos
                    ):
                        pos = self._find_append_position(file_size)
                    if pos >= self._roll_at:
                        self._roll(pos)
                        file_size = pos  # the new segment's, empty
                    end = pos + total
                    words[PENDING_WORD] = end
                    try:
                        written = os.pwrite(self._fd, frame, pos - self._wdelta)
                    except OSError as exc:
                        self._undo(pos, total, exc)
                    if written != total:
                        self._finish((frame,), total, pos, written)
                    self._tail = end
                    words[COMMITTED_WORD] = end
                    if forced and file_size < end + self._zero_room:
                        words[FILE_END_WORD] = self._write_ahead(file_size, end)
                    elif end > file_size:
                        words[FILE_END_WORD] = end
                finally:
                    self._release()
        if forced:
            self._sync(pos + FRAME_HEADER_SIZE + size)
        return pos

    def append_many(self, records: Sequence[bytes], *, durable: bool = False) -> list[int]:
        if self._stale:
            self._revive()
        if self.read_only:
            self._refuse_write()
        if not records:
            return []
        frames, lengths = _frame_batch_py(records, self.max_record)
        forced = self._sync_all or (durable and self._sync_durable)
        pos = self._write((frames,), len(frames), forced)
        positions = []
        at = pos
        for length in lengths:
            positions.append(at)
            at += length
        if forced:
            self._sync(at)
        return positions

    def _write(self, parts: tuple[bytes, ...], total: int, forced: bool) -> int:
        """Write `parts` (one or more whole frames) at the end of the log; return the offset.
        `forced`: the append will be forced to disk (zeros are written ahead for it)."""
        words = self._words
        with self._mutex:
            self._acquire()
            try:
                pos = self._tail
                if words[ACTIVE_WORD] != self._wbase:
                    pos = self._follow_active()
                size = os.lseek(self._fd, 0, _SEEK_END) + self._wdelta
                if (
                    size != words[FILE_END_WORD]
                    or words[COMMITTED_WORD] != pos
                    or words[PENDING_WORD] != pos
                ):
                    pos = self._find_append_position(size)
                if pos >= self._roll_at:
                    self._roll(pos)
                    size = pos  # the new segment's, empty
                end = pos + total
                words[PENDING_WORD] = end
                offset = pos - self._wdelta
                try:
                    if len(parts) == 1:
                        written = os.pwrite(self._fd, parts[0], offset)
                    else:
                        written = os.pwritev(self._fd, parts, offset)
                except OSError as exc:
                    self._undo(pos, total, exc)
                if written != total:
                    self._finish(parts, total, pos, written)
                self._tail = end
                words[COMMITTED_WORD] = end
                if forced and size < end + self._zero_room:
                    words[FILE_END_WORD] = self._write_ahead(size, end)
                elif end > size:
                    words[FILE_END_WORD] = end
            finally:
                self._release()
        return pos

    def _write_ahead(self, size: int, end: int) -> int:
        """Under the append lock, after an append to be forced that ended at `end` in a file
        of `size` (as a position) before it: write zeros up to `zeros_ahead` past `end`, so
        that the appends that land in them change no file size (see "Zeros ahead"). Returns
        the file's size now, as a position."""
        ahead = zeros_ahead(end - self._wbase)
        self._zero_room = ahead // 4
        start = max(size, end)
        if start >= end + ahead:
            return start
        try:
            written = os.pwrite(self._fd, _zeros(end + ahead - start), start - self._wdelta)
        except OSError:  # a full disk: later appends grow the file as they go
            return start
        return start + written

    def _find_append_position(self, size: int) -> int:
        """Under the append lock, when another handle appended since this one did, or an
        append did not complete, or the file is shorter than this handle's last append."""
        words = self._words
        committed = words[COMMITTED_WORD]
        # If the last appender completed its append, the end is sound: no need to walk (what
        # follows it is zeros written ahead, or nothing).
        if (
            self._walked
            and committed == words[PENDING_WORD]
            and size == words[FILE_END_WORD]
            and self._wbase <= committed <= size
        ):
            return int(committed)
        end = self._settle(size)
        words[COMMITTED_WORD] = words[PENDING_WORD] = end
        words[FILE_END_WORD] = os.lseek(self._fd, 0, _SEEK_END) + self._wdelta
        return end

    def _settle(self, size: int) -> int:
        """Under the append lock: the end of the valid frames, a torn tail cut off."""
        start = self._tail
        if self._rbase == self._wbase:  # the reader's knowledge is of this segment too
            start = max(start, self._seen)
        committed = self._words[COMMITTED_WORD]
        if self._walked and start < committed <= size:  # (a stale value after a power cut
            start = committed  # is never used: the first walk of a handle ignores it)
        if size < start:  # cut by something outside this protocol: trust nothing we knew
            start = self._wbase
            if self._rbase == self._wbase:
                self._seen = start
        end, stop = self._find_end(self._fd, start, size, self._scan_view, self._wdelta)
        self._refuse_cut(self._wbase, self._wdelta, end, size, self._after(self._wbase, size))
        if stop is Stop.TORN_TAIL and not self._zeros_after(end, size):
            self._truncate(end)
        return end

    def _zeros_after(self, end: int, size: int) -> bool:
        """Whether the active segment holds nothing but zeros from position `end` to `size`:
        zeros written ahead, which are no torn tail (nothing to cut)."""
        pos = end
        while pos < size:
            chunk = os.pread(self._fd, min(BIG_READ, size - pos), pos - self._wdelta)
            if not chunk:
                return True
            if chunk.count(0) != len(chunk):
                return False
            pos += len(chunk)
        return True

    # -- segments ------------------------------------------------------------------------------

    def _follow_active(self) -> int:
        """Under the append lock, when ACTIVE names another segment than this handle's:
        another handle started a new one. Append there (creating it when its roller was
        killed before it could). Returns the new segment's base; the caller finds its end."""
        active = int(self._words[ACTIVE_WORD])
        bases = list_bases(self.path)
        if bases[-1] > active:  # (a state file reset under a live log: the files decide)
            active = bases[-1]
            self._words[ACTIVE_WORD] = active
        elif bases[-1] < active:
            try:
                self._create_segment(active)
            except OSError as exc:  # (a full disk: nothing was appended)
                raise AppendError(
                    f"{self.name}: cannot start a new segment at {active}: {exc.strerror or exc}"
                ) from exc
        self._switch_write(active)
        return active

    def _roll(self, end: int) -> None:
        """Under the append lock, `end` being the active segment's settled end: seal it and
        start the next segment there (see the module docstring for the order of steps)."""
        try:
            # A sealed segment ends at its last record (the zeros written ahead go), and is
            # never written again: force it once.
            os.ftruncate(self._fd, end - self._wdelta)
            os.fsync(self._fd)
            self._words[ACTIVE_WORD] = end
            self._create_segment(end)
            # The same size again: changes nothing, but raises IN_MODIFY, which wakes the
            # readers waiting at the end of the sealed segment (they go on in the new one).
            os.ftruncate(self._fd, end - self._wdelta)
        except OSError as exc:
            raise AppendError(
                f"{self.name}: cannot start a new segment at {end}: {exc.strerror or exc}"
            ) from exc
        self._switch_write(end)

    def _create_segment(self, base: int) -> None:
        """Write the file of a new, empty segment at `base`, atomically and durably."""
        path = segment_path(self.path, base)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        try:
            os.pwrite(fd, encode_segment_header(self._file_max, self.identity, base), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        sync_directory(str(Path(path).parent))

    def _finish(self, parts: tuple[bytes, ...], total: int, pos: int, written: int) -> None:
        # A short write: a signal, or a limit (disk full, RLIMIT_FSIZE) reached part way.
        # Try to write the rest; the error that stops it undoes the whole append.
        rest = memoryview(b"".join(parts))
        while written < total:
            try:
                count = os.pwrite(self._fd, rest[written:], pos + written)
            except OSError as exc:
                self._undo(pos, total, exc)
            if count == 0:
                self._undo(pos, total, OSError(0, "the write made no progress"))
            written += count

    def _undo(self, pos: int, total: int, exc: OSError) -> NoReturn:
        """Cut a failed append back off the file, and raise AppendError."""
        with contextlib.suppress(OSError):  # if this fails, the next appender cuts it
            self._truncate(pos)
        reason = exc.strerror or str(exc)
        raise AppendError(
            f"{self.name}: append of {total} bytes at offset {pos} failed: {reason}"
        ) from exc

    def _truncate(self, end: int) -> None:
        """Cut the active segment at position `end` (under the append or maintenance lock)."""
        os.ftruncate(self._fd, end - self._wdelta)
        words = self._words
        words[COMMITTED_WORD] = words[PENDING_WORD] = words[FILE_END_WORD] = end
        if self._sync_lock is None:
            return
        # The synced offset may count bytes of the cut tail; new bytes written there later
        # must not pass for synced.
        sync = self._sync_lock
        sync.acquire()
        try:
            if LOAD(self._state, SYNCED)[0] > end:
                STORE(self._state, SYNCED, end)
        finally:
            sync.release()

    def _sync(self, end: int) -> None:
        """Make the file durable at least up to `end` (group commit, see module docstring)."""
        try:
            sync = self._sync_lock
            if sync is None:
                os.fdatasync(self._fd)
                return
            # Another process's flush that began after our write covers us: no lock needed.
            fd, delta = self._fd, self._wdelta
            synced = LOAD(self._state, SYNCED)[0]
            if end <= synced <= os.lseek(fd, 0, _SEEK_END) + delta:
                return
            sync.acquire()
            try:
                synced = LOAD(self._state, SYNCED)[0]
                fd, delta = self._fd, self._wdelta  # (a roll may have moved on: then the
                # record is in a sealed segment, forced at the roll, and this one is newer)
                size = os.lseek(fd, 0, _SEEK_END) + delta
                if end <= synced <= size:  # (an offset past the file's end is stale: ignore it)
                    return
                # Every append that completed before the flush begins is covered by it; the
                # file's size is not what was written (zeros written ahead follow the end).
                covered = self._words[COMMITTED_WORD]
                if self._words[ACTIVE_WORD] > self._wbase:
                    # Another handle rolled since this one wrote: the record is in the
                    # segment it sealed and forced, and `covered` may be in the next one,
                    # which this flush would not cover.
                    return
                os.fdatasync(fd)
                STORE(self._state, SYNCED, covered)
            finally:
                sync.release()
        except OSError as exc:
            raise LogError(
                f"{self.name}: could not force the file to disk ({exc.strerror or exc}); "
                f"the records up to offset {end} are written but may not survive a power cut"
            ) from exc

    def synced(self) -> int:
        """The offset up to which the log is known to be on stable storage (0 if unknown)."""
        if self._stale:
            self._revive()
        return 0 if self._sync_lock is None else int(LOAD(self._state, SYNCED)[0])

    # -- finding the end, verifying ---------------------------------------------------------

    def repair(self) -> int:
        """Verify every frame under the maintenance lock; cut a torn tail. Returns the bytes cut.

        Appends repair a torn tail on their own; this is for an operator (or a test) who
        wants the whole file checked. Damage before the tail raises CorruptLogError.
        """
        if self._stale:
            self._revive()
        if self.read_only:
            self._refuse_write()
        with self._mutex, maintenance_lock(self.path + ".lock"):
            if self._words[ACTIVE_WORD] != self._wbase:
                self._follow_active()
            size = os.lseek(self._fd, 0, _SEEK_END) + self._wdelta
            # (only the active segment can have a torn tail: a roll settled the others)
            end, stop = self._verify(self._fd, self._wbase, size, self._scan_view, self._wdelta)
            self._refuse_cut(self._wbase, self._wdelta, end, size, _NO_SEGMENT)
            cut = 0
            if stop is Stop.TORN_TAIL and not self._zeros_after(end, size):
                self._truncate(end)
                cut = size - end
            # (appenders are held off: it is exact)
            self._words[COMMITTED_WORD] = self._words[PENDING_WORD] = end
            self._words[FILE_END_WORD] = os.lseek(self._fd, 0, _SEEK_END) + self._wdelta
            self._tail = end
            if self._rbase == self._wbase:
                self._seen = min(self._seen, end)
            self._walked = True
            return cut

    def check(self, start: int | None = None) -> int:
        """Verify every frame from `start` (a record's position; None: the log's start) to
        the end of the file now (checksums too, trusting nothing this handle has seen);
        return where the valid records end. Damage before the tail raises CorruptLogError
        naming the byte offset, and so does a segment that ends where it may not
        (`_refuse_cut`: every sealed one's length is judged, whatever `start`). Writes
        nothing (a torn tail is left to the next append). `verify` says what it checked."""
        return self.verify(start).end

    def verify(self, start: int | None = None) -> Verified:
        """`check`, answering what it verified: each segment's file and length, where the
        records end, and the forced offset they reach."""
        if self._stale:
            self._revive()
        end = self.start if start is None else max(start, self.start)
        files: list[SegmentFile] = []
        for base, after in self.segments():
            try:
                fd, header = self._open_segment(base, os.O_RDONLY)
            except FileNotFoundError:  # compacted meanwhile: it was settled history
                continue
            try:
                if header.compacted:  # (replaced by its stub meanwhile: the same)
                    continue
                delta = base - header.size
                try:
                    size, end = self._verify_segment(fd, base, delta, end, after)
                except CorruptLogError:  # as in read(): decide again with the writers held off
                    self._lock.acquire_shared()
                    try:
                        size, end = self._verify_segment(fd, base, delta, end, after)
                    finally:
                        self._lock.release()
                files.append(SegmentFile(segment_path(self.path, base), base, size - delta))
            finally:
                os.close(fd)
        return Verified(tuple(files), end, int(LOAD(self._state, SYNCED)[0]))

    def _verify_segment(
        self, fd: int, base: int, delta: int, start: int, after: int
    ) -> tuple[int, int]:
        """`verify` of one segment: its length judged when it is sealed, then its frames
        from `start` (when it holds any) and where they stop. Returns (its size, where the
        verified records end), both positions."""
        size = os.lseek(fd, 0, _SEEK_END) + delta
        if after == _NO_SEGMENT:
            after = self._after(base, size)
        if after != _NO_SEGMENT:  # sealed: its length first (a grown one is not walked)
            self._refuse_cut(base, delta, size, size, after)
            if after <= start:  # wholly before `start`
                return size, start
        end, _ = self._verify(fd, max(base, start), size, self._scan_view, delta)
        self._refuse_cut(base, delta, end, size, after)
        return size, end

    def segments(self) -> list[tuple[int, int]]:
        """(base, next base) of each segment still holding records, oldest first; the last
        one's next base is _NO_SEGMENT (it is the active one, as far as the files say)."""
        bases = list_bases(self.path)
        # (only a sealed first segment can be a stub: the one segment of a log is not)
        if len(bases) > 1 and bases[0] == FIRST_BASE and self._first_is_stub():
            bases = bases[1:]
        return list(zip(bases, [*bases[1:], _NO_SEGMENT], strict=True))

    def sealed_segments(self) -> list[tuple[int, int]]:
        """(base, end) of each segment that is no longer appended to, oldest first."""
        return [(base, after) for base, after in self.segments() if after != _NO_SEGMENT]

    def local_bytes(self) -> int | None:
        try:
            return os.path.getsize(self.path)
        except OSError:
            return None

    def drop_before(self, position: int) -> int:
        dropped = self.drop_segments(position)
        return dropped[-1][1] if dropped else self.start

    def drop_segments(self, upto: int) -> list[tuple[int, int]]:
        """Remove every sealed segment that ends at or before position `upto`, oldest first,
        and return their (base, end). Compaction's last step (`queue_worker.compaction.files`):
        the caller has made sure that what they hold is settled and covered by a durable
        checkpoint. Readers of a removed position get PositionCompactedError."""
        if self.read_only:
            self._refuse_write()
        dropped = []
        for base, end in self.sealed_segments():
            if end > upto:
                break
            drop_segment(self.path, base, self.identity, self._file_max)
            dropped.append((base, end))
        return dropped

    def _first_is_stub(self) -> bool:
        path = segment_path(self.path, FIRST_BASE)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return True
        try:
            return read_segment_header(fd, path).compacted
        finally:
            os.close(fd)

    def checksum(self, start: int, end: int, seed: int = 0) -> int:
        """crc32 of the file's bytes from `start` to `end` (frame headers included), from
        `seed`: what a checkpoint keeps of the prefix it covers. About 1 GB/s."""
        if self._stale:
            self._revive()
        crc = seed
        segments = self.segments()
        if start < end and (not segments or start < segments[0][0]):
            raise PositionCompactedError(self.name, start, segments[0][0] if segments else end)
        for base, after in segments:
            if after <= start or base >= end:
                continue
            try:
                fd, header = self._open_segment(base, os.O_RDONLY)
            except FileNotFoundError:
                raise PositionCompactedError(self.name, max(start, base), self.start) from None
            try:
                delta = base - header.size
                if after != _NO_SEGMENT:  # sealed: its length is known
                    size = os.lseek(fd, 0, _SEEK_END) + delta
                    self._refuse_cut(base, delta, size, size, after)
                crc = self._checksum_segment(fd, delta, max(start, base), min(end, after), crc)
            finally:
                os.close(fd)
        return crc

    def _checksum_segment(self, fd: int, delta: int, start: int, end: int, crc: int) -> int:
        """crc32 of one segment's bytes from `start` to `end`."""
        pos = start
        while pos < end:
            chunk = os.pread(fd, min(BIG_READ, end - pos), pos - delta)
            if not chunk:
                raise IdentityError(
                    f"{self.name} ends at byte {pos}, before byte {end} that was read before: "
                    "the log was cut short outside qw"
                )
            crc = crc32(chunk, crc)
            pos += len(chunk)
        return crc

    # -- reading -------------------------------------------------------------------------------

    def read(self, position: int, max_records: int | None = None) -> list[Entry]:
        if self._stale:
            self._revive()
        if position < FILE_HEADER_SIZE:
            raise ValueError(
                f"{self.name}: position {position} is before the first record ({FILE_HEADER_SIZE})"
            )
        if max_records is not None and max_records <= 0:
            return []
        if not self._rbase <= position < self._rnext:
            self._locate(position)
        try:  # `_read_segment` inlined: a Python call fewer in every read
            entries = self._read(position, max_records)
        except CorruptLogError:
            entries = self._read_held_off(position, max_records)
        if entries or not self._sealed() or not self._to_next_segment(position):
            return entries
        return self._read_segment(position, max_records)

    def _to_next_segment(self, position: int) -> bool:
        """Nothing more at `position` in a sealed segment: the records go on in the next
        one. Locate it and say True, or False when it is not there yet."""
        after = self._next_base()
        if after == _NO_SEGMENT:
            return False  # (the next segment is being created)
        end = os.lseek(self._rfd, 0, _SEEK_END) + self._rdelta
        if after != end:  # a roll forces a segment to disk before the next one begins
            start = self.start
            if end < start:
                # The segments from here on were removed after this handle looked (it read
                # this one while it was active): compaction, which removes only a prefix,
                # not a missing middle segment.
                raise PositionCompactedError(self.name, position, start)
            self._refuse_cut(self._rbase, self._rdelta, position, end, after)
        if end > position:
            return False  # (records appended before the roll, not read yet: read again)
        self._locate(after)
        return True

    def _read_segment(self, position: int, max_records: int | None) -> list[Entry]:
        try:
            return self._read(position, max_records)
        except CorruptLogError:
            return self._read_held_off(position, max_records)

    def _read_held_off(self, position: int, max_records: int | None) -> list[Entry]:
        """`_read` again after it met damage: perhaps a writer was cutting a torn tail while
        we read it. Decided again with the writers held off: damage still there is real."""
        self._lock.acquire_shared()
        try:
            return self._read(position, max_records)
        finally:
            self._lock.release()

    def _span_segment(self, position: int, max_records: int, loop: SpanLoop) -> SpanRead:
        """`_read_segment` for span reads. (Not one method taking the reader: passing it
        made `read`'s small reads ~4% slower in a micro-benchmark, within its noise.)"""
        try:
            return self._read_span(position, max_records, loop)
        except CorruptLogError:
            self._lock.acquire_shared()  # decided again with the writers held off
            try:
                return self._read_span(position, max_records, loop)
            finally:
                self._lock.release()

    def read_span(self, position: int, max_records: int, decoder: SpanDecoder) -> SpanRead:
        """`read`, with each record's payload made into an item by `decoder.frames` as the
        frames are walked (see `framing.decode_span`): the items and their positions, with
        no `Entry` and no payload copy. For a reader that folds every record (a claims
        follower); the same reads, checks and errors as `read` (segments included: a span
        never crosses a segment's end, `read`'s way of going on in the next segment
        applies)."""
        loop = decoder.frames
        if loop is None:
            return super().read_span(position, max_records, decoder)
        self._check_read(position)
        if max_records <= 0:
            return SpanRead([], [], position)
        if not self._rbase <= position < self._rnext:
            self._locate(position)
        found = self._span_segment(position, max_records, loop)
        if found or not self._sealed() or not self._to_next_segment(position):
            return found
        return self._span_segment(position, max_records, loop)

    def _check_read(self, position: int) -> None:
        if self._stale:
            self._revive()
        if position < FILE_HEADER_SIZE:
            raise ValueError(
                f"{self.name}: position {position} is before the first record ({FILE_HEADER_SIZE})"
            )

    def _sealed(self) -> bool:
        """Whether the segment being read is no longer the active one (nothing is appended
        to it any more)."""
        word = self._active_word()
        if word:
            return word > self._rbase
        return self._next_base() != _NO_SEGMENT

    def _next_base(self) -> int:
        """The base of the segment after the one being read (_NO_SEGMENT: none yet)."""
        if self._rnext == _NO_SEGMENT:
            later = (b for b in list_bases(self.path) if b > self._rbase)
            self._rnext = min(later, default=_NO_SEGMENT)
        return self._rnext

    def _locate(self, position: int) -> None:
        """Read from the segment that holds `position`; PositionCompactedError when it was
        removed by compaction (it is before the first segment left)."""
        for _ in range(3):  # a listing may race with a compaction: list again
            segments = self.segments()
            if not segments or position < segments[0][0]:
                start = segments[0][0] if segments else position
                raise PositionCompactedError(self.name, position, start)
            base, after = max((b, a) for b, a in segments if b <= position)
            try:
                self._switch_read(base, after)
                return
            except FileNotFoundError:
                continue
        raise PositionCompactedError(self.name, position, self.start)

    def end(self) -> int:
        if self._stale:
            self._revive()
        if self.read_only:
            self._to_active()
            fd, base, delta = self._rfd, self._rbase, self._rdelta
            start = self._seen
        else:
            if self._words[ACTIVE_WORD] != self._wbase:  # another handle rolled
                with self._mutex:
                    self._acquire()
                    try:
                        if self._words[ACTIVE_WORD] != self._wbase:
                            self._follow_active()
                    finally:
                        self._release()
            fd, base, delta = self._fd, self._wbase, self._wdelta
            start = max(self._seen, self._tail) if self._rbase == base else self._tail
        reading = self._rbase == base  # (what is learnt of the end helps the reader too)
        size = os.lseek(fd, 0, _SEEK_END) + delta
        if size == start:
            return start
        words = self._words
        committed = int(words[COMMITTED_WORD])
        if self._walked and committed == words[self._pending_word] and start <= committed <= size:
            # The last append completed; nothing follows it but zeros written ahead, if any.
            if reading:
                self._seen = committed
            return committed
        if size < start:
            start = base
        try:
            end = self._judged_end(fd, base, delta, start, size)
        except CorruptLogError:  # as in read(): decide again with the writers held off
            self._lock.acquire_shared()
            try:
                size = os.lseek(fd, 0, _SEEK_END) + delta
                end = self._judged_end(fd, base, delta, start, size)
            finally:
                self._lock.release()
        if reading:
            self._seen = end
        return end

    def _judged_end(self, fd: int, base: int, delta: int, start: int, size: int) -> int:
        """`_find_end` of the segment at `base`, where its records stop judged by `_refuse_cut`."""
        end, _ = self._find_end(fd, start, size, self._read_view, delta)
        self._refuse_cut(base, delta, end, size, self._after(base, size))
        return end

    def _to_active(self) -> None:
        """Read from the newest segment (a read-only handle's `end`)."""
        if self._rnext == _NO_SEGMENT and not self._sealed():
            return
        newest = self.segments()[-1][0]
        self._switch_read(newest, _NO_SEGMENT)
        self._walked = False

    @property
    def start(self) -> int:
        """The position of the first record still retained (later than `origin` once
        compaction removed segments)."""
        segments = self.segments()
        return segments[0][0] if segments else FIRST_BASE

    @property
    def origin(self) -> int:
        return FIRST_BASE

    # -- waiting -------------------------------------------------------------------------------

    def _ready(self, position: int) -> bool:
        if not self._rbase <= position < self._rnext:
            return True  # in another segment: a read decides
        size = os.lseek(self._rfd, 0, _SEEK_END) + self._rdelta
        if size <= position:
            return self._sealed()  # (or the records go on in the next segment)
        committed = self._words[COMMITTED_WORD]
        if (position, size, committed) == self._stall:
            return False
        if position >= committed:  # zeros written ahead here, or an append being written
            head = os.pread(self._rfd, FRAME_HEADER_SIZE, position - self._rdelta)
            if head == ZERO_HEADER:
                return self._sealed()
        return True

    def _stalled_in_flight(self, position: int) -> bool:
        """Whether a read stopped at `position` on an append being written. Its COMMITTED
        word, which ends the stall, is stored after the write's own IN_MODIFY (which the
        waiter may already have consumed): the wait polls instead of sleeping on it."""
        stall = self._stall
        words = self._words
        return stall[0] == position and words[self._pending_word] != words[COMMITTED_WORD]

    def wait(self, position: int, timeout: float) -> bool:
        if self._stale:
            self._revive()
        if self._ready(position):
            return True
        if timeout <= 0:
            return False
        if self._waiter is None or self._waiter_base != self._rbase:
            if self._waiter is not None:
                self._waiter.close()
                self._waiter = None
            self._waiter = make_waiter(segment_path(self.path, self._rbase))
            self._waiter_base = self._rbase
        waiter = self._waiter
        deadline = monotonic() + timeout
        while True:
            step = timeout
            if self._stalled_in_flight(position):
                step = min(timeout, STALL_POLL)
            if waiter.wait(lambda: self._ready(position), step):
                return True
            timeout = deadline - monotonic()
            if timeout <= 0:
                return False

    def __enter__(self) -> FileLog:
        return self

    def __repr__(self) -> str:
        return f"FileLog({self.path!r}, durability={self.durability.value})"


def _default_topic(path: str) -> str:
    """A topic name for a log opened without an identity: the file's stem, cut to fit."""
    name = Path(path).stem.encode()[: framing.TOPIC_SIZE].replace(b"\0", b"")
    return name.decode(errors="ignore")


def _create(path: str, max_record: int, identity: LogIdentity) -> framing.FileHeader:
    """Under the maintenance lock: write the header of a new (or empty) log; return it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        raw = os.pread(fd, FILE_HEADER_SIZE, 0)
        if raw:  # another process created it first (or it is not ours: decoding says so)
            return framing.decode_file_header(raw, path)
        header = framing.encode_file_header(max_record, identity.queue, identity.topic)
        os.pwrite(fd, header, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    directory = os.open(str(Path(path).parent), os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(directory)  # the new name must survive a power cut too
    finally:
        os.close(directory)
    return framing.FileHeader(max_record, identity.queue, identity.topic)
