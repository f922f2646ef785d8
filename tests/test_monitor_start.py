"""The supervisor's start-up check reads the tasks log only as far as it must.

`Monitor.check_start(count_all=False)` (what `qw up` runs before its workers start) folds
the claims to their end and reads the tasks log only until it holds every task the claims
closed; `poll` counts the rest. `qw status` (count_all) counts everything first.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from logstore import IdentityError
from queue_worker.config import WorkerConfig
from queue_worker.producer import Queue
from queue_worker.worker import Worker
from supervisor.monitor import Monitor


def enqueue(data: Path, count: int) -> None:
    with Queue(str(data), "none") as queue:
        queue.enqueue_many({"n": i} for i in range(count))


def drain(data: Path, run: Path) -> None:
    config = WorkerConfig(str(data), str(run), name="w0", exit_when_drained=True, fsync="none")
    with Worker(config, handler=lambda payload: None) as worker:
        worker.run()


def caught_up(monitor: Monitor) -> int:
    while not monitor.caught_up:
        monitor.poll()
    return monitor.queue_view().published


def test_a_fresh_backlog_is_not_read_before_the_workers_start(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    enqueue(data, 50)
    monitor = Monitor(str(data), batch=10)
    try:
        monitor.check_start(count_all=False)
        assert monitor.queue_view().published == 0  # no task closed: nothing to cover
        assert not monitor.caught_up and not monitor.is_drained()
        assert caught_up(monitor) == 50
        assert monitor.queue_view().pending == 50
    finally:
        monitor.close()


def test_the_tasks_the_claims_closed_are_read_first(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    enqueue(data, 5)
    drain(data, tmp_path / "run")  # tasks 0-4 done
    enqueue(data, 40)
    monitor = Monitor(str(data), batch=3)
    try:
        monitor.check_start(count_all=False)
        assert 5 <= monitor.queue_view().published < 45  # 0-4 read, not the whole log
        assert caught_up(monitor) == 45
        assert monitor.queue_view().done == 5
    finally:
        monitor.close()


def test_status_counts_everything_first(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    enqueue(data, 25)
    monitor = Monitor(str(data), batch=10, read_only=True)
    try:
        monitor.check_start()
        assert monitor.caught_up
        assert monitor.queue_view().published == 25
    finally:
        monitor.close()


def test_a_tasks_log_without_the_closed_tasks_is_still_refused(tmp_path: Path) -> None:
    """A tasks log cut short behind the claims (its sync file gone too): tasks 0-5 done,
    two tasks left in the log."""
    data = tmp_path / "qw"
    enqueue(data, 2)
    two_tasks_end = os.path.getsize(data / "tasks.log")
    enqueue(data, 4)
    drain(data, tmp_path / "run")
    os.truncate(data / "tasks.log", two_tasks_end)
    (data / "tasks.log.sync").unlink(missing_ok=True)
    monitor = Monitor(str(data), batch=1)
    try:
        with pytest.raises(IdentityError, match=r"holds 2 tasks, but .*closed task 5"):
            monitor.check_start(count_all=False)
    finally:
        monitor.close()
