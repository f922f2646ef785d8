"""TaskIndex keeps the bytes of small TASK records a worker is likely to run."""

from __future__ import annotations

from typing import Any

import pytest

import queue_worker.topics as topics
from logstore import Entry, MemoryLog
from queue_worker.producer import Queue
from queue_worker.topics import KEEP_MAX_BYTES, TaskIndex


class CountingLog(MemoryLog):
    """A memory log that counts the reads that start at a task's own position."""

    def __init__(self) -> None:
        super().__init__("tasks")
        self.point_reads = 0

    def read(self, position: int, max_records: int | None = None) -> list[Entry]:
        if max_records == 1:
            self.point_reads += 1
        return super().read(position, max_records)


def indexed(payloads: list[Any], slot: int = 0, slots: int = 1) -> tuple[TaskIndex, CountingLog]:
    log = CountingLog()
    Queue("memory", tasks_log=log).enqueue_many(payloads)
    index = TaskIndex(log.start)
    index.keep_payloads(slot, slots)
    index.catch_up(log)
    return index, log


def test_a_kept_task_loads_without_reading_the_log() -> None:
    index, log = indexed([{"n": n} for n in range(6)], slot=1, slots=3)
    assert index.load(log, 1).payload == {"n": 1}  # slot 1: kept
    assert log.point_reads == 0
    assert index.load(log, 2).payload == {"n": 2}  # slot 2: read back from the log
    assert log.point_reads == 1
    # A kept record is handed out once; loading it again reads the log.
    assert index.load(log, 1).payload == {"n": 1}
    assert log.point_reads == 2


def test_a_large_payload_is_not_kept() -> None:
    index, log = indexed(["x" * KEEP_MAX_BYTES, "small"])
    assert index.load(log, 0).payload == "x" * KEEP_MAX_BYTES
    assert log.point_reads == 1
    assert index.load(log, 1).payload == "small"
    assert log.point_reads == 1


def test_closed_tasks_are_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    index, log = indexed(list(range(10)))
    index.forget_kept_below(7)
    assert index.load(log, 6) == index.load(log, 6)  # both read from the log
    assert log.point_reads == 2
    assert index.load(log, 7).payload == 7
    assert log.point_reads == 2


def test_at_most_keep_max_records_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topics, "KEEP_MAX_RECORDS", 3)
    index, log = indexed(list(range(5)))
    assert [index.load(log, t).payload for t in range(5)] == list(range(5))
    assert log.point_reads == 2  # tasks 3 and 4 were not kept


def test_an_index_kept_for_every_slot_narrows_to_one_slot() -> None:
    # The fork server's fold keeps every slot's records; the worker that inherits it keeps
    # only its own, and no more than its limit (queue_worker.worker.inherited).
    index, log = indexed(list(range(12)))
    index.keep_payloads(1, 3, limit=3)
    assert [index.load(log, t).payload for t in (1, 4, 7)] == [1, 4, 7]
    assert log.point_reads == 0
    assert index.load(log, 10).payload == 10  # beyond the limit: read back from the log
    assert index.load(log, 0).payload == 0  # another slot's: read back from the log
    assert log.point_reads == 2
