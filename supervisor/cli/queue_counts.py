"""The queue's counts as `qw status` shows them: a fold of the claims log, now (one place
for the single queue and each partition of a partitioned one).

The numbers are those of the supervisor's `supervisor.run.monitor.Monitor` after its
`check_start` (`queue_view()`, `held_leases()`: tests/test_queue_counts.py compares them on
the same logs), from the same fold (`queue_worker.topics.ClaimsFollower`'s state: one by one
the records whose verdicts are counted, each FAIL and each DONE recent enough for the
throughput, the runs between them in one `ClaimState.apply_all` each) and the same checks,
without the monitor's event machinery and dataclass model.

It begins from the fold checkpoint (`queue_worker.history.checkpoint`) when one covers these logs,
compacted or not, and reads only what came after (`_Reading._begin`, by the rule
`supervisor.run.fold_begin` gives it and the monitor): a drained queue's `qw status` no longer
grows with the history it ran. The counts are those of a full fold: the checkpoint holds
the fold's state and task index, FAILs accepted included (version 4; a version-3
checkpoint of compacted logs knows only those after it: see its docstring). On logs that
hold every record a checkpoint is a cache, used only when it is whole and valid: refused,
missing, or too recent for the throughput it shows (its DONEs might be in the window,
which the checkpoint does not count), the logs are folded from their start, and damage in
what it covers is then met by that fold. A compacted log has no start to fold from: there
a refused checkpoint is an error.

Another difference: it reads each log to its end. The monitor's start-up check stops at the
first read shorter than its batch, and a read stops short at the end of a segment, so on a
log of several segments `qw status` counted only the first ones (320 tasks read as 55 in
tests/test_queue_counts.py).
"""

import contextlib
import operator
import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, NamedTuple

if TYPE_CHECKING:
    from logstore import Entry, Log
    from logstore.base import SpanDecoder
    from queue_worker.protocol.state import Lease
    from queue_worker.topics import ClaimsFollower

#: records read from a log at once (the monitor's batch)
BATCH: Final = 20_000
#: the throughput shown as "now" is the mean of this many complete seconds (the monitor's)
THROUGHPUT_WINDOW: Final = 3
MICROS: Final = 1_000_000

_DATA: Final = operator.itemgetter(2)  # an Entry's bytes


class QueueCounts(NamedTuple):
    """The queue's counts: `supervisor.run.model.QueueView`'s, in its order, less its history."""

    published: int = 0
    pending: int = 0
    held: int = 0
    done: int = 0
    failed: int = 0  # FAIL records accepted (released for retry, or dead)
    dead: int = 0
    throughput_now: float = 0.0  # tasks done per second, over the last complete seconds
    log_bytes: int = 0
    # records read from both topics: after the checkpoint the reading began from, if it did
    # (the checkpoint does not count the records it covers), else every one
    record_count: int = 0


Held = list[tuple[int, "Lease", float | None]]


def queue_counts(location: str) -> tuple[QueueCounts, Held]:
    """The queue as a fold of the whole claims log says it is now, and its held tasks (by
    task id: the task, its lease, and None where a supervisor would say when its holder
    died). Damage anywhere in either log raises (CorruptLogError); so does a claims log
    that closed a task the tasks log lacks (IdentityError)."""
    from logstore.base import Durability
    from queue_worker.topics import open_topics

    tasks, claims = open_topics(location, Durability.NONE, read_only=True)
    try:
        return _Reading(location, tasks, claims).counts()
    finally:
        tasks.close()
        claims.close()


class _Reading:
    """One reading of a queue's two logs, as `Monitor.check_start` reads them."""

    def __init__(self, location: str, tasks: "Log", claims: "Log") -> None:
        from queue_worker.topics import ClaimsFollower

        self.location, self.tasks, self.claims = location, tasks, claims
        self.tasks_pos = tasks.start
        self.follower = ClaimsFollower(claims.start)
        self.published = 0
        self.foreign: set[int] = set()  # tasks of a type this version does not know
        self.records = 0
        self.done_seconds: Counter[int] = Counter()  # DONEs by their record's second
        # a DONE before this (µs) cannot be in the throughput's window (`_read_span`)
        self.since = (int(time.time()) - THROUGHPUT_WINDOW) * MICROS
        self.tasks_decoder: SpanDecoder | None = None
        self._begin()

    def _begin(self) -> None:
        """Begin from the fold checkpoint when one covers these logs
        (`supervisor.run.fold_begin`)."""
        from supervisor.run.fold_begin import begin_from_checkpoint

        begun = begin_from_checkpoint(self.location, self.tasks, self.claims, self.since)
        if begun is None:
            return
        index, self.follower = begun
        self.tasks_pos = index.next_position
        self.published = index.known
        self.foreign = set(index.foreign)

    def counts(self) -> tuple[QueueCounts, Held]:
        from queue_worker.topics import check_tasks_cover

        starts = (self.tasks_pos, self.follower.next_position)
        for log, start in zip((self.tasks, self.claims), starts, strict=True):
            # A file log's reads below check every record they return (checksums too: a new
            # handle trusts nothing) and raise at damage, as its check() would, so it is not
            # walked twice; and what a checkpoint
            # covers, it checksummed whole (`_begin`): the rest is checked from there.
            if not log.reads_check_records:
                log.check(start)
        # to the end: a read stops short at the end of a segment, so only an empty one says
        # that nothing more is there (`Log.read`); a full batch is not the test
        while self._read_claims():
            pass
        while self._read_tasks():  # after the claims: every task they name is in
            pass
        for log, end in ((self.tasks, self.tasks_pos), (self.claims, self.follower.next_position)):
            log.check(end)  # what the reads cannot see (a file log: every segment's length,
            # and what follows the last record: protocol §5)
        state = self.follower.state
        check_tasks_cover(self.tasks, self.published, self.claims, state)
        published, foreign = self.published, self.foreign
        held = sorted(
            (task, lease)
            for task, lease in state.held_tasks()
            if task < published and task not in foreign
        )
        closed = state.done_count + state.dead_count - state.closed_from(published)
        foreign_open = sum(1 for t in foreign if not state.is_closed(t) and state.holder(t) is None)
        second = int(time.time())  # complete seconds only: the current one is still filling
        window = range(second - THROUGHPUT_WINDOW, second)
        recent = [float(self.done_seconds.get(s, 0)) for s in window]
        counts = QueueCounts(
            published=published,
            pending=max(0, published - closed - len(held) - foreign_open),
            held=len(held),
            done=state.done_count,
            failed=state.failed_count,
            dead=state.dead_count,
            throughput_now=sum(recent) / THROUGHPUT_WINDOW,
            log_bytes=_log_bytes(self.location),
            record_count=self.records,
        )
        return counts, [(task, lease, None) for task, lease in held]

    def _read_tasks(self) -> int:
        """Count the tasks log's next records, read as the log decodes them (a file log's
        frames walked where they lie, as for the claims): a TASK of this schema, which the
        count only needs to see, is None (no payload copied); any other record is its
        payload."""
        from queue_worker.proof.log_reading import task_decoder
        from queue_worker.topics import _TASK_PREFIX

        if self.tasks_decoder is None:
            self.tasks_decoder = task_decoder(_TASK_PREFIX, None)
        found = self.tasks.read_span(self.tasks_pos, BATCH, self.tasks_decoder)
        payloads, count = found.items, len(found.items)
        if payloads.count(None) != count:
            for index, data in enumerate(payloads, self.published):
                if data is not None and _is_foreign(data):
                    self.foreign.add(index)
        self.published += count
        self.tasks_pos = found.next
        self.records += count
        return count

    def _read_claims(self) -> int:
        """Read the claims log's next records as the log decodes them (`Log.read_span`, as
        a worker's catch-up reads them) and fold them: a run of records whose verdicts are
        not counted in one `ClaimState.apply_all` (its exact effect, without building them),
        each other record by itself. The counted ones: every DONE recent enough to be in the
        throughput's window (the window is of seconds before `counts` ends, so after
        `since`, taken before the logs were read). (The FAILs accepted the fold counts
        itself.)"""
        from queue_worker.protocol.records import Done
        from queue_worker.protocol.state import Verdict
        from queue_worker.topics import claims_decoder

        follower: ClaimsFollower = self.follower
        found = self.claims.read_span(follower.next_position, BATCH, claims_decoder())
        records, positions = found.items, found.positions
        if None in records:  # rare: a malformed record, which the fold decodes and counts
            return self._read_entries()
        state, since = follower.state, self.since
        done = Verdict.DONE
        begin = 0
        for i, record in enumerate(records):
            if type(record) is not Done or record.at < since:
                continue
            if begin < i:
                state.apply_all(records[begin:i], positions[begin:i])
            if state.apply(record, positions[i]).verdict is done:
                self.done_seconds[record.at // MICROS] += 1
            begin = i + 1
        if begin < len(records):
            state.apply_all(records[begin:], positions[begin:])
        follower.next_position = found.next
        self.records += len(records)
        return len(records)

    def _read_entries(self) -> int:
        from queue_worker.protocol.records import Done, decode_claims_all
        from queue_worker.protocol.state import Verdict

        follower: ClaimsFollower = self.follower
        entries: Sequence[Entry] = self.claims.read(follower.next_position, BATCH)
        done = Verdict.DONE
        # decoded in one call for the batch, a malformed record (None) left to the fold to
        # decode, count and report, as the monitor and the workers do
        for entry, known in zip(entries, decode_claims_all(map(_DATA, entries)), strict=True):
            outcome, record = follower.apply(entry, known)
            if outcome.verdict is done and isinstance(record, Done):
                self.done_seconds[record.at // MICROS] += 1
        self.records += len(entries)
        return len(entries)


def _is_foreign(data: bytes) -> bool:
    """A tasks-log record of a type this version does not know (a malformed one is not: a
    worker wins it and fails it for good, so it closes)."""
    from queue_worker.protocol.records import RecordDecodeError, Unknown, decode_task

    try:
        return isinstance(decode_task(data), Unknown)
    except RecordDecodeError:
        return False


def _log_bytes(location: str) -> int:
    from logstore.location import log_file
    from queue_worker.topics import CLAIMS_TOPIC, TASKS_TOPIC

    total = 0  # a Redis location has no files: 0
    for topic in (TASKS_TOPIC, CLAIMS_TOPIC):
        path = log_file(location, topic)
        with contextlib.suppress(OSError):  # not created yet
            total += path.stat().st_size if path is not None else 0
    return total


def sum_counts(queues: Sequence[QueueCounts]) -> QueueCounts:
    """The partitions' counts as the whole queue's (as `supervisor.run.model.sum_queues` adds
    them: in order, from zero)."""
    total = QueueCounts()
    for q in queues:
        total = QueueCounts(
            published=total.published + q.published,
            pending=total.pending + q.pending,
            held=total.held + q.held,
            done=total.done + q.done,
            failed=total.failed + q.failed,
            dead=total.dead + q.dead,
            throughput_now=total.throughput_now + q.throughput_now,
            log_bytes=total.log_bytes + q.log_bytes,
            record_count=total.record_count + q.record_count,
        )
    return total


__all__ = ["QueueCounts", "queue_counts", "sum_counts"]
