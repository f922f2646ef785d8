"""Compaction on Redis: trim the settled history at the front of a queue's streams.

The file log's compaction (`queue_worker.compaction.files`) removes whole segment files; a Redis
stream has no segments, so here the unit is one entry, and the cut is a position: every
entry before it goes, with ``XTRIM MINID`` (`logstore.redis.trim.trim`, which also moves the
stream's start key, so that a reader of a trimmed position gets PositionCompactedError).
What may go is `queue_worker.compaction.settled`'s rule, applied to each entry as to a segment:

- settled: the fold covers the entry and every task it names is closed (below the fold's
  watermark); entries go from the oldest, and the first unsettled entry stops the cut;
- retention by time: the entry's id is the server's clock when it was added, older than
  ``--retention`` seconds;
- retention by size: the stream is over ``--retention-bytes``. Redis does not say what one
  entry takes: the stream's bytes are Redis's own estimate of its memory (``MEMORY
  USAGE``, sampled), spread evenly over its entries (``XLEN``).

The steps, in an order that a kill -9 at any of them leaves safe (the file log's steps,
with `stop_at` kill points of the same names):

1. ``locked``       take the checkpoint's lock key (`queue_worker.history.redis_checkpoint`)
2. ``folded``       the fold of both streams to their end: the checkpoint restored and
                    caught up, or (a queue never trimmed, without a usable checkpoint) a
                    full replay
3. ``checkpointed`` the checkpoint of that fold, listing each trim about to be made as a
                    removed "segment" (from the stream's start to the cut, with the crc32
                    of its entries in the digest chain), written with one ``SET`` before
                    any trim (why that is durable enough: `queue_worker.history.redis_checkpoint`)
4. ``dropped``      the claims stream trimmed to the cut the checkpoint lists, then the
                    tasks stream (the kill point is after the first trim). With server
                    verdicts, the claims trim also drops the done tasks' fields of their
                    state below the fold's watermark, in the same script call
                    (`queue_worker.compaction.verdict_trim`)

A kill before 3 changes nothing. A kill after 3 leaves a checkpoint listing trims not made
yet: it loads (the entries it lists are still there, and its records start after them),
and the next compaction makes them (a trim to where a stream starts already is harmless).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterator
from typing import NamedTuple, cast

from logstore.redis.log import RedisLog
from logstore.redis.trim import stream_bytes, stream_length, trim
from queue_worker.compaction.files import (
    Compacted,
    CompactionError,
    checkpoint_plan,
    first_task_id,
    fold_logs,
    stop_at,
)
from queue_worker.compaction.settled import (
    Retention,
    Segment,
    claims_segment_settled,
    removable,
    tasks_segment_settled,
)
from queue_worker.compaction.verdict_trim import trim_claims
from queue_worker.history.checkpoint import (
    Removed,
    checkpoint_lock,
    listed_start,
    removed_segments,
    restore_checkpoint,
)
from queue_worker.protocol.records import RecordDecodeError, Unknown, decode_claims
from queue_worker.protocol.state import ClaimState
from queue_worker.topics import CLAIMS_TOPIC, TASKS_TOPIC, TaskIndex, open_topics


class _Size(NamedTuple):
    """A stream's estimated bytes, and its share of them per entry (module docstring)."""

    total: int
    per_entry: int


def compact_redis(url: str, retention: Retention, *, now: float | None = None) -> Compacted:
    """Trim what `retention` lets go of the settled history of the queue at `url`.
    Raises CompactionError when it cannot be done safely (nothing trimmed), LogError when
    the server cannot be read. `Compacted.freed_bytes` is the estimated memory freed."""
    now = time.time() if now is None else now
    try:
        with checkpoint_lock(url):
            return _compact_locked(url, retention, now)
    except OSError as e:  # the lock key out of reach
        raise CompactionError(f"nothing removed: {e}") from e


def _compact_locked(url: str, retention: Retention, now: float) -> Compacted:
    stop_at("locked")
    # (a redis:// location's topics are streams: `open_topics`)
    tasks_log, claims_log = cast("tuple[RedisLog, RedisLog]", open_topics(url))
    try:
        logs = ((CLAIMS_TOPIC, claims_log), (TASKS_TOPIC, tasks_log))
        for _, log in logs:  # a checkpoint of a stream that lost entries would bury the loss
            log.verify_history()
        # (trims a killed compaction listed but did not make are made below, not planned)
        listed = {topic: listed_start(url, topic, log.origin) for topic, log in logs}
        for topic, log in logs:
            if listed[topic] < log.start:
                raise CompactionError(
                    f"the streams were trimmed and no usable checkpoint covers what was "
                    f"removed: {log.name} starts at {log.start}, but the checkpoint lists "
                    f"trims up to {listed[topic]} only (lost history)"
                )
        sizes = {topic: _size(log) for topic, log in logs}
        plan: dict[str, list[Removed]] = {CLAIMS_TOPIC: [], TASKS_TOPIC: []}
        folded: ClaimState | None = None  # the fold the checkpoint keeps
        if any(_old_or_big(log, listed[t], sizes[t], now, retention) for t, log in logs):
            plan, folded = _plan(url, tasks_log, claims_log, listed, sizes, now, retention)
        if any(plan.values()):  # (the kill point is after a checkpoint was written)
            stop_at("checkpointed")
        freed = 0
        listed_now = removed_segments(url)  # what the checkpoint lists now
        for topic, log in logs:
            upto = listed_start(url, topic, log.origin)
            was = log.start
            if upto > was:
                # (this compaction's trim, or one a killed compaction listed: said as made)
                plan[topic] = [r for r in listed_now.get(topic, []) if r.end > was]
                if topic == CLAIMS_TOPIC:
                    if folded is None:  # a trim a killed compaction listed: its checkpoint's
                        folded = restore_checkpoint(url, tasks_log, claims_log)[1].state
                    snap = folded.snapshot()
                    trim_claims(log, upto, snap.watermark, (task for task, _ in snap.dead))
                else:
                    trim(log, upto)
                freed += max(0, sizes[topic].total - stream_bytes(log))
                stop_at("dropped")
        return Compacted(
            plan, freed, {CLAIMS_TOPIC: claims_log.start, TASKS_TOPIC: tasks_log.start}
        )
    finally:
        tasks_log.close()
        claims_log.close()


def _size(log: RedisLog) -> _Size:
    total = stream_bytes(log)
    return _Size(total, total // max(1, stream_length(log)))


def _old_or_big(log: RedisLog, after: int, size: _Size, now: float, retention: Retention) -> bool:
    """Whether retention lets anything of the stream go (its oldest entry from `after` is
    old, or the stream is over its budget): when not, the fold (the costly part) is not
    even taken."""
    if size.total > retention.bytes:
        return True
    oldest = log.read(after, 1)
    return bool(oldest) and now - _written_at(oldest[0].server_time_us) > retention.seconds


def _written_at(server_time_us: int | None) -> float:
    return 0.0 if server_time_us is None else server_time_us / 1e6


def _plan(
    url: str,
    tasks_log: RedisLog,
    claims_log: RedisLog,
    listed: dict[str, int],
    sizes: dict[str, _Size],
    now: float,
    retention: Retention,
) -> tuple[dict[str, list[Removed]], ClaimState]:
    """Fold both streams, choose the cuts retention allows, and make the checkpoint that
    lists them (steps 2 and 3 of the module docstring); with the claims fold it keeps."""
    tasks, claims = fold_logs(url, tasks_log, claims_log)
    stop_at("folded")
    watermark = claims.state.watermark
    claims_cut = _claims_cut(
        claims_log,
        listed[CLAIMS_TOPIC],
        claims.next_position,
        watermark,
        _Budget(now, retention, sizes[CLAIMS_TOPIC]),
    )
    claims_end = _cut(claims_cut, claims_segment_settled, now, retention, sizes[CLAIMS_TOPIC])
    first_id = first_task_id(url)
    tasks_cut = _tasks_cut(
        tasks_log,
        listed[TASKS_TOPIC],
        first_id,
        tasks,
        watermark,
        _Budget(now, retention, sizes[TASKS_TOPIC]),
    )
    tasks_end = _cut(tasks_cut, tasks_segment_settled, now, retention, sizes[TASKS_TOPIC])
    plan = {
        CLAIMS_TOPIC: _removed(listed[CLAIMS_TOPIC], claims_end, claims_cut),
        TASKS_TOPIC: _removed(listed[TASKS_TOPIC], tasks_end, tasks_cut),
    }
    if any(plan.values()):
        tasks_before = first_id + tasks_end[1]  # (a task's id is its index in the topic)
        checkpoint_plan(url, tasks, tasks_log, claims, claims_log, tasks_before, listed, plan)
    return plan, claims.state


class _Budget:
    """Retention's side of the walk: it stops at the first entry retention keeps (neither
    old enough nor needed to get under the size budget), where `removable` would stop
    too, so that a walk does not read the young part of a stream for nothing."""

    def __init__(self, now: float, retention: Retention, size: _Size) -> None:
        self.now = now
        self.seconds = retention.seconds
        self.per_entry = size.per_entry
        self.over = size.total - retention.bytes  # bytes still over the budget

    def keeps(self, written_at: float) -> bool:
        if self.now - written_at > self.seconds or self.over > 0:
            self.over -= self.per_entry
            return False
        return True


class _Walk(NamedTuple):
    """The entries of a stream compaction considered, each as a one-entry segment, and the
    fold's position the settled rule checks them against."""

    segments: list[Segment]
    folded_to: int
    watermark: int
    #: `Log.checksum` from the walk's first entry through each segment (the digest of a
    #: trim, taken as the walk reads: the entries are not read again for it)
    crcs: list[int]


def _claims_cut(
    log: RedisLog, after: int, folded_to: int, watermark: int, budget: _Budget
) -> _Walk:
    """The claims entries from `after`, up to the first that names an open task (or that
    retention keeps)."""
    segments: list[Segment] = []
    crcs: list[int] = []
    for position, end, written_at, data, crc in _entries(log, after, folded_to):
        if budget.keeps(written_at):
            break
        try:
            record = decode_claims(data)
        except RecordDecodeError:
            record = None  # a malformed record changes nothing (the fold skips it)
        task = -1 if record is None or isinstance(record, Unknown) else record.task
        segments.append(Segment(position, end, budget.per_entry, written_at, task))
        crcs.append(crc)
        if task >= watermark:
            break  # a prefix: nothing after an unsettled entry goes
    return _Walk(segments, folded_to, watermark, crcs)


def _tasks_cut(
    log: RedisLog, after: int, first_id: int, tasks: TaskIndex, watermark: int, budget: _Budget
) -> _Walk:
    """The tasks entries from `after` (the task `first_id`'s), up to the first open task
    (or one retention keeps). A task's id is its index in the topic: counted from
    `first_id`."""
    segments: list[Segment] = []
    crcs: list[int] = []
    task = first_id
    for position, end, written_at, _data, crc in _entries(log, after, tasks.next_position):
        if budget.keeps(written_at):
            break
        segments.append(Segment(position, end, budget.per_entry, written_at, task))
        crcs.append(crc)
        if task >= watermark:
            break
        task += 1
    return _Walk(segments, tasks.next_position, watermark, crcs)


def _entries(
    log: RedisLog, after: int, folded_to: int
) -> Iterator[tuple[int, int, float, bytes, int]]:
    """(position, cut after it, written at, bytes, checksum through it) of each entry from
    `after` up to `folded_to`: the cut after an entry is the next entry's position (or
    `folded_to`), so that a stream trimmed there starts at a record of its own; the
    checksum is `Log.checksum(after, cut)`, computed as `Log.checksum` does."""
    held: tuple[int, float, bytes, int] | None = None
    crc = 0
    for entry in log.iter_from(after):
        if entry.position >= folded_to:
            break
        if held is not None:
            yield held[0], entry.position, held[1], held[2], held[3]
        crc = zlib.crc32(entry.data, zlib.crc32(entry.position.to_bytes(8, "little"), crc))
        held = (entry.position, _written_at(entry.server_time_us), entry.data, crc)
    if held is not None:
        yield held[0], folded_to, held[1], held[2], held[3]


def _cut(
    walk: _Walk,
    rule: Callable[[Segment, int, int], bool],
    now: float,
    retention: Retention,
    size: _Size,
) -> tuple[int, int]:
    """(where the stream may start, how many entries go) by `queue_worker.compaction.settled`."""
    count = removable(
        walk.segments,
        lambda s: rule(s, walk.folded_to, walk.watermark),
        size.total,
        now,
        retention,
    )
    return (walk.segments[count - 1].end if count else -1), count


def _removed(start: int, cut: tuple[int, int], walk: _Walk) -> list[Removed]:
    """The trim from the stream's `start` (where the walk began) to the cut, as the
    checkpoint lists it."""
    end, count = cut
    if not count:
        return []
    return [Removed(start, end, walk.crcs[count - 1])]


__all__ = ["compact_redis"]
