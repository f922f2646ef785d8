"""The supervisor's compactor: `qw up` removes settled history as it runs.

On Redis (`qw up --dir redis://…`) the same thread trims the queue's streams
(`queue_worker.compaction.redis_streams`); the estimate of what that freed is Redis's own (MEMORY
USAGE).

On a partitioned queue each partition is compacted on its own (its own logs, its own
settled history): a `qw up --partitions` runs one supervisor per partition, each with its
compactor; `qw up --rebalance` runs one compactor per partition (`start_compactors`).

A thread of the supervisor (never a worker: compaction reads whole segments, which has no
place on a worker's path) runs `queue_worker.compaction.compact_queue.compact_queue` every `every_s`
seconds
and says what it removed, or why it could not, as a dashboard event. A compaction killed
with the supervisor is safe (see queue_worker/compaction/files.py): the next one finishes it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

from logstore import LogError, is_redis_url, open_log
from queue_worker.compaction.settled import Retention
from queue_worker.partition_layout import partition_location
from queue_worker.topics import CLAIMS_TOPIC, TASKS_TOPIC, TOPICS

#: how often `qw up` compacts (seconds): a segment is tens of MiB, written in seconds at
#: the fastest; a minute keeps the disk within a few segments of the retention
COMPACT_EVERY_S: Final = 60.0


class Compactor(threading.Thread):
    """Compacts `directory` every `every_s` seconds until `stop`."""

    def __init__(
        self,
        directory: Path | str,
        retention: Retention,
        report: Callable[[str], None],
        every_s: float = COMPACT_EVERY_S,
    ) -> None:
        super().__init__(name="qw-compactor", daemon=True)
        self.directory = directory
        self.retention = retention
        self.every_s = every_s
        self._report = report
        self._stopping = threading.Event()
        #: compactions done (removing something or not), for the tests and the status
        self.runs = 0

    def run(self) -> None:
        while not self._stopping.wait(self.every_s):
            self.compact_once()

    def compact_once(self) -> None:
        from queue_worker.compaction.compact_queue import compact_queue
        from queue_worker.compaction.files import CompactionError

        try:
            done = compact_queue(self.directory, self.retention)
        except (CompactionError, LogError, OSError) as e:
            self._report(f"compaction skipped: {e}")
        else:
            removed = sum(len(r) for r in done.removed.values())
            if removed:
                self._report(
                    f"compacted: {removed} settled segment{'s' * (removed != 1)} removed "
                    f"({done.freed_bytes >> 20} MiB)"
                )
        self.runs += 1

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the compaction under way, if any (waits `timeout` seconds at most)."""
        self._stopping.set()
        if self.is_alive():
            self.join(timeout)


def start_compactors(
    location: str,
    partitions: int,
    retention: Retention | None,
    report: Callable[[int, str], None],
    *,
    segment_bytes: int | None = None,
    every_s: float = COMPACT_EVERY_S,
) -> list[Compactor]:
    """A started compactor for each partition of the queue at `location` (none when
    `retention` is None: never compacted), each saying what it did by `report(k, text)`;
    `segment_bytes`: the file log's segment size from now on, as `qw up` sets it."""
    compactors = []
    for k in range(partitions):
        where = partition_location(location, k, partitions)
        compactor = start_compactor(
            where, retention, _reporting(report, k), segment_bytes=segment_bytes, every_s=every_s
        )
        if compactor is not None:
            compactors.append(compactor)
    return compactors


def start_compactor(
    where: str,
    retention: Retention | None,
    report: Callable[[str], None],
    *,
    segment_bytes: int | None = None,
    every_s: float = COMPACT_EVERY_S,
) -> Compactor | None:
    """The file log's segment size from now on (`segment_bytes`, kept by the logs for every
    writer) and a started compactor for the queue at `where` (None when `retention` is None:
    never compacted), saying what it did by `report(text)`: what `qw up` runs on a queue and
    on each partition."""
    on_redis = is_redis_url(where)
    if segment_bytes is not None and not on_redis:
        for topic in (TASKS_TOPIC, CLAIMS_TOPIC):
            open_log(where, topic, family=TOPICS, segment_bytes=segment_bytes).close()
    if retention is None:
        return None
    compactor = Compactor(where if on_redis else Path(where), retention, report, every_s)
    compactor.start()
    return compactor


def _reporting(report: Callable[[int, str], None], k: int) -> Callable[[str], None]:
    return lambda text: report(k, text)
