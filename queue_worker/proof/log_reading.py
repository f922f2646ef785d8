"""Reading a queue's logs for the report and the commands that look at one task.

`qw status`, `qw task` and `qw why` need these readers and none of the report's replay
(queue_worker.proof.report, which re-exports them): its module, ten dataclasses built at import,
is ~20 ms of CPU that they no longer pay for. The checkpoint's modules are imported only
for logs that were compacted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

from logstore import Entry, Log, is_redis_url, open_log
from logstore.base import SpanDecoder
from queue_worker.errors import QwError
from queue_worker.partition_layout import one_partition_text
from queue_worker.protocol.records import (
    MAX_TASK_ID,
    RecordDecodeError,
    TaskRecord,
    Unknown,
    decode_task,
)
from queue_worker.topics import (
    CLAIMS_TOPIC,
    MALFORMED,
    READ_BATCH,
    TASKS_TOPIC,
    claims_decoder,
    claims_entries,
    decode_claims_entry,
    open_topic,
    open_topics,
)

if TYPE_CHECKING:
    from logstore.base import SpanLoop, SpanResult
    from logstore.file.log import FileLog, Verified
    from queue_worker.history.checkpoint import Location
    from queue_worker.history.prefix import Prefix
    from queue_worker.protocol.records import ClaimsRecord
    from queue_worker.protocol.state import ClaimSnapshot


#: what the C decoder gives, in `read_claims_batches(location, task)`'s reads, for a record
#: that is not one of the task's (not decoded; then left out of the batches): an Unknown,
#: which a fold passes over as it passes over a record of a type it does not know
OTHER_TASK: Final = Unknown("(another task's record)")


class ReportInputError(QwError):
    """The logs cannot be replayed: missing, corrupt, or holding something that is not ours."""


def has_logs(location: str | Path) -> bool:
    """Is there a qw queue at `location`: a data directory holding a log file (looked at,
    nothing opened), or a Redis database holding a non-empty stream of ours (the server is
    asked: a wrong database number or ?prefix= is "no logs", not an empty queue)? Raises
    LogError when the server cannot be asked."""
    text = str(location)
    if is_redis_url(text):
        for topic in (TASKS_TOPIC, CLAIMS_TOPIC):
            with open_log(text, topic) as log:
                start = log.start  # (a stream trimmed to nothing was a queue all the same)
                if log.end() != start or start != log.origin:
                    return True
        return False
    directory = Path(text)
    return any((directory / f"{topic}.log").is_file() for topic in (TASKS_TOPIC, CLAIMS_TOPIC))


def missing_logs_text(location: str | Path) -> str:
    """What to say when `has_logs(location)` is False."""
    text = str(location)
    partitioned = one_partition_text(location)
    if partitioned is not None:
        return partitioned
    if is_redis_url(text):
        from logstore.redis.log import RedisLog  # redis is an optional extra

        tasks, claims = RedisLog(text, TASKS_TOPIC), RedisLog(text, CLAIMS_TOPIC)
        tasks.close()
        claims.close()
        return (
            f"no qw logs at {tasks.url} (expected the streams {tasks.key} and {claims.key}; "
            "is it the right database number and ?prefix=?)"
        )
    return f"no qw logs at {text} (expected tasks.log and claims.log)"


def _open_existing(location: str | Path, topic: str) -> Log | None:
    """The topic's log, or None for a data directory that lacks it (never creates files)."""
    text = str(location)
    if not is_redis_url(text) and not (Path(text) / f"{topic}.log").exists():
        return None
    return open_topic(location, topic, read_only=True)


def count_tasks(location: str | Path, start: int | None = None) -> int:
    """How many tasks were published: every record of the tasks topic is one task id
    (`start`: count only the records from there)."""
    return counted_tasks(location, start)[0]


def counted_tasks(
    location: str | Path,
    start: int | None = None,
    options: list[tuple[int, TaskRecord]] | None = None,
) -> tuple[int, int | None]:
    """`count_tasks`, and the position of the last task counted (None: none). `options`,
    when given, receives (index among those counted, record) of each task with options (a
    key, dependencies: what the report proves of periodic ticks and of dependencies)."""
    log = _open_existing(location, TASKS_TOPIC)
    if log is None:
        return 0, None
    count, last = 0, None
    with log:
        for entry in log.iter_from(log.start if start is None else start):
            if options is not None and entry.data.startswith(_OPTIONS_PREFIXES):
                record = _options_record(entry.data)
                if record is not None:
                    options.append((count, record))
            count += 1
            last = entry.position
    return count, last


#: how a TASK with options begins on the wire ("S", or "A" with dependencies)
_OPTIONS_PREFIXES: Final = (b"\x97\x01\xa1S", b"\x97\x01\xa1A")


def _options_record(data: bytes) -> TaskRecord | None:
    try:
        record = decode_task(data)
    except RecordDecodeError:
        return None
    return record if isinstance(record, TaskRecord) else None


def verify_logs(
    location: str | Path, tasks_from: int | None, claims_from: int | None
) -> dict[str, Verified]:
    """What `FileLog.verify` finds of each log of a data directory, its frames checked from
    `tasks_from` and `claims_from` (a record's position, as read by the caller, whose reads
    checked every frame before it; None: the log's start), every segment's length and the
    end of its records judged whatever the start (a log without them is not said): the
    rule of protocol §5 ("What a reader may cut"), as `qw up`'s start-up check applies it.
    Nothing for a Redis location (no files). Raises CorruptLogError."""
    if is_redis_url(str(location)):
        return {}
    verified: dict[str, Verified] = {}
    for topic, start in ((TASKS_TOPIC, tasks_from), (CLAIMS_TOPIC, claims_from)):
        log = _open_existing(location, topic)
        if log is None:
            continue
        with log:  # (a data directory's topics are file logs: `open_topic`)
            verified[topic] = cast("FileLog", log).verify(start)
    return verified


def read_task(location: str | Path, task: int) -> TaskRecord | str | None:
    """Task `task`'s record (its id is its index in the tasks topic); a string saying why it
    cannot be read; or None when the tasks topic has no such id."""
    log = _open_existing(location, TASKS_TOPIC)
    if log is None or task < 0:
        return None
    with log:
        first, start = 0, log.start
        if log.start != log.origin:  # compacted: the ids go on from the removed tasks'
            try:
                compacted = compacted_prefix(location)
            except ReportInputError as e:
                return str(e)
            if compacted is not None:
                first, start = compacted[0].tasks, compacted[2]
        if task < first:
            return "its record was removed by compaction (settled history: done or dead)"
        entry = _nth(log, start, task - first)
        if entry is None:
            return None
        try:
            record = decode_task(entry.data)
        except RecordDecodeError as e:
            return f"its record at position {entry.position} is malformed: {e}"
        if isinstance(record, Unknown):
            return f"its record is of a type this version does not know ({record.code!r})"
        return record


def _nth(log: Log, start: int, n: int) -> Entry | None:
    """The record `n` records after the one at `start` (0: that one), or None when the log
    holds fewer. The records before it are read as the log decodes them, as placeholders
    (a file log's walked where they lie, none copied: reading them as entries, a batch at a
    time, was a fifth of `qw why 0` on a queue of 3,000 tasks)."""
    position = start
    decoder = task_decoder(b"", None)  # (every payload begins with b"": each is None)
    while n > 0:
        found = log.read_span(position, min(n, READ_BATCH), decoder)
        if not found.items:
            return None
        n -= len(found.items)
        position = found.next
    entries = log.read(position, 1)
    return entries[0] if entries else None


def read_claims(
    location: str | Path, up_to: int | None = None, start: int | None = None
) -> Iterator[tuple[int, ClaimsRecord]]:
    """The claims records with their positions, in order, decoded as every worker decodes
    them (on the server's clock where the backend has one; a malformed record is
    `Unknown(MALFORMED)`, which the fold skips). With `up_to`, only the records at positions
    ≤ `up_to`: the state right after that record. `start`: from there (default: the log's
    start; for compacted logs, the end of the prefix the checkpoint keeps, see
    `prefix_state`: the fold before the first record)."""
    log = _open_existing(location, CLAIMS_TOPIC)
    if log is None:
        return
    with log:
        if start is None and log.start != log.origin:
            compacted = compacted_prefix(location)
            start = None if compacted is None else compacted[1]
        for entry in log.iter_from(log.start if start is None else start):
            if up_to is not None and entry.position > up_to:
                return
            try:
                yield entry.position, decode_claims_entry(entry)
            except RecordDecodeError:
                yield entry.position, Unknown(MALFORMED)


def read_claims_batches(
    location: str | Path, task: int | None = None
) -> Iterator[tuple[Sequence[ClaimsRecord], Sequence[int]]]:
    """`read_claims`, a batch at a time: the same records (and positions), as lists. A file
    log's are decoded where its frames lie (`FileLog.read_span`, as a worker's catch-up
    reads them: in C when built), with no entry built for each: a batch holding a malformed
    record is read again as entries, which `read_claims` decodes.

    `task`: for a reader of that task's records only (`qw why`, `qw task`), a record that
    cannot be one of them may be left out, not decoded (the C decoder's `other_task`: its
    third item, where a claims record has its task, is another integer); every record of
    the task, and any other kept, is as `read_claims` gives it, at its position."""
    log = _open_existing(location, CLAIMS_TOPIC)
    if log is None:
        return
    with log:
        start = None
        if log.start != log.origin:
            compacted = compacted_prefix(location)
            start = None if compacted is None else compacted[1]
        position = log.start if start is None else start
        decoder, without = _claims_decoder(task)
        while found := log.read_span(position, READ_BATCH, decoder):
            records, positions = without(found.items, found.positions, OTHER_TASK)
            if None in records:  # rare: a malformed record, said as read_claims does
                yield _decoded(log.read(position, len(found.items)))
            elif records:
                yield records, positions
            position = found.next


def without_py(items: list[Any], positions: list[int], other: Any) -> tuple[list[Any], list[int]]:
    """The two lists without the places where `items` holds `other` (by identity).
    `_cdecode.c`'s `without` is this function in C."""
    kept = [i for i, item in enumerate(items) if item is not other]
    return [items[i] for i in kept], [positions[i] for i in kept]


def _claims_decoder(task: int | None) -> tuple[SpanDecoder, Without]:
    """The decoder of `read_claims_batches` and what leaves OTHER_TASK out of its reads: a
    claims follower's (nothing to leave out), or with `task` (and the C decoder built), one
    whose frames loop passes over the other tasks' records, and its `without`."""
    from queue_worker.protocol import records

    module = records._c_module()
    if task is None or module is None or not 0 <= task <= MAX_TASK_ID:
        return claims_decoder(), _as_read
    frames = module.decode_claims_frames
    claim, done, fallback, other = records.Claim, records.Done, records._claims_or_none, OTHER_TASK

    def own(buf: bytes, max_record: int, verified: int, limit: int, base: int) -> SpanResult:
        found: SpanResult = frames(
            buf, max_record, verified, limit, base, claim, done, fallback, task, other
        )
        return found

    return SpanDecoder(claims_entries, own), module.without


def _as_read(items: list[Any], positions: list[int], other: Any) -> tuple[list[Any], list[int]]:
    return items, positions


#: what leaves a span read's OTHER_TASK places out (`without_py`)
Without = Callable[[list[Any], list[int], Any], tuple[list[Any], list[int]]]


def task_frames_py(
    buf: bytes, max_record: int, verified: int, limit: int, base: int, prefix: bytes, known: Any
) -> SpanResult:
    """(items, positions, pos, batch_start, ready): `framing._decode_loop` of `buf`, each
    payload that begins with `prefix` given as `known`, any other as its bytes, each offset
    made absolute (file offset `base` + offset in `buf`). `_cdecode.c`'s `task_frames` is
    this function in C."""
    from logstore.file import framing

    starts, datas, pos, batch_start, ready = framing._decode_loop(buf, max_record, verified, limit)
    items = [known if data.startswith(prefix) else data for data in datas]
    return items, [start + base for start in starts], pos, batch_start, ready


def task_decoder(prefix: bytes, known: Any) -> SpanDecoder:
    """A decoder (`Log.read_span`) for a counter of a tasks log's records: each one whose
    payload begins with `prefix` is `known` (a file log's not copied); any other is its
    payload."""

    def entries(found: list[Entry]) -> list[Any]:
        return [known if e.data.startswith(prefix) else e.data for e in found]

    return SpanDecoder(entries, task_frames_loop(prefix, known))


def task_frames_loop(prefix: bytes, known: Any) -> SpanLoop:
    """`task_decoder`'s span loop for a file log's frames (`task_frames_py`, in C when the
    claims decoder is built)."""
    from queue_worker.protocol import records

    module = records._c_module()
    frames = task_frames_py if module is None else module.task_frames

    def loop(buf: bytes, max_record: int, verified: int, limit: int, base: int) -> SpanResult:
        found: SpanResult = frames(buf, max_record, verified, limit, base, prefix, known)
        return found

    return loop


def _decoded(entries: Sequence[Entry]) -> tuple[list[ClaimsRecord], list[int]]:
    records: list[ClaimsRecord] = []
    for entry in entries:
        try:
            records.append(decode_claims_entry(entry))
        except RecordDecodeError:
            records.append(Unknown(MALFORMED))
    return records, [entry.position for entry in entries]


def prefix_state(location: str | Path) -> ClaimSnapshot | None:
    """The claims fold before the first record `read_claims` yields: None for logs that
    hold every record, the compacted prefix's fold otherwise."""
    compacted = compacted_prefix(location)
    return None if compacted is None else compacted[0].state


def compacted_prefix(location: str | Path) -> tuple[Prefix, int, int, int] | None:
    """For logs compacted by `qw compact` (queue_worker.compaction.files): the prefix the
    checkpoint keeps, where the retained claims and tasks records start, and how many
    segments were removed; None for logs that still hold every record. ReportInputError
    when the removed history is not accounted for (no usable checkpoint, a broken digest
    chain): the report cannot prove what it cannot see."""
    directory: Location
    if is_redis_url(str(location)):
        directory = str(location)  # the checkpoint is a key beside the streams
    else:
        directory = Path(location)
        if not all((directory / f"{t}.log").is_file() for t in (TASKS_TOPIC, CLAIMS_TOPIC)):
            return None  # (a log not there yet was never compacted)
    tasks_log, claims_log = open_topics(location, read_only=True)
    with tasks_log, claims_log:
        if tasks_log.start == tasks_log.origin and claims_log.start == claims_log.origin:
            return None
        from queue_worker.history.checkpoint import (  # compacted logs only
            CheckpointRefused,
            listed_start,
            read_base,
            removed_segments,
            restore_checkpoint,
        )
        from queue_worker.history.prefix import Prefix

        try:
            restore_checkpoint(directory, tasks_log, claims_log)  # identity, chain, CRCs
            plain = read_base(directory)
            if plain is None:
                raise CheckpointRefused("it keeps no fold of the removed records")
            prefix = Prefix.from_plain(plain)
        except CheckpointRefused as e:
            raise ReportInputError(
                f"{location}: the logs were compacted and the removed history cannot be "
                f"accounted for (lost or tampered): {e}"
            ) from e
        removed = removed_segments(directory)
        claims_start = listed_start(directory, CLAIMS_TOPIC, claims_log.origin)
        tasks_start = listed_start(directory, TASKS_TOPIC, tasks_log.origin)
        if prefix.position != claims_start:
            raise ReportInputError(
                f"{location}: the checkpoint's prefix ends at claims position "
                f"{prefix.position}, its removed segments at {claims_start}: tampered"
            )
        count = sum(len(r) for r in removed.values())
        return prefix, claims_start, tasks_start, count
