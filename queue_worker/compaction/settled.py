"""What is settled history: which segments of a queue's logs compaction may remove.

Protocol knowledge, with no I/O (the protocol's section 10 states the same rules). A
segment of a topic may go only when all of these hold:

1. **Covered.** The fold checkpoint that will be durable before the segment goes has
   folded past the segment's end: the claims fold (for the claims topic) or the task
   index (for the tasks topic). What the segment changed — which tasks are done or dead,
   the counts the report shows — is in the checkpoint.
2. **Settled.** Every task it names is closed (done or dead) in that fold: a claims
   segment's records all name tasks below the fold's watermark (every task below it is
   closed); a tasks segment holds only TASK records of tasks below it. A closed task has
   no live lease, no FAIL backoff and no claim left to settle, and never will (rule 4 and 5
   of the fold: done and dead are for ever), so no reader needs its records again.
3. **Retained long enough.** It is older than the retention (its last record was written
   more than `Retention.seconds` ago), or the topic is over its size budget
   (`Retention.bytes`, counting every segment, the active one too) without it.
4. **A prefix.** Segments go from the oldest, never one after a segment that stays: a log
   is always its start, then every record after it.

The active segment (still appended to) never goes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

#: one day, one GiB a topic: a laptop's disk is bounded by both (`qw up --help` shows them)
DEFAULT_RETENTION_S: Final = 24 * 3600.0
DEFAULT_RETENTION_BYTES: Final = 1 << 30


class Retention(NamedTuple):
    """How long settled history is kept: for `seconds`, and within `bytes` a topic."""

    seconds: float = DEFAULT_RETENTION_S
    bytes: int = DEFAULT_RETENTION_BYTES


class Segment(NamedTuple):
    """A sealed segment as compaction sees it."""

    base: int  # the position of its first record
    end: int  # the position after its last record (the next segment's base)
    size: int  # bytes on disk
    written_at: float  # when its last record was written (the file's mtime), seconds
    #: the highest task id a record of it names (claims: its records' tasks; tasks: its
    #: last task's id); -1 when it names none
    highest_task: int


def claims_segment_settled(segment: Segment, folded_to: int, watermark: int) -> bool:
    """Rules 1 and 2 for a claims segment: the claims fold (at `folded_to`) covers it, and
    every task its records name is below the fold's watermark (closed)."""
    return segment.end <= folded_to and segment.highest_task < watermark


def tasks_segment_settled(segment: Segment, indexed_to: int, watermark: int) -> bool:
    """Rules 1 and 2 for a tasks segment: the task index (at `indexed_to`) covers it, and
    every task in it is below the claims fold's watermark (closed)."""
    return segment.end <= indexed_to and segment.highest_task < watermark


def removable(
    sealed: Sequence[Segment],
    settled: Callable[[Segment], bool],
    topic_bytes: int,
    now: float,
    retention: Retention,
) -> int:
    """How many of the `sealed` segments (oldest first) may go: rules 3 and 4 on top of
    `settled` (rules 1 and 2). `topic_bytes`: the size of every segment of the topic."""
    over = topic_bytes - retention.bytes  # bytes over the budget still to shed
    count = 0
    for segment in sealed:
        old = now - segment.written_at > retention.seconds
        if not (old or over > 0) or not settled(segment):
            break
        over -= segment.size
        count += 1
    return count
