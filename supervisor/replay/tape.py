"""Reading a recorded run for a replay: the claims records (the tape) and the ops records
that sit on it.

The tape is the claims log as every worker read it (`read_claims_batches`: the same
records, at the same positions, as `qw report` replays). Ops records (kills, pauses,
deaths: queue_worker.ops) are about the run, never read by the fold: each is placed on the
tape after the last record written before it (by the records' own clocks).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

from logstore import LogError
from logstore.location import shown
from queue_worker.ops import OpRecord, held_by, read_ops
from queue_worker.partition_layout import partition_location, read_manifest
from queue_worker.proof.log_reading import (
    ReportInputError,
    compacted_prefix,
    has_logs,
    missing_logs_text,
    read_claims_batches,
)
from queue_worker.protocol.records import ClaimsRecord, Unknown


@dataclass(frozen=True)
class Tape:
    """A run's claims records in log order, with their positions and what indexes them."""

    location: str
    records: Sequence[ClaimsRecord]
    positions: Sequence[int]
    # the tape's clock: each record's at, raised to the largest before it (a writer's
    # clock a little behind another's does not move time backwards); an unknown record
    # has the time of the one before it
    clock: Sequence[int]
    ops: tuple[OpRecord, ...] = ()
    by_task: dict[int, list[int]] = field(default_factory=dict)  # task -> record indices
    op_index: tuple[int, ...] = ()  # each op's place: the index of the record before it

    @functools.cached_property
    def by_worker(self) -> dict[str, list[int]]:
        """Worker id -> the indices of its records (made when first asked: following a
        worker, or placing an ops record on a lane)."""
        found: dict[str, list[int]] = {}
        unknown = Unknown
        for i, record in enumerate(self.records):
            if type(record) is not unknown:
                assert not isinstance(record, Unknown)  # (for the type checker)
                indices = found.get(record.worker)
                if indices is None:
                    found[record.worker] = [i]
                else:
                    indices.append(i)
        return found

    def __len__(self) -> int:
        return len(self.records)

    def index_at(self, position: int) -> int:
        """The index of the last record at or before `position` (-1: none): the tape as
        `qw report --at POSITION` replays it."""
        return bisect.bisect_right(self.positions, position) - 1

    def index_at_time(self, at: int) -> int:
        """The index of the last record written at or before `at`, by the tape's clock."""
        return bisect.bisect_right(self.clock, at) - 1

    def op_worker(self, op: OpRecord) -> str | None:
        """The worker id an ops record is about, when its process wrote claims records."""
        if op.worker is not None and op.worker in self.by_worker:
            return op.worker
        return next((w for w in self.by_worker if held_by(op, w)), None)


def partition_of(location: str, partition: int | None) -> str:
    """The location whose claims log is the tape: `location` itself, or its partition
    `partition`. ReportInputError for a partitioned queue without one, or a partition it
    does not have, or a partition asked of a queue without partitions."""
    try:
        manifest = read_manifest(location)
    except (LogError, ValueError) as e:
        raise ReportInputError(str(e)) from e
    if manifest is None:
        if partition is not None:
            raise ReportInputError(
                f"--partition {partition}: {shown(location)} holds a queue without partitions"
            )
        return location
    count = manifest.count
    if partition is None:
        raise ReportInputError(
            f"{shown(location)} holds a queue of {count} partitions, each its own tape: "
            f"give --partition K (0 to {count - 1})"
        )
    if not 0 <= partition < count:
        raise ReportInputError(
            f"--partition {partition}: {shown(location)} has partitions 0 to {count - 1}"
        )
    return partition_location(location, partition, count)


def load_tape(location: str, ops_location: str | None = None) -> Tape:
    """The tape of the run at `location` (a data directory, a redis:// URL, or one
    partition's); its ops from `ops_location` when given (a partitioned queue's are the
    whole queue's). ReportInputError for no logs, a damaged log, or compacted logs (their
    first records are gone: a replay from the start cannot be made)."""
    try:
        if not has_logs(location):
            raise ReportInputError(missing_logs_text(location))
        if compacted_prefix(location) is not None:
            raise ReportInputError(
                f"{shown(location)}: the logs were compacted (qw compact), so the run's first "
                "records are gone and a replay from the start cannot be made"
            )
        records: list[ClaimsRecord] = []
        positions: list[int] = []
        for batch, at in read_claims_batches(location):
            records.extend(batch)
            positions.extend(at)
        ops, _ = read_ops(location)
        if not ops and ops_location is not None:
            ops, _ = read_ops(ops_location)
    except (LogError, OSError) as e:
        raise ReportInputError(str(e)) from e
    return make_tape(location, records, positions, ops)


def make_tape(
    location: str,
    records: Sequence[ClaimsRecord],
    positions: Sequence[int],
    ops: Sequence[OpRecord] = (),
) -> Tape:
    """A tape of these records (in log order, with their positions) and ops, indexed."""
    by_task: dict[int, list[int]] = {}
    clock: list[int] = []
    now = 0
    unknown = Unknown
    for i, record in enumerate(records):
        if type(record) is unknown:
            clock.append(now)
            continue
        assert not isinstance(record, Unknown)  # (for the type checker: `type` is faster)
        at = record.at
        if at > now:
            now = at
        clock.append(now)
        indices = by_task.get(record.task)
        if indices is None:
            by_task[record.task] = [i]
        else:
            indices.append(i)
    ordered = tuple(sorted(ops, key=lambda op: op.at))
    places = tuple(bisect.bisect_right(clock, op.at) - 1 for op in ordered)
    return Tape(location, records, positions, clock, ordered, by_task, places)


__all__ = ["Tape", "load_tape", "make_tape", "partition_of"]
