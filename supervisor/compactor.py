"""The supervisor's compactor: `qw up` removes settled history as it runs.

On Redis (`qw up --dir redis://…`) the same thread trims the queue's streams
(`queue_worker.redis_compaction`); the estimate of what that freed is Redis's own (MEMORY
USAGE).

A thread of the supervisor (never a worker: compaction reads whole segments, which has no
place on a worker's path) runs `queue_worker.compact_queue.compact_queue` every `every_s` seconds
and says what it removed, or why it could not, as a dashboard event. A compaction killed
with the supervisor is safe (see queue_worker/compaction.py): the next one finishes it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

from logstore import LogError
from queue_worker.settled import Retention

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
        from queue_worker.compact_queue import compact_queue
        from queue_worker.compaction import CompactionError

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
