"""The queue's counts as `qw status` shows them: a fold of the whole claims log, now (one
place for the single queue and each partition of a partitioned one)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from queue_worker.state import Lease
    from supervisor.model import QueueView


def queue_counts(location: str) -> tuple[QueueView, list[tuple[int, Lease, float | None]]]:
    """The queue as a fold of the whole claims log says it is now, and its held tasks."""
    from supervisor.monitor import Monitor

    monitor = Monitor(location, read_only=True)
    try:
        monitor.check_start()  # damage anywhere is an error, not a count that stops short
        return monitor.queue_view(), monitor.held_leases()
    finally:
        monitor.close()


__all__ = ["queue_counts"]
