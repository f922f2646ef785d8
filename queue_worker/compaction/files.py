"""Compaction: remove the settled segments at the front of a data directory's logs.

`qw compact --dir D` runs it once; `qw up` runs it from time to time in the supervisor
(never on a worker's path). Which segments may go is `queue_worker.compaction.settled`'s rule; this
module does it, in an order that a kill -9 at any step leaves safe:

1. ``locked``       take ``fold.checkpoint.lock`` (saves wait; two compactions never overlap)
2. ``folded``       the fold of both logs up to their end: the checkpoint restored and caught
                    up (or, for logs never compacted and no usable checkpoint, a full replay)
3. ``checkpointed`` the checkpoint of that fold, listing the segments about to go with their
                    crc32s in its digest chain, written and forced to disk (with its
                    directory) before anything is removed
4. ``dropped``      each segment removed, oldest first, claims then tasks (the first segment
                    of a log becomes its stub)

A kill before 3 leaves everything as it was. A kill after 3 leaves a checkpoint that
lists segments still on disk: it loads as well (its records start after them), and the
next compaction removes them (removal is idempotent). A removed segment is always in the
durable checkpoint first, so a fold restored from it is the fold of the whole history.

Each step calls `stop_at` as it is reached (``dropped`` after the first removal): nothing
happens there, and the tests replace it with a kill -9 of the process (tests/qw_run.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final, NamedTuple, cast

from logstore import Log, LogError
from logstore.file.log import FileLog
from logstore.file.segments import segment_files
from queue_worker.compaction.settled import (
    Retention,
    Segment,
    claims_segment_settled,
    removable,
    tasks_segment_settled,
)
from queue_worker.errors import QwError
from queue_worker.history.checkpoint import (
    CheckpointError,
    CheckpointRefused,
    Location,
    Removed,
    checkpoint_lock,
    listed_start,
    read_base,
    restore_checkpoint,
    save_checkpoint,
)
from queue_worker.history.prefix import Prefix
from queue_worker.proof.report import fold_prefix
from queue_worker.protocol.records import ClaimsRecord, RecordDecodeError, Unknown, decode_claims
from queue_worker.topics import (
    CLAIMS_TOPIC,
    MALFORMED,
    TASKS_TOPIC,
    ClaimsFollower,
    TaskIndex,
    decode_claims_entry,
    open_topics,
)

STEPS: Final = ("locked", "folded", "checkpointed", "dropped")


class CompactionError(QwError):
    """Compaction cannot be done safely (the message says why); nothing was removed."""


class Compacted(NamedTuple):
    """What one compaction removed, per topic, and where each log starts now."""

    removed: dict[str, list[Removed]]
    freed_bytes: int
    starts: dict[str, int]


def stop_at(step: str) -> None:
    """Compaction has reached `step` (one of STEPS): the tests' kill point (module
    docstring); nothing here."""


def compact(directory: Path, retention: Retention, *, now: float | None = None) -> Compacted:
    """Remove what `retention` lets go of the settled history of the queue in `directory`
    (a data directory of file logs). Raises CompactionError when it cannot be done safely,
    LogError when a log cannot be read."""
    now = time.time() if now is None else now
    with checkpoint_lock(directory):
        stop_at("locked")
        # (a data directory's topics are file logs: `open_topics`)
        opened = open_topics(directory)
        tasks_log, claims_log = cast("tuple[FileLog, FileLog]", opened)
        try:
            # (segments the checkpoint lists already, a killed compaction's, are not planned
            # again: they are removed below)
            listed = {
                topic: listed_start(directory, topic, log.origin)
                for topic, log in ((CLAIMS_TOPIC, claims_log), (TASKS_TOPIC, tasks_log))
            }
            for topic, log in ((CLAIMS_TOPIC, claims_log), (TASKS_TOPIC, tasks_log)):
                if listed[topic] < log.start:  # (cheap: the checkpoint's lists only)
                    raise CompactionError(
                        f"the logs were compacted and no usable checkpoint covers what was "
                        f"removed: {log.name} starts at {log.start}, but the checkpoint lists "
                        f"removed segments up to {listed[topic]} only (lost history)"
                    )
            plan: dict[str, list[Removed]] = {CLAIMS_TOPIC: [], TASKS_TOPIC: []}
            if _retention_allows_any(tasks_log, claims_log, listed, now, retention):
                plan = _plan(directory, tasks_log, claims_log, listed, now, retention)
            stop_at("checkpointed")
            freed = 0
            for topic, log in ((CLAIMS_TOPIC, claims_log), (TASKS_TOPIC, tasks_log)):
                # every segment the durable checkpoint lists as removed: this compaction's,
                # and any a killed one listed but had not removed yet
                upto = listed_start(directory, topic, log.origin)
                sizes = dict(_sizes(log))
                for base, end in log.sealed_segments():
                    if end > upto:
                        break
                    log.drop_segments(end)
                    freed += sizes.get(base, 0)
                    stop_at("dropped")
            starts = {CLAIMS_TOPIC: claims_log.start, TASKS_TOPIC: tasks_log.start}
            return Compacted(plan, freed, starts)
        finally:
            tasks_log.close()
            claims_log.close()


def _retention_allows_any(
    tasks_log: FileLog,
    claims_log: FileLog,
    listed: dict[str, int],
    now: float,
    retention: Retention,
) -> bool:
    """Whether rule 3 (age or size) lets any sealed segment go: when none, the fold (a
    checkpoint restore and a catch-up: the costly part) is not even taken."""
    for topic, log in ((CLAIMS_TOPIC, claims_log), (TASKS_TOPIC, tasks_log)):
        sealed, total = _segments(log, listed[topic])
        facts = [Segment(base, end, size, mtime, -1) for base, end, size, mtime in sealed]
        if removable(facts, lambda s: True, total, now, retention):
            return True
    return False


def _plan(
    directory: Path,
    tasks_log: FileLog,
    claims_log: FileLog,
    listed: dict[str, int],
    now: float,
    retention: Retention,
) -> dict[str, list[Removed]]:
    """Fold both logs, choose the settled segments retention lets go, and make the durable
    checkpoint that lists them (steps 2 and 3 of the module docstring)."""
    tasks, claims = fold_logs(directory, tasks_log, claims_log)
    stop_at("folded")
    watermark = claims.state.watermark
    plan = {
        CLAIMS_TOPIC: _claims_plan(
            claims_log, listed[CLAIMS_TOPIC], claims.next_position, watermark, now, retention
        ),
    }
    plan[TASKS_TOPIC], tasks_before = _tasks_plan(
        tasks_log,
        listed[TASKS_TOPIC],
        first_task_id(directory),
        tasks,
        watermark,
        now,
        retention,
    )
    if any(plan.values()):
        checkpoint_plan(directory, tasks, tasks_log, claims, claims_log, tasks_before, listed, plan)
    return plan


def checkpoint_plan(
    location: Location,
    tasks: TaskIndex,
    tasks_log: Log,
    claims: ClaimsFollower,
    claims_log: Log,
    tasks_before: int,
    listed: dict[str, int],
    plan: dict[str, list[Removed]],
) -> None:
    """Make the checkpoint that covers `plan` durable, its prefix carried on, before any of
    it goes (step 3; the file log's and Redis's alike). CompactionError when it cannot be:
    then nothing is removed."""
    prefix = next_base(location, claims_log, tasks_before, listed, plan)
    try:
        save_checkpoint(
            location,
            tasks,
            tasks_log,
            claims,
            claims_log,
            removing=plan,
            base=prefix.to_plain(),
            locked=True,
        )
    except CheckpointError as e:
        raise CompactionError(f"nothing removed: {e}") from e


def next_base(
    directory: Location,
    claims_log: Log,
    tasks_before: int,
    listed: dict[str, int],
    plan: dict[str, list[Removed]],
) -> Prefix:
    """The fold of every claims record before the new start, as the report continues from
    it (queue_worker.history.prefix): the previous compaction's, continued over what goes now."""
    plain = read_base(directory)
    try:
        before = None if plain is None else Prefix.from_plain(plain)
    except CheckpointRefused as e:
        raise CompactionError(f"nothing removed: the checkpoint's prefix: {e}") from e
    begin = claims_log.origin if before is None else before.position
    if begin != listed[CLAIMS_TOPIC]:
        raise CompactionError(
            f"nothing removed: the checkpoint's prefix ends at {begin}, its list of removed "
            f"claims segments at {listed[CLAIMS_TOPIC]}"
        )
    end = plan[CLAIMS_TOPIC][-1].end if plan[CLAIMS_TOPIC] else begin
    return fold_prefix(before, _claims_between(claims_log, begin, end), end, tasks_before)


def _claims_between(log: Log, begin: int, end: int) -> Iterator[tuple[int, ClaimsRecord]]:
    """The claims records from `begin` to `end`, decoded as every reader decodes them."""
    if begin >= end:
        return
    for entry in log.iter_from(begin):
        if entry.position >= end:
            return
        try:
            yield entry.position, decode_claims_entry(entry)
        except RecordDecodeError:
            yield entry.position, Unknown(MALFORMED)


def fold_logs(
    directory: Location, tasks_log: Log, claims_log: Log
) -> tuple[TaskIndex, ClaimsFollower]:
    """The folds of both logs, caught up to their end."""
    try:
        tasks, claims = restore_checkpoint(directory, tasks_log, claims_log)
    except CheckpointRefused as e:
        if tasks_log.start != tasks_log.origin or claims_log.start != claims_log.origin:
            raise CompactionError(
                f"the logs were compacted and no usable checkpoint covers what was removed: {e}"
            ) from e
        tasks, claims = TaskIndex(tasks_log.start), ClaimsFollower(claims_log.start)
    tasks.catch_up(tasks_log)
    claims.catch_up(claims_log)
    # The checkpoint it writes must not grow with history: the index forgets the tasks the
    # fold has closed for ever, as a worker's does (TaskIndex.settle_below).
    tasks.settle_below(claims.state.watermark)
    return tasks, claims


def _sizes(log: FileLog) -> list[tuple[int, int]]:
    """(base, bytes on disk) of each segment file of the log."""
    found = []
    for base, path in segment_files(log.path):
        try:
            found.append((base, os.path.getsize(path)))
        except FileNotFoundError:
            continue
    return found


def _segments(log: FileLog, after: int) -> tuple[list[tuple[int, int, int, float]], int]:
    """(base, end, size, mtime) of each sealed segment from `after` on, and the topic's
    bytes on disk."""
    sealed = []
    total = 0
    ends = dict(log.sealed_segments())
    for base, path in segment_files(log.path):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        total += st.st_size
        if base in ends and base >= after:
            sealed.append((base, ends[base], st.st_size, st.st_mtime))
    return sealed, total


def _claims_plan(
    log: FileLog, after: int, folded_to: int, watermark: int, now: float, retention: Retention
) -> list[Removed]:
    sealed, total = _segments(log, after)
    facts: list[Segment] = []
    for base, end, size, mtime in sealed:
        if end > folded_to:
            break
        facts.append(Segment(base, end, size, mtime, _highest_claimed(log, base, end)))
        if facts[-1].highest_task >= watermark:
            break  # a prefix: nothing after an unsettled segment goes
    count = removable(
        facts, lambda s: claims_segment_settled(s, folded_to, watermark), total, now, retention
    )
    return [Removed(s.base, s.end, log.checksum(s.base, s.end)) for s in facts[:count]]


def _highest_claimed(log: FileLog, base: int, end: int) -> int:
    """The highest task id a claims record between `base` and `end` names (-1: none)."""
    highest = -1
    for entry in log.iter_from(base):
        if entry.position >= end:
            break
        try:
            record = decode_claims(entry.data)
        except RecordDecodeError:
            continue  # a malformed record changes nothing (the fold skips it)
        if not isinstance(record, Unknown) and record.task > highest:
            highest = record.task
    return highest


def first_task_id(directory: Location) -> int:
    """The id of the first retained tasks record: the tasks the last compaction removed."""
    plain = read_base(directory)
    try:
        return 0 if plain is None else Prefix.from_plain(plain).tasks
    except CheckpointRefused as e:
        raise CompactionError(f"nothing removed: the checkpoint's prefix: {e}") from e


def _tasks_plan(
    log: FileLog,
    after: int,
    first_id: int,
    tasks: TaskIndex,
    watermark: int,
    now: float,
    retention: Retention,
) -> tuple[list[Removed], int]:
    """The tasks segments that may go, and how many tasks are published before the first
    one kept. A task's id is its index in the topic, so each segment's ids are counted from
    its records (`first_id` is the id of the record at `after`): the task index cannot say,
    it forgets the positions of settled tasks (memory independent of history)."""
    sealed, total = _segments(log, after)
    facts: list[Segment] = []
    ends: list[int] = []  # tasks published before each segment's end
    next_id = first_id
    for base, end, size, mtime in sealed:
        if end > tasks.next_position:
            break
        next_id += _records_between(log, base, end)
        facts.append(Segment(base, end, size, mtime, next_id - 1))
        ends.append(next_id)
        if next_id - 1 >= watermark:
            break  # a prefix: nothing after an unsettled segment goes
    count = removable(
        facts,
        lambda s: tasks_segment_settled(s, tasks.next_position, watermark),
        total,
        now,
        retention,
    )
    removed = [Removed(s.base, s.end, log.checksum(s.base, s.end)) for s in facts[:count]]
    return removed, ends[count - 1] if count else first_id


def _records_between(log: FileLog, base: int, end: int) -> int:
    """How many records lie between `base` and `end`."""
    count = 0
    for entry in log.iter_from(base):
        if entry.position >= end:
            break
        count += 1
    return count


__all__ = [
    "STEPS",
    "Compacted",
    "CompactionError",
    "LogError",
    "compact",
    "first_task_id",
    "checkpoint_plan",
    "fold_logs",
    "next_base",
    "stop_at",
]
