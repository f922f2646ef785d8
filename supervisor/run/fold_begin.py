"""Where a reader of the whole queue begins its fold: from the fold checkpoint when one covers
the logs, else from their start. One answer for `qw status` (`supervisor.cli.queue_counts`) and
the supervisor's monitor (`supervisor.run.monitor`), whose counts tests/test_queue_counts.py
holds equal.

Without it both folded every claims record the queue ever had before they answered: on a
queue that had run 500,000 tasks, `qw up` took ~2 s before its first worker started, and
`qw status` ~0.7 s. The workers already begin from the checkpoint
(`queue_worker.history.checkpoint`,
saved by the worker in slot 0 every 8 MiB of claims and at its exit).

The checkpoint holds the fold's state and task index (the FAILs accepted included), so the
counts from it are those of a full fold, with one exception: it keeps no times, so the DONEs
it covers are in no throughput count. `qw status` shows the rate of the last seconds as it
is now, so it begins from the checkpoint only when the last claims record it covers is
older than that window by CLOCK_MARGIN_US (workers' clocks differ a little, and records
stamped a moment apart may be appended in the other order); otherwise it folds from the
start, as before. The monitor begins from a checkpoint however recent: its rate is of what
it has seen (a dashboard's throughput history starts at its checkpoint), and a supervisor
that starts while another one's workers run, saving checkpoints as they go, must not fold
the whole history for the sake of three seconds of its chart.

On logs that hold every record a checkpoint is a cache, used only when it is whole and valid:
refused or missing, the fold starts from the logs' start, and damage in what a checkpoint
covers is met there. A compacted log has no start to fold from: there a refused checkpoint
is an error (IdentityError, naming why).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from logstore import Log
    from queue_worker.topics import ClaimsFollower, TaskIndex

MICROS: Final = 1_000_000
#: how much older than the reader's window the checkpoint's last claims record must be
CLOCK_MARGIN_US: Final = 1_000_000


def begin_from_checkpoint(
    location: str, tasks: Log, claims: Log, since_us: int | None
) -> tuple[TaskIndex, ClaimsFollower] | None:
    """The task index and claims fold to go on from, or None: fold from the logs' start.

    `since_us`: the start (µs) of the window of DONEs the reader must count (None: any
    checkpoint will do). Raises IdentityError when the logs were compacted and the
    checkpoint is refused.
    """
    from logstore import IdentityError, is_redis_url
    from queue_worker.history.checkpoint import CheckpointRefused, restore_checkpoint

    compacted = tasks.start != tasks.origin or claims.start != claims.origin
    try:
        where = location if is_redis_url(location) else Path(location)
        index, follower = restore_checkpoint(where, tasks, claims)
    except CheckpointRefused as e:
        if not compacted:
            return None  # a cache: the fold from the start gives the same counts
        raise IdentityError(
            f"{claims.name}: the logs were compacted and their fold checkpoint cannot be used: {e}"
        ) from e
    # (a compacted log has no DONEs but the checkpoint's to count: it is begun from,
    # whatever the throughput then misses)
    if not compacted and since_us is not None and _too_recent(claims, follower, since_us):
        return None
    return index, follower


def _too_recent(claims: Log, follower: ClaimsFollower, since_us: int) -> bool:
    """Whether DONEs the checkpoint covers may fall at or after `since_us`. Its last record
    is older than any it covers, give or take the workers' clocks and the order of their
    appends (CLOCK_MARGIN_US); a record with no time, or none readable, says nothing."""
    from logstore import LogError
    from queue_worker.protocol.records import RecordDecodeError, Unknown
    from queue_worker.topics import decode_claims_entry

    last = follower.last_position
    if last is None:
        return False  # it covers no claims record: no DONE either
    try:
        record = decode_claims_entry(claims.read(last, 1)[0])
    except (LogError, RecordDecodeError, IndexError):
        return True
    return isinstance(record, Unknown) or record.at + CLOCK_MARGIN_US >= since_us
