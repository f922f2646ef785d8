"""Enqueueing tasks: `Queue(location).enqueue(payload) -> task id`.

A task's id is its index in the tasks log (0, 1, 2, …): stable, short, and the same for
every reader, because the log's order is. An append returns only a *position*, so the
producer learns the index by counting the records before its own: from where the fold
checkpoint's task index ends, when there is one (the workers save it), else from the log's
start. It remembers how far it has counted (an index and its position), so that repeated
enqueues read only what other producers appended since.

    with Queue(".qw") as queue:
        first = queue.enqueue({"url": "https://example.org"})
        ids = queue.enqueue_many([{"n": n} for n in range(100)])
"""

from __future__ import annotations

import os
import reprlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from logstore import Durability, Log, LogError, PositionCompactedError, is_redis_url
from queue_worker.protocol.clock import Clock, now_us
from queue_worker.protocol.records import RecordEncodeError, TaskRecord, encode
from queue_worker.topics import READ_BATCH, TASKS_TOPIC, open_topic

#: a tasks log shorter than this is counted from its start (~30,000 tasks: ~20 ms, about
#: what loading the checkpoint's modules costs `qw enqueue`, which needs none of the fold's)
COUNT_FROM_START_BYTES = 1 << 20


class Queue:
    """A producer handle on one queue's tasks log."""

    def __init__(
        self,
        location: str | Path,
        fsync: str = "commit",
        *,
        tasks_log: Log | None = None,
        clock: Clock = now_us,
    ) -> None:
        """Open the tasks log at `location` (a data directory or a redis:// URL), or use
        `tasks_log` when given (tests)."""
        durability = Durability.parse(fsync)
        self._owns_log = tasks_log is None
        self.log = (
            tasks_log if tasks_log is not None else open_topic(location, TASKS_TOPIC, durability)
        )
        self._clock = clock
        self._location = location if is_redis_url(str(location)) else Path(location)
        try:  # ids are counted: a log that lost records would hand out ids already given
            self.log.verify_history()
        except BaseException:
            self.close()
            raise
        # How far this producer has counted: the record at `_counted_position` is task
        # `_counted`. Starts at the beginning of the log (of what compaction left of it).
        self._counted, self._counted_position = self._count_from()

    def _count_from(self) -> tuple[int, int]:
        """Where counting starts: where the fold checkpoint's task index ends, when there is
        a checkpoint of this log (`checkpoint.tasks_counted`); else task 0 at the log's
        start; or, once compaction removed settled tasks, the first retained task's id and
        position by the checkpoint's prefix (ids go on from there)."""
        if self._long():
            from queue_worker.history.checkpoint import CheckpointRefused, tasks_counted

            try:
                return tasks_counted(self._location, self.log)
            except CheckpointRefused:
                pass
        start = self.log.start
        if start == self.log.origin:
            return 0, start
        from queue_worker.history.checkpoint import CheckpointRefused
        from queue_worker.history.prefix import first_retained_task

        try:
            return first_retained_task(self._location, self.log.origin)
        except CheckpointRefused as e:
            raise LogError(str(e)) from e

    def _long(self) -> bool:
        """Whether the tasks log is long enough for the checkpoint to pay: a file log whose
        first segment holds COUNT_FROM_START_BYTES, a compacted one, or a log elsewhere (a
        count over the network)."""
        from logstore.file.log import FileLog  # (imported by open_topic for a file log)

        if not isinstance(self.log, FileLog) or self.log.start != self.log.origin:
            return True  # (compacted: the checkpoint is the count's only start anyway)
        try:
            return os.path.getsize(self.log.path) >= COUNT_FROM_START_BYTES
        except OSError:
            return True

    def enqueue(self, payload: Any) -> int:
        """Append one task; return its id."""
        return self.enqueue_many([payload])[0]

    def enqueue_many(self, payloads: Iterable[Any]) -> list[int]:
        """Append tasks as one contiguous run (one durable append); return their ids.

        Raises RecordEncodeError, naming the value, if a payload cannot be encoded: then
        nothing is written.
        """
        at = self._clock()
        records = [_encode_payload(i, payload, at) for i, payload in enumerate(payloads)]
        if not records:
            return []
        positions = self.log.append_many(records, durable=True)
        first = self._index_of(positions[0])
        return list(range(first, first + len(records)))

    def _index_of(self, position: int) -> int:
        """The index of the record at `position` (one this producer appended)."""
        index, at = self._counted, self._counted_position
        while True:
            try:
                entries = self.log.read(at, READ_BATCH)
            except PositionCompactedError as e:  # settled tasks removed since: count on
                index, at = self._counted, self._counted_position = self._count_from()
                if at < e.start:  # (the checkpoint does not cover what went: never loop)
                    raise LogError(f"{e}, but the checkpoint covers only up to {at}") from e
                continue
            if not entries:
                raise LogError(f"{self.log.name}: appended record at {position} is not readable")
            for entry in entries:
                if entry.position == position:
                    self._counted, self._counted_position = index, position
                    return index
                if entry.position > position:
                    raise LogError(f"{self.log.name}: no record at position {position}")
                index += 1
            at = entries[-1].next

    def close(self) -> None:
        if self._owns_log:
            self.log.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_QUOTE = reprlib.Repr()
_QUOTE.maxlevel = 3
_QUOTE.maxstring = 40
_QUOTE.maxother = 40


def check_payloads(payloads: Sequence[Any]) -> None:
    """Raise RecordEncodeError, naming the payload, for the first one that cannot be
    enqueued (a producer over several logs checks them all before it appends anything)."""
    for index, payload in enumerate(payloads):
        _encode_payload(index, payload, 0)


def _encode_payload(index: int, payload: Any, enqueued_at: int) -> bytes:
    try:
        return encode(TaskRecord(payload, enqueued_at))
    except RecordEncodeError as e:
        raise RecordEncodeError(
            f"payload {index} ({_QUOTE.repr(payload)}) cannot be enqueued: {e}"
        ) from e
