"""The producer: task ids are indexes in the tasks log, in every process, and a bad payload
writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from logstore import Log, MemoryLog, open_log
from queue_worker.producer import Queue
from queue_worker.protocol.records import RecordEncodeError, TaskRecord, decode_task
from queue_worker.topics import TASKS_TOPIC

REPO = Path(__file__).resolve().parent.parent


def payloads_in_log_order(log: Log) -> list[object]:
    records = [decode_task(e.data) for e in log.iter_from(log.start)]
    assert all(isinstance(r, TaskRecord) for r in records)
    return [r.payload for r in records if isinstance(r, TaskRecord)]


def test_ids_are_indexes_from_zero() -> None:
    log = MemoryLog("tasks")
    with Queue("memory", tasks_log=log) as queue:
        assert [queue.enqueue(f"t{i}") for i in range(5)] == [0, 1, 2, 3, 4]
    assert payloads_in_log_order(log) == [f"t{i}" for i in range(5)]


def test_many_at_once_get_consecutive_ids() -> None:
    log = MemoryLog("tasks")
    queue = Queue("memory", tasks_log=log)
    assert queue.enqueue("first") == 0
    assert queue.enqueue_many(["a", "b", "c"]) == [1, 2, 3]
    assert queue.enqueue_many([]) == []
    assert queue.enqueue("last") == 4
    assert payloads_in_log_order(log) == ["first", "a", "b", "c", "last"]


def test_two_producers_on_one_log_get_distinct_ids_in_log_order() -> None:
    log = MemoryLog("tasks")
    left, right = Queue("memory", tasks_log=log), Queue("memory", tasks_log=log)
    ids: dict[int, str] = {}
    for i in range(10):
        producer, name = (left, "left") if i % 3 else (right, "right")
        batch = [f"{name}{i}a", f"{name}{i}b"]
        ids.update(zip(producer.enqueue_many(batch), batch, strict=True))
    assert sorted(ids) == list(range(20))
    assert payloads_in_log_order(log) == [ids[i] for i in range(20)]


def test_enqueued_at_is_the_producers_clock() -> None:
    log = MemoryLog("tasks")
    Queue("memory", tasks_log=log, clock=lambda: 1234).enqueue({"k": [1, 2]})
    record = decode_task(log.read(0)[0].data)
    assert record == TaskRecord({"k": [1, 2]}, 1234)


def test_an_unencodable_payload_names_the_value_and_writes_nothing() -> None:
    log = MemoryLog("tasks")
    queue = Queue("memory", tasks_log=log)
    with pytest.raises(RecordEncodeError) as info:
        queue.enqueue_many(["fine", {"when": object}, "also fine"])
    assert "payload 1 ({'when': <class 'object'>})" in str(info.value)
    assert log.end() == log.start
    assert queue.enqueue("after") == 0


def test_a_payload_too_large_for_the_log_writes_nothing() -> None:
    log = MemoryLog("tasks", max_record=100)
    queue = Queue("memory", tasks_log=log)
    with pytest.raises(Exception, match="exceeds the maximum record size"):
        queue.enqueue_many(["small", "x" * 1000])
    assert log.end() == log.start


def test_an_unknown_fsync_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fsync policy 'sometimes'"):
        Queue("memory", "sometimes", tasks_log=MemoryLog())


PRODUCER_SCRIPT = """
import json, sys
from queue_worker.producer import Queue
location, name, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids = {}
with Queue(location) as queue:
    for r in range(rounds):
        batch = [f"{name}-{r}-{k}" for k in range(r % 3 + 1)]
        for task, payload in zip(queue.enqueue_many(batch), batch):
            ids[task] = payload
print(json.dumps(ids))
"""


def run_producers(location: str, count: int, rounds: int) -> dict[int, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PRODUCER_SCRIPT, location, f"p{n}", str(rounds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for n in range(count)
    ]
    ids: dict[int, str] = {}
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        for task, payload in json.loads(out).items():
            assert int(task) not in ids, f"task id {task} given twice"
            ids[int(task)] = payload
    return ids


def check_ids_match_log_order(ids: dict[int, str], log: Log) -> None:
    payloads = payloads_in_log_order(log)
    assert sorted(ids) == list(range(len(payloads)))
    assert [ids[i] for i in range(len(payloads))] == payloads


def test_concurrent_producers_in_processes_get_distinct_ids_in_log_order(data_dir: Path) -> None:
    ids = run_producers(str(data_dir), count=4, rounds=40)
    with open_log(data_dir, TASKS_TOPIC) as log:
        check_ids_match_log_order(ids, log)


@pytest.mark.redis
def test_concurrent_producers_on_redis_get_distinct_ids_in_log_order(redis_url: str) -> None:
    ids = run_producers(redis_url, count=3, rounds=20)
    with open_log(redis_url, TASKS_TOPIC) as log:
        check_ids_match_log_order(ids, log)


# -- counting from the fold checkpoint (a long tasks log) -----------------------------------


def long_queue_with_checkpoint(data: Path, tasks: int) -> None:
    """`tasks` tasks in one batch, and a checkpoint of the fold of them (as a worker saves
    it), then 3 tasks more after it."""
    from queue_worker.history.checkpoint import save_checkpoint
    from queue_worker.topics import ClaimsFollower, TaskIndex, open_topics

    with Queue(data, fsync="none") as queue:
        queue.enqueue_many([{"n": i} for i in range(tasks)])
    tasks_log, claims_log = open_topics(str(data))
    try:
        index, follower = TaskIndex(tasks_log.start), ClaimsFollower(claims_log.start)
        index.catch_up(tasks_log)
        save_checkpoint(data, index, tasks_log, follower, claims_log)
    finally:
        tasks_log.close()
        claims_log.close()
    with Queue(data, fsync="none") as queue:
        queue.enqueue_many([{"after": i} for i in range(3)])


def test_a_long_tasks_log_is_counted_from_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from queue_worker import producer

    data = tmp_path / "qw"
    long_queue_with_checkpoint(data, 200)
    monkeypatch.setattr(producer, "COUNT_FROM_START_BYTES", 1)  # (the log is short)
    with Queue(data, fsync="none") as queue:
        # where the checkpoint's index ended: only the 3 tasks after it are counted
        assert queue._counted == 200
        assert queue.enqueue({"new": 1}) == 203
    monkeypatch.setattr(producer, "COUNT_FROM_START_BYTES", 1 << 40)
    with Queue(data, fsync="none") as queue:
        assert queue._counted == 0  # a short log: counted from its start
        assert queue.enqueue({"new": 2}) == 204


def test_a_checkpoint_of_another_log_is_not_counted_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint of a queue whose tasks log was then replaced (fewer tasks, other
    bytes): its count would give wrong ids; it is refused and the log counted from its start."""
    from queue_worker import producer
    from queue_worker.history.checkpoint import CHECKPOINT_NAME

    long_queue_with_checkpoint(tmp_path / "a", 200)
    other = tmp_path / "b"
    with Queue(other, fsync="none") as queue:
        queue.enqueue_many([{"b": i} for i in range(50)])
    (other / CHECKPOINT_NAME).write_bytes((tmp_path / "a" / CHECKPOINT_NAME).read_bytes())
    monkeypatch.setattr(producer, "COUNT_FROM_START_BYTES", 1)
    with Queue(other, fsync="none") as queue:
        assert queue.enqueue({"new": 1}) == 50
