"""When a worker's stats snapshot is written: a state change soon, unless the worker is
running through tasks faster than anyone can follow its state."""

from __future__ import annotations

import threading
from pathlib import Path

from queue_worker.worker.publisher import (
    BUSY_TASKS,
    PUBLISH_PERIOD_S,
    STATE_GAP_S,
    SnapshotPublisher,
)
from queue_worker.worker.stats import WorkerStats, read_snapshot
from tests.helpers import wait_until


def publisher(tmp_path: Path) -> SnapshotPublisher:
    stats = WorkerStats(worker="w0-1-abcd", name="w0", pid=1, host="box", started_at=0.0)
    return SnapshotPublisher(stats, tmp_path / "w0.json", threading.Lock())


def test_a_state_change_is_due_within_the_gap(tmp_path: Path) -> None:
    pub = publisher(tmp_path)
    pub.publish(force=True)  # a write: the gaps count from here
    assert pub._due() > STATE_GAP_S  # nothing changed: the ordinary period
    pub.stats.state = "working"
    assert pub._due() <= STATE_GAP_S


def test_a_busy_workers_state_changes_wait_the_period(tmp_path: Path) -> None:
    pub = publisher(tmp_path)
    pub.publish(force=True)
    pub.stats.state = "working"
    pub.stats.finished += BUSY_TASKS  # ended that many tasks since the write
    assert STATE_GAP_S < pub._due() <= PUBLISH_PERIOD_S
    pub.publish(force=True)  # written: its figures are the latest
    snapshot = read_snapshot(tmp_path / "w0.json")
    assert snapshot is not None and snapshot["finished"] == BUSY_TASKS
    pub.stats.state = "idle"  # one state change after the write, no task ended: soon
    assert pub._due() <= STATE_GAP_S


def test_each_change_published_reaches_the_file(tmp_path: Path) -> None:
    """publish() asks the thread for a write and returns: after each write the next change
    is asked for again (`_requested` is cleared with the event), so none is left unwritten."""
    pub = publisher(tmp_path)

    def written_state() -> object:
        return (read_snapshot(tmp_path / "w0.json") or {}).get("state")

    for state in ("idle", "claiming", "working", "idle"):
        pub.stats.state = state
        pub.publish()
        wait_until(lambda: written_state() == pub.stats.state, what=f"state {state!r} written")
