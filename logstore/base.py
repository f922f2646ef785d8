"""The interface every log backend keeps: an ordered, append-only sequence of opaque records.

A log knows nothing of tasks. It stores byte strings in the order they were appended and
gives each one a *position*: an integer that grows with the order of the records. A record's
position never changes once an append has returned it, and every reader of the same log sees
the same records at the same positions in the same order.

Positions are opaque to callers beyond three facts: they are non-negative integers, a later
record has a larger position, and `Entry.next` is the position to read from after an entry.
(The file log uses byte offsets; the Redis log packs the stream entry id into an integer.)

`Entry.server_time_us` is set by backends whose server stamps each record with its own clock
(Redis): the protocol then judges lease expiry by that single clock instead of the writer's.
"""

import enum
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, NamedTuple


class LogError(Exception):
    """The root of every error a log backend raises."""


class CorruptLogError(LogError):
    """A record before the tail is damaged; `path` and `offset` say where."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path}: corrupt record at byte offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class PositionCompactedError(LogError):
    """A read from a position whose records were removed by compaction (their segment was
    settled history and is gone). Not damage: restart from the fold checkpoint, which
    covers everything before `start`, the first position still retained."""

    def __init__(self, name: str, position: int, start: int) -> None:
        super().__init__(
            f"{name}: position {position} was compacted away; the log now starts at {start} "
            "(restart from the fold checkpoint)"
        )
        self.name = name
        self.position = position
        self.start = start


class ForeignFileError(LogError):
    """The file exists but is not a qw log (or is a version this code cannot read)."""


class RecordTooLargeError(LogError):
    """An append was refused because one record exceeds the backend's maximum size."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"record of {size} bytes exceeds the maximum record size {limit} bytes")
        self.size = size
        self.limit = limit


class AppendError(LogError):
    """An append could not be completed (disk full, file too large, connection lost).

    The file log guarantees that nothing of the failed append is visible to readers. A
    networked backend cannot always know: when a reply was lost after the request was sent,
    its message says that the append may still have been made.
    """


class LogClosedError(LogError):
    """The log was used after `close()`."""


class Durability(enum.Enum):
    """When appended records are forced to stable storage.

    NONE    never forced: survives a killed process (the OS has the bytes), not a power cut.
    COMMIT  records appended with ``durable=True`` (enqueued tasks, completions) are forced
            before the append returns; concurrent forcers are grouped into one flush.
    ALWAYS  every append is forced before it returns (grouped the same way).
    """

    NONE = "none"
    COMMIT = "commit"
    ALWAYS = "always"

    @classmethod
    def parse(cls, text: str) -> "Durability":
        try:
            return cls(text)
        except ValueError:
            choices = ", ".join(d.value for d in cls)
            raise ValueError(f"unknown fsync policy {text!r}; expected one of: {choices}") from None


class Entry(NamedTuple):
    """One record as read back: where it is, where the next one starts, and its bytes.

    A NamedTuple, not a frozen dataclass: a reader builds one per record, and a frozen
    dataclass builds itself through object.__setattr__ (several times slower, measured).
    """

    position: int
    next: int
    data: bytes
    server_time_us: int | None = None


#: (items, positions, pos, batch_start, ready): a framed backend's span loop, which walks the
#: frames of a buffer and makes each payload an item where it lies (`logstore.file.framing`)
SpanResult = tuple[list[Any], list[int], int, int, int]
SpanLoop = Callable[[bytes, int, int, int, int], SpanResult]


class SpanDecoder(NamedTuple):
    """How a reader that decodes every record it reads wants them decoded (`Log.read_span`).

    `entries` makes a batch of entries, as `read` returns them, into one item each (on the
    server's clock where the entries carry one); any backend can use it. `frames`, when
    given, makes the same items straight from a framed backend's bytes (the file log's), with
    no Entry built and no payload copied. The two give equal items for the same records."""

    entries: Callable[[list[Entry]], list[Any]]
    frames: SpanLoop | None = None


class SpanRead:
    """What `Log.read_span` found: the items, their positions, and the position after the
    last one (where the next read starts; `position` itself when none was found)."""

    __slots__ = ("items", "next", "positions")

    def __init__(self, items: list[Any], positions: list[int], next: int) -> None:
        self.items = items
        self.positions = positions
        self.next = next

    def __len__(self) -> int:
        return len(self.items)


class Log(ABC):
    """An append-only log of opaque byte records (one topic, one partition).

    Implementations are safe to use from several processes at once (each opens its own
    handle); one handle is used by one thread at a time unless the backend says otherwise.
    """

    #: a short name for messages: a file path, a redis URL and stream key, "memory:…"
    name: str
    #: whether every read checks each record it returns whole (the file log's checksums):
    #: what a reader has read needs no `check` again
    reads_check_records: bool = False
    #: who decides the claims: "client" (every reader folds the log) or "server" (a server
    #: decides each claim as it appends it: Redis with server verdicts)
    verdicts: str = "client"

    @abstractmethod
    def append(self, data: bytes, *, durable: bool = False) -> int:
        """Append one record and return its position.

        `durable` marks a record that must not be forgotten (an enqueued task, a completion):
        under the COMMIT policy it is forced to stable storage before this returns.
        """

    @abstractmethod
    def append_many(self, records: Sequence[bytes], *, durable: bool = False) -> list[int]:
        """Append several records as one contiguous run (no other writer's record between
        them) and return their positions in order. All or nothing: on an error none is
        visible."""

    def append_and_read(
        self, records: Sequence[bytes], read_from: int, *, durable: bool = False, max_records: int
    ) -> tuple[list[int], list[Entry]]:
        """`append_many`, and the entries from `read_from` on that the backend reads in the
        same call: a prefix (at most `max_records`) of what `read(read_from)` returns once
        the append has returned, possibly empty — the caller reads on from there. A
        networked log (Redis) reads them in the append's own round trip; this default reads
        nothing."""
        return self.append_many(records, durable=durable), []

    @abstractmethod
    def read(self, position: int, max_records: int | None = None) -> list[Entry]:
        """The complete records at or after `position`, in order (at most `max_records`).

        `position` must be the start of the log, a position returned by append, or an
        `Entry.next`. Returns an empty list when nothing more is there yet. Never returns an
        incomplete or damaged record: an incomplete tail is "nothing yet"; damage before the
        tail raises `CorruptLogError`.
        """

    @abstractmethod
    def wait(self, position: int, timeout: float) -> bool:
        """Block until a record at or after `position` may be readable, or `timeout` seconds
        pass. True means "read again" (it may rarely be a spurious wake-up); False means the
        timeout passed with nothing new. Uses no CPU to speak of while it waits."""

    @property
    @abstractmethod
    def start(self) -> int:
        """A position at or before the first record: where a reader starts."""

    @property
    def origin(self) -> int:
        """Where the log's first record ever was: `start` until compaction removes records
        (then `start` is later). A fold that begins at `start` is whole only when they agree."""
        return self.start

    @abstractmethod
    def end(self) -> int:
        """A position after the last complete record, as far as this handle knows: reading
        from it returns only records appended later. The next append lands at or after it
        (exactly at it on the file log; Entry.next is likewise a lower bound, not always the
        next record's position)."""

    @abstractmethod
    def close(self) -> None:
        """Release the handle's resources. Idempotent."""

    def read_span(self, position: int, max_records: int, decoder: SpanDecoder) -> SpanRead:
        """`read`, with the records decoded by `decoder` as they are read: the items and
        their positions (for a reader that folds every record). This default decodes the
        entries `read` returns; the file log decodes its frames where they lie."""
        entries = self.read(position, max_records)
        if not entries:
            return SpanRead([], [], position)
        return SpanRead(decoder.entries(entries), [e.position for e in entries], entries[-1].next)

    def local_bytes(self) -> int | None:
        """The bytes of the log's first stored piece on this machine's disk (the file log's
        first segment), or None for a log read over a network: for a reader deciding whether
        reading it from the start is cheap."""
        return None

    def drop_before(self, position: int) -> int:
        """Remove records before `position` (a record's position) in whatever units the
        backend removes: the file log, each sealed segment that ends at or before it; Redis,
        every stream entry before it. The caller has made sure nothing needs them. Returns
        a position that every removed record is before and every kept one at or after."""
        raise NotImplementedError(f"{self.name}: this log cannot remove records")

    def iter_from(self, position: int, batch: int = 4096) -> Iterator[Entry]:
        """Every complete record from `position` to the current end, in order."""
        while True:
            entries = self.read(position, batch)
            if not entries:
                return
            yield from entries
            position = entries[-1].next

    def check(self, start: int | None = None) -> int:
        """Read every record from `start` (None: the log's start) to the end now, so that
        damage anywhere there raises CorruptLogError (a start-up check); return the end.
        `start` is a record's position: a reader that knows the records before it whole
        (a fold checkpoint's checksum of them) checks only the rest. Writes nothing."""
        position = self.start if start is None else max(start, self.start)
        for entry in self.iter_from(position):
            position = entry.next
        return position

    def verify_history(self) -> str | None:
        """Check what a backend can tell beyond its reads: that the log still holds every
        record it held since its start but those compaction removed (which the fold
        checkpoint accounts for). Raises LostHistoryError (logstore.identity) when records
        are gone that nothing accounts for; returns what was verified, in a few words, or
        None when the backend has nothing to check here."""
        return None

    def checksum(self, start: int, end: int, seed: int = 0) -> int:
        """A crc32 over the records from `start` up to `end` (positions and bytes), from
        `seed`: it changes when any record there changes. A backend may checksum its own
        representation instead (the file log: the raw bytes); the same backend always
        gives the same value for the same records."""
        crc = seed
        for entry in self.iter_from(start):
            if entry.position >= end:
                break
            crc = zlib.crc32(entry.data, zlib.crc32(entry.position.to_bytes(8, "little"), crc))
        return crc

    def __enter__(self) -> "Log":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
