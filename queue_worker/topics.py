"""The two topics as a worker sees them: opening them, and catching up on them.

tasks   A task's id is its index in the tasks log: the n-th record (counting from 0) is
        task n, whatever its type. `TaskIndex` remembers where each live task's record is
        (those at or above the claims fold's watermark), so a worker re-reads a payload only
        when it wins the task and keeps no payloads in memory.
claims  `ClaimsFollower` folds every record into a `ClaimState`, in log order, and can
        *settle* a record: read up to and including it, and return its verdict.

The server's clock (Redis)
--------------------------
A backend whose server stamps each record (`Entry.server_time_us`, set by the Redis log)
gives the protocol one clock for everyone: `on_server_clock` rewrites a decoded claims
record so that its `at` is the server's time, and a FAIL's `retry_at` keeps its distance
from `at` (the backoff the writer chose, measured on the server's clock). Every reader does
the same rewrite from the same entries, so the fold is still a pure function of the log.
The bytes in the log keep the writer's own `at` as evidence. A worker then judges
`claimable(now)` on the server's clock too: it estimates its offset from the server's stamp
on its own CLAIM (see `Worker`). The file log sets no server time: `at` is the writer's.

Malformed records
-----------------
A claims record that does not decode is folded as `Unknown(MALFORMED)`: it changes nothing
but the position (Rule 6), the same for every reader, and the follower counts it. A task
record that does not decode still has its id; the worker that wins it fails it for good
with the decode error, so the queue drains and the report shows why. A task record of a
type this version does not know (`Unknown`, from a newer writer) is left alone for a worker
that knows it.
"""

from __future__ import annotations

import bisect
import functools
import gc
import itertools
import operator
import time
from array import array
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple, cast

from logstore import Durability, Entry, IdentityError, Log, LogError, open_log
from logstore.base import SpanDecoder, SpanRead
from logstore.location import shown
from queue_worker.errors import QwError
from queue_worker.partition_layout import PartitionError, read_manifest
from queue_worker.protocol import claims_span
from queue_worker.protocol.records import (
    ClaimsRecord,
    Fail,
    RecordDecodeError,
    TaskRecord,
    Unknown,
    decode_claims,
    decode_claims_entries,
    decode_task,
)
from queue_worker.protocol.topic_names import CLAIMS_TOPIC as CLAIMS_TOPIC
from queue_worker.protocol.topic_names import OPS_TOPIC as OPS_TOPIC
from queue_worker.protocol.topic_names import TASKS_TOPIC as TASKS_TOPIC
from queue_worker.protocol.topic_names import TOPICS as TOPICS

if TYPE_CHECKING:  # the fold is imported where a follower is made: not by a producer
    from queue_worker.protocol.state import ClaimState, Outcome


_new: Final = tuple.__new__

#: the type code a claims record that does not decode is folded as
MALFORMED: Final = "?malformed"

# Not Final, these two: the tests set them on the module.
#: records read per call while catching up
READ_BATCH = 4096

#: TaskIndex.keep_payloads: how many TASK records' bytes are kept, and up to what size
KEEP_MAX_RECORDS = 4096
KEEP_MAX_BYTES: Final = 1024

#: how long settling waits for a record it has appended to become readable
SETTLE_TIMEOUT_S: Final = 10.0


class SettleError(LogError, QwError):
    """A record this process appended did not show up in the log where it should."""


def open_topic(
    location: str | Path,
    topic: str,
    durability: Durability = Durability.COMMIT,
    *,
    read_only: bool = False,
    create: bool = True,
) -> Log:
    """Open one topic of the queue at `location`: refused (IdentityError) when it is not a
    log of the same queue as the queue's other logs there, or is another topic's log.
    `read_only`: create and write nothing (for the commands that only look). `create=False`:
    the queue must exist (`open_log`).

    A partitioned queue's location is refused (PartitionError): its topics are those of
    each partition, at `queue_worker.partition_layout.partition_location`."""
    _refuse_partitioned(location)
    return open_log(location, topic, durability, family=TOPICS, read_only=read_only, create=create)


def _refuse_partitioned(location: str | Path) -> None:
    manifest = read_manifest(location)
    if manifest is not None:
        raise PartitionError(
            f"{shown(location)} holds a queue of {manifest.count} partitions: a command that "
            "works one topic must name a partition (tasks are named PARTITION:ID)"
        )


def open_topics(
    location: str | Path, durability: Durability = Durability.COMMIT, *, read_only: bool = False
) -> tuple[Log, Log]:
    """Open (creating if needed, unless `read_only`) the tasks and claims logs at
    `location`, as one queue's."""
    tasks = open_topic(location, TASKS_TOPIC, durability, read_only=read_only)
    try:
        claims = open_topic(location, CLAIMS_TOPIC, durability, read_only=read_only)
    except BaseException:
        tasks.close()
        raise
    return tasks, claims


def open_ops(
    location: str | Path,
    durability: Durability = Durability.COMMIT,
    *,
    read_only: bool = False,
    create: bool = True,
) -> Log:
    """Open the ops log at `location` (see queue_worker.ops): a topic of the queue like the
    others, so it carries the queue's identity."""
    return open_topic(location, OPS_TOPIC, durability, read_only=read_only, create=create)


def check_tasks_cover(tasks_log: Log, known_tasks: int, claims_log: Log, state: ClaimState) -> None:
    """Raise IdentityError when the claims fold closed a task the tasks log does not have.

    A worker claims only tasks it has read, so the tasks log always holds every task the
    claims log closes; a tasks log shorter than that was cut or replaced, and tasks enqueued
    now would get the ids of tasks already done. Call it with `known_tasks` read *after*
    the claims were folded."""
    highest = state.highest_closed()
    if highest is not None and highest >= known_tasks:
        raise IdentityError(
            f"{tasks_log.name} holds {known_tasks} task{'s' * (known_tasks != 1)}, but "
            f"{claims_log.name} closed task {highest}: the tasks log was cut short or replaced"
        )


def on_server_clock(record: ClaimsRecord, server_time_us: int) -> ClaimsRecord:
    """The record as the fold must judge it on a backend whose server stamps records."""
    kind = type(record)
    if kind is Unknown:
        return record
    if kind is Fail:
        assert isinstance(record, Fail)
        if record.retry_at is not None:
            shift = server_time_us - record.at
            return record._replace(at=server_time_us, retry_at=record.retry_at + shift)
    # Every other type has `at` third: rebuilt as a tuple (a NamedTuple's _replace costs
    # ~1.5 µs, and every reader stamps every record on Redis).
    fields: tuple[object, ...] = record
    return _new(kind, (fields[0], fields[1], server_time_us, *fields[3:]))


def decode_claims_entry(entry: Entry) -> ClaimsRecord:
    """Decode one claims-log entry, on the server's clock when the backend sets one.
    Raises RecordDecodeError for a malformed record."""
    record = decode_claims(entry.data)
    if entry.server_time_us is not None:
        return on_server_clock(record, entry.server_time_us)
    return record


def claims_entries(entries: list[Entry]) -> list[ClaimsRecord | None]:
    """The records of a read's entries as a follower folds them: None for a malformed one
    (which the fold decodes again, to say what is wrong), each on the server's clock where
    the backend stamps one."""
    records, _, stamped = decode_claims_entries(entries)
    if not stamped:
        return records
    return [
        record
        if record is None or entry.server_time_us is None
        # (a record decoded as None stays None; the fold names it)
        else on_server_clock(record, entry.server_time_us)
        for record, entry in zip(records, entries, strict=True)
    ]


@functools.cache
def claims_decoder() -> SpanDecoder:
    """How a fold reader's reads decode the claims log (`Log.read_span`): a file log's frames
    where they lie (`claims_span`: in C when built), any other log's entries. Made once."""
    return SpanDecoder(claims_entries, claims_span.loop())


def read_through(log: Log, start: int, position: int, timeout: float) -> Iterator[Entry]:
    """The entries from `start` up to and including the one at `position`.

    The record at `position` was appended by this process, so it is readable once the append
    has returned; the wait is only a guard against a backend that lags. Raises SettleError
    when it is not there within `timeout` seconds, or when the log skips over `position`.
    """
    deadline = time.monotonic() + timeout
    next_position = start
    while True:
        entries = log.read(next_position, READ_BATCH)
        for entry in entries:
            if entry.position > position:
                raise SettleError(f"{log.name}: no record at position {position}")
            yield entry
            if entry.position == position:
                return
            next_position = entry.next
        if not entries:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SettleError(
                    f"{log.name}: the record at position {position} did not become readable "
                    f"within {timeout}s"
                )
            log.wait(next_position, remaining)


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector held off while records are read and folded.

    Every record makes several short-lived containers (its entry, msgpack's list, the
    record, a lease), and the collector runs every few hundred of them to look for cycles
    that a fold never makes: ~1 µs of a catch-up's ~6 µs a record, measured
    (bench.fold_bench). Reference counting still frees everything at once; the collector
    runs again as soon as the fold returns (it is process-wide: nested uses leave it to the
    outermost)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class Settled(NamedTuple):  # a NamedTuple: `dataclasses` (with inspect) is ~15 ms to import
    """A record this worker appended, with the verdict the fold gave it."""

    outcome: Outcome
    record: ClaimsRecord  # as the fold saw it (on the server's clock where there is one)
    entry: Entry


class ClaimsFollower:
    """The fold over the claims log, caught up incrementally."""

    def __init__(self, start: int, state: ClaimState | None = None) -> None:
        from queue_worker.protocol.state import ClaimState

        self.state = state if state is not None else ClaimState()
        self.next_position = start  # where the next unread record is
        self.malformed = 0
        self.last_malformed: str | None = None

    @property
    def last_position(self) -> int | None:
        """The position of the last record folded (None: none yet)."""
        position = self.state.position
        return position if position >= 0 else None

    def apply(
        self, entry: Entry, known: ClaimsRecord | None = None
    ) -> tuple[Outcome, ClaimsRecord]:
        """Fold one entry. `known`: the record its bytes encode, when the caller wrote them
        (its own appends: decoding what it has just encoded would only cost time)."""
        if known is not None:
            record = known
            if entry.server_time_us is not None:
                record = on_server_clock(record, entry.server_time_us)
        else:
            try:
                record = decode_claims_entry(entry)
            except RecordDecodeError as e:
                self.malformed += 1
                self.last_malformed = f"malformed claims record at position {entry.position}: {e}"
                record = Unknown(MALFORMED)
        outcome = self.state.apply(record, entry.position)
        self.next_position = entry.next
        return outcome, record

    def catch_up(self, log: Log) -> int:
        """Fold every record now in the log; return how many were folded."""
        count = 0
        decoder = claims_decoder()
        with gc_paused():  # the read's records too (see gc_paused)
            # records and positions as the log decodes them (a file log: straight from its
            # frames, no entries; claims_span)
            while found := log.read_span(self.next_position, READ_BATCH, decoder):
                self._fold_span(log, found)
                count += len(found)
        return count

    def _fold_span(self, log: Log, found: SpanRead) -> None:
        """Fold what a span read found (records, None for a malformed one)."""
        records: list[ClaimsRecord | None] = found.items
        if None in records:
            # rare: fold the same records read as entries, which say what is wrong
            # (`_malformed`); the catch-up goes on from where they end
            self._fold_entries(log.read(self.next_position, len(records)))
            return
        self.state.apply_all(cast("list[ClaimsRecord]", records), found.positions)
        self.next_position = found.next

    def fold_entries(self, entries: Sequence[Entry]) -> None:
        """Fold entries read in order from `next_position` on (none of them ours to settle).

        Every worker folds every record, so this is a drain's hot path: the entries are
        decoded in one loop (`decode_claims_entries`) and folded in another
        (`ClaimState.apply_all`), with no verdict built for a record nobody asked about.
        """
        if not entries:
            return
        # gc_paused, written out: a settle folds the others' few records here once a task,
        # and the generator context manager cost more than folding them (~9k instructions
        # a use against ~17k for a fold of two records, callgrind, 2-worker drain)
        if not gc.isenabled():
            self._fold_entries(entries)
            return
        gc.disable()
        try:
            self._fold_entries(entries)
        finally:
            gc.enable()

    def _fold_entries(self, entries: Sequence[Entry]) -> None:
        # the records, their positions, and whether any entry carries a server time: one
        # pass over the entries (in C when built)
        records, positions, stamped = decode_claims_entries(entries)
        if None in records:
            records = self._malformed(records, entries)
        if stamped:  # stamped by the server: on its clock (apply's way)
            times = list(map(_SERVER_TIME, entries))
            records = [
                record if time_us is None or record is None else on_server_clock(record, time_us)
                for record, time_us in zip(records, times, strict=True)
            ]
        self.state.apply_all(cast("list[ClaimsRecord]", records), positions)  # no None left
        self.next_position = entries[-1].next

    def _malformed(
        self, records: list[ClaimsRecord | None], entries: Sequence[Entry]
    ) -> list[ClaimsRecord | None]:
        """The records with each malformed one (None) folded as Unknown(MALFORMED), as
        `apply` does: counted, and the last one's reason kept."""
        fixed: list[ClaimsRecord | None] = []
        for record, entry in zip(records, entries, strict=True):
            if record is None:
                try:
                    record = decode_claims(entry.data)  # raises, naming what is wrong
                except RecordDecodeError as e:
                    self.malformed += 1
                    self.last_malformed = (
                        f"malformed claims record at position {entry.position}: {e}"
                    )
                    record = Unknown(MALFORMED)
            fixed.append(record)
        return fixed

    def settle(
        self,
        log: Log,
        position: int,
        mine: ClaimsRecord | None = None,
        timeout: float = SETTLE_TIMEOUT_S,
    ) -> Settled:
        """Fold up to and including the record at `position` (one this worker appended:
        `mine`, when given, is that record, which then need not be decoded)."""
        return self.settle_batch(log, [(position, mine)], timeout)[0]

    def settle_batch(
        self,
        log: Log,
        mine: list[tuple[int, ClaimsRecord | None]],
        timeout: float = SETTLE_TIMEOUT_S,
        read: Sequence[Entry] = (),
    ) -> list[Settled]:
        """`settle` for several of our records (position, record or None) in log order, in
        one pass over the log (a batch appended at once: the read that finds one finds the
        rest). `read`: entries already read from `next_position` on (by the append's own
        call, see `Log.append_and_read`), folded before the log is read for the rest."""
        settled: list[Settled] = []
        index = 0
        position, record = mine[0]
        last = mine[-1][0]
        others: list[Entry] = []  # read, not ours: folded in one go before our next record
        for entry in _chain_read(read, log, self, last, timeout):
            if entry.position > last:
                self.fold_entries(others)
                raise SettleError(f"{log.name}: no record at position {last}")
            if entry.position != position:
                others.append(entry)
                continue
            self.fold_entries(others)
            others = []
            outcome, folded = self.apply(entry, record)
            settled.append(_new(Settled, (outcome, folded, entry)))
            index += 1
            if index < len(mine):
                position, record = mine[index]
            if entry.position == last:
                break
        self.fold_entries(others)
        if len(settled) != len(mine):
            raise SettleError(f"{log.name}: no record at position {position}")
        return settled

    def append_and_settle(
        self, log: Log, records: Sequence[ClaimsRecord], data: Sequence[bytes], *, durable: bool
    ) -> list[Settled]:
        """Append our `records` (encoded as `data`) as one batch and settle them: on a log
        that reads in the append's own call (Redis), one round trip in all."""
        read: Sequence[Entry]
        if type(log).append_and_read is Log.append_and_read:
            # The default, which reads nothing in the append's call (a file log's): its
            # append alone, without the Python call around it (~1.5k instructions a task).
            positions, read = log.append_many(data, durable=durable), ()
        else:
            positions, read = log.append_and_read(
                data, self.next_position, durable=durable, max_records=READ_BATCH
            )
        if len(positions) != len(records):
            raise ValueError(f"{log.name}: {len(positions)} positions for {len(records)} records")
        mine: list[tuple[int, ClaimsRecord | None]] = list(zip(positions, records, strict=True))
        if not read:  # (a backend that stamps records reads them in the append: Redis)
            return self._settle_span(log, mine, data)
        return self.settle_batch(log, mine, read=read)

    def _settle_span(
        self,
        log: Log,
        mine: list[tuple[int, ClaimsRecord | None]],
        data: Sequence[bytes],
        timeout: float = SETTLE_TIMEOUT_S,
    ) -> list[Settled]:
        """`settle_batch` of the records we have just appended (`data`) to a log whose append
        read nothing back (a file log's), read as `catch_up` reads it: the others' records
        decoded as the log decodes them (`Log.read_span`: a file log's where its frames lie,
        no Entry each), and folded in runs (`ClaimState.apply_all`);
        ours one by one, for their verdicts. The same fold, to the same position (up to and
        including our last record), the same errors."""
        decoder, state = claims_decoder(), self.state
        settled: list[Settled] = []
        index = 0
        deadline = time.monotonic() + timeout
        while True:
            found = log.read_span(self.next_position, READ_BATCH, decoder)
            records, positions = found.items, found.positions
            if not records:
                position = mine[index][0]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SettleError(
                        f"{log.name}: the record at position {position} did not become "
                        f"readable within {timeout}s"
                    )
                log.wait(self.next_position, remaining)
                continue
            if None in records:  # rare: a malformed record, which the entries' fold names
                return settled + self.settle_batch(log, mine[index:], timeout)
            begin = 0
            while index < len(mine):
                position, record = mine[index]
                at = bisect.bisect_left(positions, position, begin)
                if at == len(positions):
                    break  # ours is further on: fold these, read on
                if begin < at:
                    state.apply_all(records[begin:at], positions[begin:at])
                    self.next_position = positions[at]
                if positions[at] != position:
                    raise SettleError(f"{log.name}: no record at position {position}")
                after = positions[at + 1] if at + 1 < len(positions) else found.next
                entry = _new(Entry, (position, after, data[index], None))
                outcome, folded = self.apply(entry, record if record is not None else records[at])
                settled.append(_new(Settled, (outcome, folded, entry)))
                index += 1
                begin = at + 1
            if index == len(mine):
                return settled  # (the records read after our last are left for later)
            if begin < len(records):
                state.apply_all(records[begin:], positions[begin:])
            self.next_position = found.next


def _chain_read(
    read: Sequence[Entry], log: Log, follower: ClaimsFollower, last: int, timeout: float
) -> Iterator[Entry]:
    """The entries of `read`, then (unless they reach `last`) the log's from where the
    follower has folded to, through `last` (see `read_through`)."""
    start = follower.next_position  # (the caller may fold what it is given later)
    for entry in read:
        if entry.position < start:
            continue  # not ours to fold twice (a prefix the caller read before)
        yield entry
        if entry.position >= last:
            return
        start = entry.next
    yield from read_through(log, start, last, timeout)


# an entry's server time (Entry is a tuple), fetched in C by `map` rather than by a Python loop
_SERVER_TIME: Final = operator.itemgetter(3)

#: the first bytes of a TASK record of this schema: msgpack [1, "T", payload, enqueued_at]
_TASK_PREFIX: Final = b"\x94\x01\xa1T"
#: ... and of a task by name (type "N"): neither is decoded to be indexed (a task with a
#: delay or a priority, type "S", is: the pick reads its time and priority)
_TASK_PREFIXES: Final = (_TASK_PREFIX, b"\x96\x01\xa1N")

#: TaskIndex: settled positions are dropped from the front of the array once at least this
#: many, and at least half the array, are settled: each drop moves the live part once, so
#: the cost per task stays constant, and the array holds at most twice the live tasks (plus
#: this many). Not Final: a test sets it on the module (as READ_BATCH).
COMPACT_MIN_TASKS = 4096


class TaskSettledError(QwError):
    """A task below the index's watermark was asked for: it is settled (done or dead) and
    its record is no longer indexed. A worker only loads a task its claim has just won,
    which is open, so this is a caller's bug."""


class TaskIndexSnapshot(NamedTuple):
    """Everything a TaskIndex holds (what a checkpoint saves); `positions` is a copy."""

    next_position: int
    first: int | None  # the position of task 0's record (None: no task yet)
    last: int | None  # the position of the last task's record
    base: int  # the id of positions[0]: every task below it is settled
    settled: int  # every task below it is settled (>= base: the front is dropped lazily)
    positions: array[int]  # task id - base -> log position of its record
    foreign: tuple[int, ...]
    unreadable: tuple[tuple[int, str], ...]
    #: (task, not_before, priority) of each task with a delay or a priority (type "S")
    scheduled: tuple[tuple[int, int, int], ...] = ()
    #: (key, task) of the first task of each key, and (task, first) of each later one
    keys: tuple[tuple[str, int], ...] = ()
    duplicates: tuple[tuple[int, int], ...] = ()
    #: (task, its dependencies) of each task with dependencies (type "A")
    after: tuple[tuple[int, tuple[int, ...]], ...] = ()
    #: (dead task, the first task that retries it) of each task retried (`retry_of`)
    retried: tuple[tuple[int, int], ...] = ()

    @property
    def known(self) -> int:
        return self.base + len(self.positions)


class TaskIndex:
    """Where each live task's record is in the tasks log, and which tasks cannot be run here.

    Memory depends on the live tasks, not on history: the worker tells the index the claims
    fold's watermark (`settle_below`: every task below it is done or dead, for ever), and
    the index forgets those tasks. It keeps the positions of tasks `base` .. `known` - 1 in
    one array (8 bytes a task), dropping the settled front in amortised steps
    (COMPACT_MIN_TASKS); a question about a task below the watermark answers "settled"
    (`position_of` → None) instead of keeping its position. Foreign and unreadable tasks
    below it are forgotten as well: no one will run them.
    """

    def __init__(self, start: int) -> None:
        self.next_position = start
        self._base = 0  # the id of _positions[0]
        self._positions = array("q")  # task id - _base -> log position of its record
        self._settled = 0  # every task below this is settled (the fold's watermark, as told)
        self._first: int | None = None  # task 0's position (the checkpoint checks it)
        self._last: int | None = None  # the last task's position
        self.foreign: set[int] = set()  # a record type from a newer writer: not ours to run
        self.unreadable: dict[int, str] = {}  # task id -> why its record does not decode
        #: task id -> (not_before, priority) of a task with a delay or a priority: what the
        #: pick reads (`queue_worker.worker.pick.Scheduled`); every other task has (0, 0)
        self.scheduled: dict[int, tuple[int, int]] = {}
        #: key -> the first task of that key (for ever: a key resolves to its first task
        #: however long ago it ran), and task -> the first task of its key, for the later ones
        self.keys: dict[str, int] = {}
        self.duplicates: dict[int, int] = {}
        #: task -> the earlier tasks it waits for (`enqueue(after=…)`): what the pick reads
        #: (`queue_worker.worker.dependencies`)
        self.after: dict[int, tuple[int, ...]] = {}
        #: dead task -> the first task that retries it (for ever, as the keys: `qw retry`
        #: never retries a dead task twice, however long ago its retry was enqueued)
        self.retried: dict[int, int] = {}
        # The bytes of small TASK records this worker is likely to run (`keep_payloads`),
        # so that winning one does not cost a read of the log (a tenth of a no-op task).
        self._kept: OrderedDict[int, bytes] = OrderedDict()
        self._keep: tuple[int, int] | None = None  # (slot, slots) whose records are kept
        self._keep_limit = KEEP_MAX_RECORDS  # how many records at most

    @property
    def known(self) -> int:
        """How many tasks this worker has seen (ids 0 .. known-1)."""
        return self._base + len(self._positions)

    @property
    def settled(self) -> int:
        """Every task below this id is settled (done or dead): the watermark last told."""
        return self._settled

    @property
    def last_position(self) -> int | None:
        """The position of the last task's record (None: no task yet)."""
        return self._last

    @property
    def indexed(self) -> int:
        """How many task positions the index holds now (its memory: 8 bytes each)."""
        return len(self._positions)

    def catch_up(self, log: Log) -> int:
        """Index every record now in the log; return how many tasks are new."""
        before = self.known
        while entries := log.read(self.next_position, READ_BATCH):
            for entry in entries:
                self._index(entry)
        return self.known - before

    def _index(self, entry: Entry) -> None:
        task = self.known
        if task == 0:
            self._first = entry.position
        self._last = entry.position
        self.next_position = entry.next
        if task < self._settled and not self._positions:
            # Settled before we read it (another worker claimed and finished it first): a
            # task no one will run again; only its id is counted.
            self._base += 1
            return
        self._positions.append(entry.position)
        if entry.data.startswith(_TASK_PREFIXES):
            # A TASK as this version writes it: its payload is decoded only when the task is
            # won (`load`), not by every worker for every task (a quarter of a drain's CPU
            # at 8 workers, measured). A malformed one still fails for good at `load`.
            keep = self._keep
            if (
                keep is not None
                and task % keep[1] == keep[0]
                and len(entry.data) <= KEEP_MAX_BYTES
                and len(self._kept) < self._keep_limit
            ):
                self._kept[task] = entry.data
            return
        try:
            record = decode_task(entry.data)
        except RecordDecodeError as e:
            self.unreadable[task] = f"task record at position {entry.position} is malformed: {e}"
            return
        if isinstance(record, Unknown):
            self.foreign.add(task)
        else:
            if record.not_before or record.priority:
                self.scheduled[task] = (record.not_before, record.priority)
            if record.key is not None:
                first = self.keys.setdefault(record.key, task)
                if first != task:
                    self.duplicates[task] = first
            if record.retry_of is not None:
                self.retried.setdefault(record.retry_of, task)
            if record.after:
                later = [d for d in record.after if d >= task]
                if later:  # (no producer writes one: a cycle, or a wait for ever)
                    self.unreadable[task] = (
                        f"task record at position {entry.position} depends on task "
                        f"{later[0]}, which is not an earlier task"
                    )
                else:
                    self.after[task] = record.after

    def settle_below(self, watermark: int) -> None:
        """Every task below `watermark` is settled (the claims fold's watermark: done or
        dead, for ever): forget them. A lower watermark than before changes nothing."""
        if watermark <= self._settled:
            return
        self._settled = watermark
        drop = min(watermark, self.known) - self._base
        if drop == len(self._positions) or (
            drop >= COMPACT_MIN_TASKS and 2 * drop >= len(self._positions)
        ):
            del self._positions[:drop]
            self._base += drop
            self.forget_kept_below(self._base)
        if self.foreign:
            self.foreign = {t for t in self.foreign if t >= watermark}
        if self.unreadable:
            self.unreadable = {t: why for t, why in self.unreadable.items() if t >= watermark}
        if self.scheduled:
            self.scheduled = {t: s for t, s in self.scheduled.items() if t >= watermark}
        if self.duplicates:
            self.duplicates = {t: f for t, f in self.duplicates.items() if t >= watermark}
        if self.after:
            self.after = {t: a for t, a in self.after.items() if t >= watermark}

    def snapshot(self) -> TaskIndexSnapshot:
        """The index as values that do not change with it: `TaskIndex.restore` of it gives
        this index back."""
        return TaskIndexSnapshot(
            self.next_position,
            self._first,
            self._last,
            self._base,
            self._settled,
            array("q", self._positions),
            tuple(self.foreign),
            tuple(self.unreadable.items()),
            tuple((t, nb, p) for t, (nb, p) in self.scheduled.items()),
            tuple(self.keys.items()),
            tuple(self.duplicates.items()),
            tuple(self.after.items()),
            tuple(self.retried.items()),
        )

    @classmethod
    def restore(cls, snap: TaskIndexSnapshot) -> TaskIndex:
        """The index `snap` was taken of (its settled tasks below `base`). Raises ValueError
        for one no catch-up reaches."""
        if snap.positions.typecode != "q":
            raise ValueError(f"positions of type {snap.positions.typecode!r}; expected 'q'")
        known = snap.known
        if not 0 <= snap.base <= snap.settled:
            raise ValueError(f"first indexed task {snap.base}, settled below {snap.settled}")
        if (snap.first is None) != (known == 0) or (snap.last is None) != (known == 0):
            raise ValueError("the first and last task positions do not match the task count")
        if snap.first is not None and snap.last is not None:
            if not snap.first <= snap.last < snap.next_position:
                raise ValueError("the first and last task positions are out of order")
            if known == 1 and snap.first != snap.last:
                raise ValueError("one task at two positions")
        if snap.positions:
            if snap.positions[-1] != snap.last:
                raise ValueError("the last indexed position is not the last task's")
            if snap.base == 0 and snap.positions[0] != snap.first:
                raise ValueError("the first indexed position is not task 0's")
        index = cls(snap.next_position)
        index._base = snap.base
        index._settled = snap.settled
        index._positions = array("q", snap.positions)
        index._first, index._last = snap.first, snap.last
        index.foreign = set(snap.foreign)
        index.unreadable = dict(snap.unreadable)
        index.scheduled = {t: (not_before, priority) for t, not_before, priority in snap.scheduled}
        index.keys = dict(snap.keys)
        index.duplicates = dict(snap.duplicates)
        index.after = dict(snap.after)
        index.retried = dict(snap.retried)
        ids = [*index.foreign, *index.unreadable]
        # an unreadable record is never also foreign (`_index` stops at the decode error)
        if len(set(ids)) != len(snap.foreign) + len(snap.unreadable):
            raise ValueError("a task listed twice among foreign and unreadable tasks")
        if any(not snap.base <= t < known for t in ids):
            raise ValueError("a foreign or unreadable task that is not indexed")
        return index

    def is_settled(self, task: int) -> bool:
        """Is `task` below the watermark the index was told (done or dead, forgotten)?"""
        return 0 <= task < self._settled

    def position_of(self, task: int) -> int | None:
        """The position of `task`'s record; None when it is settled (below the watermark:
        no longer indexed). Raises IndexError for a task not yet known."""
        if not 0 <= task < self.known:
            raise IndexError(f"task {task} is not indexed (known: {self.known})")
        if task < self._settled:
            return None
        return self._positions[task - self._base]

    def keep_payloads(self, slot: int, slots: int, limit: int | None = None) -> None:
        """Keep the bytes of small TASK records of ids in `slot` of `slots` as they are
        indexed (at most `limit`, KEEP_MAX_RECORDS by default), for `load`;
        `forget_kept_below` drops them. Records kept before (an index folded for every
        slot, then inherited by one worker: see `queue_worker.worker.inherited`) stay only when
        they are in `slot` and within `limit`."""
        self._keep = (slot, slots)
        self._keep_limit = limit = KEEP_MAX_RECORDS if limit is None else limit
        kept = self._kept
        if kept:  # (a look-up per id of the slot: a tenth of a pass over every kept record)
            first, last = next(iter(kept)), next(reversed(kept))
            ids = range(first + (slot - first) % slots, last + 1, slots)
            mine = ((t, kept[t]) for t in ids if t in kept)
            self._kept = OrderedDict(itertools.islice(mine, limit))

    def forget_kept_below(self, task: int) -> None:
        """Drop the kept records of ids below `task` (closed: no one will run them)."""
        kept = self._kept
        while kept and next(iter(kept)) < task:
            kept.popitem(last=False)

    def load(self, log: Log, task: int) -> TaskRecord:
        """Read task `task`'s record again. Raises RecordDecodeError if it is unreadable,
        TaskSettledError if it is settled (below the watermark)."""
        if task in self.unreadable:
            raise RecordDecodeError(self.unreadable[task])
        data = self._kept.pop(task, None)
        if data is None:
            position = self.position_of(task)
            if position is None:
                raise TaskSettledError(f"task {task} is settled: its record is not indexed")
            entries = log.read(position, 1)
            if not entries or entries[0].position != position:
                raise LogError(f"{log.name}: task {task} is no longer at position {position}")
            data = entries[0].data
        record = decode_task(data)
        if not isinstance(record, TaskRecord):
            raise RecordDecodeError(f"task {task} is a record of unknown type {record.code!r}")
        first = self.duplicates.get(task)
        return record if first is None else record._replace(resolves_to=first)
