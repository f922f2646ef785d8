"""The task index keeps only the tasks at or above the fold's watermark (issue 14, item 4).

Against the unpruned index (the same records, never told a watermark), over generated
histories: every task still needed (at or above the watermark) gets the same answers
(position, foreign, unreadable, its loaded record), every task below reads as settled, and
what the index holds stays within twice the live tasks (plus the compaction's minimum) —
also through a snapshot and restore, as a checkpoint does.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import queue_worker.topics as topics
from logstore import MemoryLog
from queue_worker.history.checkpoint import CHECKPOINT_NAME, CheckpointRefused, restore_checkpoint
from queue_worker.producer import Queue
from queue_worker.protocol.records import RecordDecodeError, TaskRecord, encode
from queue_worker.topics import TaskIndex, TaskSettledError, open_topics
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.loop import Worker
from tests.examples import examples

UNKNOWN_TYPE: bytes = msgpack.packb([1, "X", "from a newer writer"])
GARBAGE = b"\xc1 not msgpack"

# A history: ("task", kind) appends a record (a task, a foreign one, a malformed one);
# ("settle", n) moves the watermark n ids on (it may pass the tasks indexed so far: the
# claims fold can close a task this worker has not read yet); ("catch_up",) indexes what
# is in the log; ("restore",) replaces the index by a restore of its snapshot.
_step = st.one_of(
    st.tuples(st.just("task"), st.sampled_from(["ok", "ok", "ok", "foreign", "garbage"])),
    st.tuples(st.just("settle"), st.integers(0, 12)),
    st.tuples(st.just("catch_up")),
    st.tuples(st.just("restore")),
)


def _record(kind: str, n: int) -> bytes:
    if kind == "foreign":
        return UNKNOWN_TYPE
    if kind == "garbage":
        return GARBAGE
    return encode(TaskRecord(payload={"n": n}, enqueued_at=n))


def _answers(index: TaskIndex, log: MemoryLog, task: int) -> tuple[Any, ...]:
    try:
        loaded: Any = index.load(log, task).payload
    except RecordDecodeError as e:
        loaded = ("unreadable", str(e))
    return (
        index.position_of(task),
        task in index.foreign,
        index.unreadable.get(task),
        loaded,
    )


def _check(
    index: TaskIndex, reference: TaskIndex, log: MemoryLog, watermark: int, compact_min: int
) -> None:
    assert (index.known, index.next_position) == (reference.known, reference.next_position)
    settled = index.settled
    assert settled == watermark  # settled is exactly what the fold closed
    for task in range(index.known):
        if task < settled:
            assert index.position_of(task) is None
            assert task not in index.foreign and task not in index.unreadable
            with pytest.raises(TaskSettledError):
                index.load(log, task)
        else:
            assert _answers(index, log, task) == _answers(reference, log, task)
    live = max(0, index.known - settled)
    assert index.indexed <= max(2 * live, live + compact_min)
    assert index.snapshot().first == reference.snapshot().first
    assert index.snapshot().last == reference.snapshot().last


@settings(max_examples=examples(300), deadline=None)
@given(steps=st.lists(_step, max_size=80), compact_min=st.integers(1, 8))
def test_answers_for_live_tasks_are_the_unpruned_index_answers(
    steps: list[tuple[Any, ...]], compact_min: int
) -> None:
    log = MemoryLog("tasks")
    index, reference = TaskIndex(log.start), TaskIndex(log.start)
    watermark = 0
    with mock.patch.object(topics, "COMPACT_MIN_TASKS", compact_min):
        for step in steps:
            if step[0] == "task":
                log.append(_record(step[1], len(log.read(log.start))))
            elif step[0] == "settle":
                watermark += step[1]
                index.settle_below(watermark)
            elif step[0] == "catch_up":
                assert index.catch_up(log) == reference.catch_up(log)
            else:
                index = TaskIndex.restore(index.snapshot())
            _check(index, reference, log, watermark, compact_min)
        index.catch_up(log)
        reference.catch_up(log)
        _check(index, reference, log, watermark, compact_min)


def test_memory_follows_the_live_tasks_not_the_history() -> None:
    """200k tasks through the index, settled as they go, leave it holding at most the live
    tasks plus the compaction's minimum, at 100k as at 200k; the unpruned one holds all."""
    log = MemoryLog("tasks")
    index, reference = TaskIndex(log.start), TaskIndex(log.start)
    record = encode(TaskRecord(payload=None, enqueued_at=0))
    total, live = 200_000, 100
    for first in range(0, total, 1000):
        log.append_many([record] * 1000)
        index.catch_up(log)
        reference.catch_up(log)
        index.settle_below(first + 1000 - live)
        if first == 100_000:
            halfway = index.indexed
    assert reference.indexed == total
    bound = live + topics.COMPACT_MIN_TASKS
    assert halfway <= bound and index.indexed <= bound
    assert index.position_of(total - 1) == reference.position_of(total - 1)
    assert index.position_of(0) is None


def test_a_restored_index_keeps_its_watermark() -> None:
    log = MemoryLog("tasks")
    log.append_many([encode(TaskRecord(payload=n, enqueued_at=0)) for n in range(10)])
    index = TaskIndex(log.start)
    index.catch_up(log)
    index.settle_below(4)
    restored = TaskIndex.restore(index.snapshot())
    assert restored.settled == 4
    assert [restored.position_of(t) for t in range(10)] == [index.position_of(t) for t in range(10)]
    assert restored.load(log, 4).payload == 4


# -- through the fold checkpoint, on real file logs --------------------------------------------


def _drain(data: Path, count: int) -> None:
    with Queue(data, fsync="none") as queue:
        queue.enqueue_many(list(range(count)))
    config = WorkerConfig(str(data), str(data.parent / "run"), exit_when_drained=True, fsync="none")
    with Worker(config, handler=lambda payload: payload) as worker:
        assert worker.run() == "queue drained"  # slot 0 saves the checkpoint at exit


def _rewrite_body(data: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = data / CHECKPOINT_NAME
    outer = msgpack.unpackb(path.read_bytes())
    body = msgpack.unpackb(outer["body"])
    change(body)
    packed = msgpack.packb(body, use_bin_type=True)
    outer.update(body=packed, crc32=zlib.crc32(packed))
    path.write_bytes(msgpack.packb(outer, use_bin_type=True))


def test_the_checkpoint_saves_only_the_live_tasks(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _drain(data, 50)
    with Queue(data, fsync="none") as queue:
        queue.enqueue_many([50, 51])  # live: pending when the checkpoint is read
        tasks_log, claims_log = open_topics(data)
    with tasks_log, claims_log:
        index, _ = restore_checkpoint(data, tasks_log, claims_log)
        assert (index.known, index.settled, index.indexed) == (50, 50, 0)
        assert index.catch_up(tasks_log) == 2
        replay = TaskIndex(tasks_log.start)
        replay.catch_up(tasks_log)
        assert [index.position_of(t) for t in (50, 51)] == [replay.position_of(t) for t in (50, 51)]
        assert index.load(tasks_log, 51).payload == 51


def test_a_checkpoint_saved_before_the_watermark_loads(tmp_path: Path) -> None:
    """The format before this change: every position from task 0, no base or watermark."""
    data = tmp_path / "data"
    _drain(data, 20)
    tasks_log, claims_log = open_topics(data)
    with tasks_log, claims_log:
        replay = TaskIndex(tasks_log.start)
        replay.catch_up(tasks_log)
        everything = replay.snapshot().positions.tobytes()  # little-endian on this machine

        def to_old(body: dict[str, Any]) -> None:
            for key in ("first", "last", "base", "settled"):
                del body["tasks"][key]
            body["tasks"]["positions"] = everything

        _rewrite_body(data, to_old)
        index, follower = restore_checkpoint(data, tasks_log, claims_log)
        assert (index.known, index.settled, index.indexed) == (20, 0, 20)
        assert [index.position_of(t) for t in range(20)] == [
            replay.position_of(t) for t in range(20)
        ]
        index.settle_below(follower.state.watermark)  # what the worker's next catch-up does
        assert (index.settled, index.indexed) == (20, 0)


def test_a_checkpoint_whose_watermark_does_not_fit_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _drain(data, 5)

    def settled_below_base(body: dict[str, Any]) -> None:
        body["tasks"]["base"] = body["tasks"]["settled"] + 1

    _rewrite_body(data, settled_below_base)
    tasks_log, claims_log = open_topics(data)
    with tasks_log, claims_log, pytest.raises(CheckpointRefused, match="settled below"):
        restore_checkpoint(data, tasks_log, claims_log)


def test_a_checkpoint_whose_index_settled_more_than_the_fold_closed_is_refused(
    tmp_path: Path,
) -> None:
    """The index would answer "settled" for a task the fold still has open (one a worker
    may win): such a checkpoint is refused, and the worker replays."""
    data = tmp_path / "data"
    _drain(data, 5)
    with Queue(data, fsync="none") as queue:
        queue.enqueue_many([5, 6])

    def settled_too_far(body: dict[str, Any]) -> None:
        body["tasks"]["settled"] = body["claims"]["state"]["watermark"] + 1

    _rewrite_body(data, settled_too_far)
    tasks_log, claims_log = open_topics(data)
    with tasks_log, claims_log, pytest.raises(CheckpointRefused, match="has not closed"):
        restore_checkpoint(data, tasks_log, claims_log)
