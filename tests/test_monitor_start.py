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
from queue_worker.history.checkpoint import CHECKPOINT_NAME
from queue_worker.producer import Queue
from queue_worker.protocol.records import Done, decode_claims
from queue_worker.topics import open_topics
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.loop import Worker
from supervisor.run.fold_begin import CLOCK_MARGIN_US, begin_from_checkpoint
from supervisor.run.monitor import Monitor
from tests.helpers import log_end


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
    two_tasks_end = log_end(data / "tasks.log")
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


# -- a long history: begun from the fold checkpoint (supervisor.run.fold_begin) -------------------


def view_of(data: Path) -> tuple[dict[str, object], int]:
    """What a supervisor's monitor counts once caught up, and how many records it read."""
    monitor = Monitor(str(data))
    try:
        monitor.check_start(count_all=False)
        caught_up(monitor)
        view = vars(monitor.queue_view())
        counts = {k: v for k, v in view.items() if k not in ("throughput_history", "record_count")}
        return counts, view["record_count"]
    finally:
        monitor.close()


def history_with_a_checkpoint(tmp_path: Path) -> Path:
    """30 tasks drained (one failed once, then done on its retry), the checkpoint of the
    worker's exit covering them, then 5 tasks enqueued after it."""
    data = tmp_path / "qw"
    enqueue(data, 30)
    failed: set[object] = set()

    def handler(payload: dict[str, int]) -> None:
        if payload["n"] == 7 and 7 not in failed:
            failed.add(7)
            raise ValueError("once")

    config = WorkerConfig(
        str(data), str(tmp_path / "run"), name="w0", exit_when_drained=True, fsync="none",
        backoff_s=0.001,
    )  # fmt: skip
    with Worker(config, handler=handler) as worker:
        worker.run()
    assert (data / CHECKPOINT_NAME).exists()
    enqueue(data, 5)
    return data


def test_a_long_history_is_begun_from_its_checkpoint(tmp_path: Path) -> None:
    data = history_with_a_checkpoint(tmp_path)
    counts, records = view_of(data)
    full, all_records = view_of_without_checkpoint(data, tmp_path)
    assert records == 5  # the tasks enqueued after it; no claims record read again
    assert all_records > 60
    # the same counts; the rate "now" is of the DONEs the monitor read (none, here)
    assert counts["throughput_now"] == 0
    assert {**counts, "throughput_now": 0} == {**full, "throughput_now": 0}
    assert counts["published"] == 35 and counts["done"] == 30 and counts["pending"] == 5
    assert counts["failed"] == 1  # the FAIL before the checkpoint, which it counted


def view_of_without_checkpoint(data: Path, tmp_path: Path) -> tuple[dict[str, object], int]:
    """`view_of` with the checkpoint set aside (a fold from the logs' start)."""
    aside = tmp_path / "checkpoint.aside"
    (data / CHECKPOINT_NAME).rename(aside)
    try:
        return view_of(data)
    finally:
        aside.rename(data / CHECKPOINT_NAME)


def test_a_damaged_checkpoint_is_a_fold_from_the_start(tmp_path: Path) -> None:
    data = history_with_a_checkpoint(tmp_path)
    path = data / CHECKPOINT_NAME
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    counts, records = view_of(data)
    full, all_records = view_of_without_checkpoint(data, tmp_path)
    assert records == all_records > 60  # every record read again
    # (the rate "now" moves with the real clock between the two readings)
    assert {**counts, "throughput_now": 0} == {**full, "throughput_now": 0}


def test_a_reader_of_the_recent_rate_folds_when_the_checkpoint_is_that_recent(
    tmp_path: Path,
) -> None:
    """`qw status`'s rule (`since_us`): a checkpoint whose last claims record is within the
    window (and the clock margin) of it is not begun from."""
    data = history_with_a_checkpoint(tmp_path)
    tasks, claims = open_topics(str(data), read_only=True)
    try:
        begun = begin_from_checkpoint(str(data), tasks, claims, None)
        assert begun is not None
        last = begun[1].last_position
        assert last is not None
        record = decode_claims(claims.read(last, 1)[0].data)
        assert isinstance(record, Done)
        at = record.at
        assert begin_from_checkpoint(str(data), tasks, claims, at + CLOCK_MARGIN_US + 1)
        assert begin_from_checkpoint(str(data), tasks, claims, at + CLOCK_MARGIN_US) is None
        assert begin_from_checkpoint(str(data), tasks, claims, at) is None
    finally:
        tasks.close()
        claims.close()
